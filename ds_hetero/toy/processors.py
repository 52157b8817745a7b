"""Processors for the tiny models (families/<family>/tiny.py), built locally: a word-level tokenizer over the shapes
captions, a chat template and the family's image processor, so TRL-style scripts run with no download.

    processor = tiny_processor(model)      # LlavaProcessor, Qwen2VLProcessor, Qwen2_5_VLProcessor or Qwen3VLProcessor

The tokenizer maps the model's image placeholder (and Qwen2-VL's vision start / end) to the model's
ids; the processors expand one placeholder per image into the image's token count, as the real ones do.
The Qwen-VL ones read video clips too: their video processor is a FramesVideoProcessor (transformers' own
needs torchvision) at the tiny towers' patch sizes, with the images' small pixel bounds.
"""

from __future__ import annotations

from .shapes import WORDS

TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }} : {% if m['content'] is string %}{{ m['content'] }} {% else %}"
    "{% for c in m['content'] %}{% if c['type'] == 'image' %}IMAGE {% elif c['type'] == 'video' %}VIDEO "
    "{% else %}{{ c['text'] }} {% endif %}"
    "{% endfor %}{% endif %}</s> {% endfor %}{% if add_generation_prompt %}assistant : {% endif %}"
)
PROMPT_WORDS = ("user", "assistant", "what", "is", "here", "?", ":")


def _tokenizer(specials: dict[str, int], pad: str, eos: str, extra: dict[str, str]):
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = [pad, "<s>", eos, *WORDS, *PROMPT_WORDS, "<unk>"]
    vocab = {w: i for i, w in enumerate(words)}
    vocab.update(specials)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens([AddedToken(t, special=True) for t in specials])
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=pad, eos_token=eos, unk_token="<unk>",
                                   extra_special_tokens=extra)


def tiny_llava_processor(model):
    """LlavaProcessor for tiny_llava (CLIP tower: the CLS token dropped by the "default" strategy)."""
    from transformers import CLIPImageProcessorPil, LlavaProcessor

    tokenizer = _tokenizer({"<image>": model.config.image_token_id}, "<pad>", "</s>", {"image_token": "<image>"})
    v = model.config.vision_config
    images = CLIPImageProcessorPil(size={"shortest_edge": v.image_size},
                                   crop_size={"height": v.image_size, "width": v.image_size})
    strategy = model.config.vision_feature_select_strategy
    return LlavaProcessor(image_processor=images, tokenizer=tokenizer, patch_size=v.patch_size,
                          vision_feature_select_strategy=strategy,
                          num_additional_image_tokens=1 if v.model_type.startswith("clip") else 0,
                          chat_template=TEMPLATE.replace("IMAGE", "<image>").replace("VIDEO", "<video>"))


def _with_clips(processor, min_pixels: int, max_pixels: int):
    """The processor with a FramesVideoProcessor at its image processor's patch sizes and these pixel bounds."""
    from dataclasses import replace

    from ..families import video_settings_of
    from ..families.qwen2_vl.video_frames import FramesVideoProcessor

    settings = replace(video_settings_of(processor), min_pixels=min_pixels, max_pixels=max_pixels)
    processor.video_processor = FramesVideoProcessor(settings)
    return processor


def tiny_qwen2_vl_processor(model, min_pixels: int = 64, max_pixels: int = 64 * 64):
    """Qwen2VLProcessor for tiny_qwen2_vl (dynamic resolution: an image's token count follows its size);
    Qwen2_5_VLProcessor for tiny_qwen2_5_vl (it adds a clip's `second_per_grid_ts`)."""
    from transformers import ProcessorMixin, Qwen2_5_VLProcessor, Qwen2VLImageProcessorPil, Qwen2VLProcessor

    base = Qwen2_5_VLProcessor if model.config.model_type == "qwen2_5_vl" else Qwen2VLProcessor

    class ImageOnlyQwen2VLProcessor(base):
        """The processor without transformers' video processor (which needs torchvision): the attributes are
        read from this __init__'s signature, so saving and loading see images and tokenizer only."""

        def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
            self.image_token, self.video_token = tokenizer.image_token, tokenizer.video_token
            self.image_token_id = tokenizer.convert_tokens_to_ids(self.image_token)
            self.video_token_id = tokenizer.convert_tokens_to_ids(self.video_token)
            self.video_processor = None
            ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template)

    c = model.config
    specials = {"<|image_pad|>": c.image_token_id, "<|video_pad|>": c.video_token_id,
                "<|vision_start|>": c.vision_start_token_id, "<|vision_end|>": c.vision_end_token_id}
    # the tiny model's text config has pad 0 and eos 1
    tokenizer = _tokenizer(specials, "<pad>", "</s>", {
        "image_token": "<|image_pad|>", "video_token": "<|video_pad|>", "vision_start_token": "<|vision_start|>",
        "vision_end_token": "<|vision_end|>"})
    v = c.vision_config
    images = Qwen2VLImageProcessorPil(patch_size=v.patch_size, merge_size=v.spatial_merge_size,
                                      temporal_patch_size=v.temporal_patch_size, min_pixels=min_pixels,
                                      max_pixels=max_pixels)
    template = TEMPLATE.replace("IMAGE", "<|vision_start|><|image_pad|><|vision_end|>").replace(
        "VIDEO", "<|vision_start|><|video_pad|><|vision_end|>")
    processor = ImageOnlyQwen2VLProcessor(image_processor=images, tokenizer=tokenizer, chat_template=template)
    return _with_clips(processor, min_pixels, max_pixels)


def tiny_qwen3_vl_processor(model, min_pixels: int = 64, max_pixels: int = 64 * 64):
    """Qwen3VLProcessor for tiny_qwen3_vl / tiny_qwen3_vl_moe: Qwen2-VL's patchifying image processor
    (Qwen3-VL's own, with the tiny towers' patch size) and the same tokenizer as tiny_qwen2_vl's;
    it returns `mm_token_type_ids`, which Qwen3-VL's rope index reads."""
    from transformers import ProcessorMixin, Qwen3VLProcessor

    class ImageOnlyQwen3VLProcessor(Qwen3VLProcessor):
        """Without its video processor (which needs torchvision), as ImageOnlyQwen2VLProcessor."""

        def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
            for kind in ("image", "video", "vision_start", "vision_end"):
                token = getattr(tokenizer, f"{kind}_token")
                setattr(self, f"{kind}_token", token)
                setattr(self, f"{kind}_token_id", tokenizer.convert_tokens_to_ids(token))
            self.video_processor = None
            ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template)

    qwen2 = tiny_qwen2_vl_processor(model, min_pixels=min_pixels, max_pixels=max_pixels)
    processor = ImageOnlyQwen3VLProcessor(image_processor=qwen2.image_processor, tokenizer=qwen2.tokenizer,
                                          chat_template=qwen2.chat_template)
    return _with_clips(processor, min_pixels, max_pixels)


def tiny_processor(model):
    kind = model.config.model_type
    if kind.startswith(("qwen3_vl", "qwen3_5")):  # Qwen3.5 checkpoints use Qwen3-VL's processor
        return tiny_qwen3_vl_processor(model)
    return tiny_qwen2_vl_processor(model) if "qwen2" in kind else tiny_llava_processor(model)


def processor_for(checkpoint: str | None, model):
    """The processor a recipe's --data is encoded with: the checkpoint's own (its tokenizer, chat template and
    image processor), else the built-in tiny model's, built here."""
    if checkpoint:
        from transformers import AutoProcessor

        return AutoProcessor.from_pretrained(checkpoint)
    return tiny_processor(model)
