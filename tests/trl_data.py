"""A TRL user's inputs, built locally: a LLaVA processor (word-level tokenizer, chat template, CLIP image
processor) matching ds_hetero's tiny LLaVA, and a `datasets.Dataset` of `messages` + PIL `images`
(shapes captions, some rows text only)."""

from __future__ import annotations

import numpy as np

from ds_hetero.data.shapes import WORDS

TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }} : {% if m['content'] is string %}{{ m['content'] }} {% else %}"
    "{% for c in m['content'] %}{% if c['type'] == 'image' %}<image> {% else %}{{ c['text'] }} {% endif %}"
    "{% endfor %}{% endif %}</s> {% endfor %}"
)


def tiny_llava_processor(model):
    """LlavaProcessor for `ds_hetero.models.tiny.tiny_llava(...)` (32x32 images, patch 8, CLS dropped: 16 tokens)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import CLIPImageProcessorPil, LlavaProcessor, PreTrainedTokenizerFast

    words = ["<pad>", "<s>", "</s>", *WORDS, "user", "assistant", "what", "is", "here", "?", ":", "<unk>"]
    vocab = {w: i for i, w in enumerate(words)}
    vocab["<image>"] = model.config.image_token_id
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split("<image>", "isolated"),
                                                 pre_tokenizers.WhitespaceSplit()])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                        unk_token="<unk>", extra_special_tokens={"image_token": "<image>"})
    v = model.config.vision_config
    images = CLIPImageProcessorPil(size={"shortest_edge": v.image_size},
                                   crop_size={"height": v.image_size, "width": v.image_size})
    return LlavaProcessor(image_processor=images, tokenizer=tokenizer, patch_size=v.patch_size,
                          vision_feature_select_strategy=model.config.vision_feature_select_strategy,
                          num_additional_image_tokens=1, chat_template=TEMPLATE)


def messages_dataset(size: int, seed: int = 0, text_only_every: int = 4):
    """Rows {"messages": [user (image +) question, assistant caption], "images": [PIL] or []}."""
    import datasets
    from PIL import Image

    from ds_hetero.data import ShapesCaptionDataset

    raw = ShapesCaptionDataset(size, image_size=40, seed=seed)
    rows = {"messages": [], "images": []}
    for i in range(size):
        item = raw[i]
        words = [raw.vocab.words[t - raw.vocab.first_word_id] for t in item["input_ids"][1:-1].tolist()]
        text_only = text_only_every and i % text_only_every == text_only_every - 1
        pixels = (item["image"].clamp(0, 1).permute(1, 2, 0).numpy() * 255).astype(np.uint8)
        user = [{"type": "text", "text": "what is here ?"}]
        if not text_only:
            user = [{"type": "image"}, *user]
        rows["messages"].append([{"role": "user", "content": user},
                                 {"role": "assistant", "content": [{"type": "text", "text": " ".join(words)}]}])
        rows["images"].append([] if text_only else [Image.fromarray(pixels)])
    return datasets.Dataset.from_dict(rows)
