"""The families' own Hugging Face processors, built locally (no download) for the tiny models.

A word-level tokenizer over `w0 .. w295` plus each family's special tokens at the tiny models'
ids, wrapped in PreTrainedTokenizerFast with the attributes the processors read; the image
processors are transformers' own with the tiny towers' patch sizes. Their output, cut per
sample, is what a user hands ds_hetero.
"""

import numpy as np
import torch


def _tokenizer(specials: dict[str, int], extra: dict[str, str], words: int = 296):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(words)}
    vocab.update(specials)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="w3"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="w3", pad_token="w0",
                                   extra_special_tokens=extra)
    fast.add_special_tokens({"additional_special_tokens": [t for t in specials if t.startswith("<")]})
    return fast


def qwen2_5_vl_processor(model):
    from transformers import Qwen2_5_VLProcessor, Qwen2VLImageProcessorPil

    cfg, v = model.config, model.config.vision_config
    tokenizer = _tokenizer({"<|image_pad|>": cfg.image_token_id, "<|video_pad|>": cfg.video_token_id,
                            "<|vision_start|>": cfg.vision_start_token_id,
                            "<|vision_end|>": cfg.vision_end_token_id}, {})
    size = dict(shortest_edge=4 * (v.patch_size * v.spatial_merge_size) ** 2, longest_edge=4096)
    kw = dict(patch_size=v.patch_size, merge_size=v.spatial_merge_size, temporal_patch_size=v.temporal_patch_size)
    class ImagesOnly(Qwen2_5_VLProcessor):
        """Without torchvision transformers cannot even type-check an absent video processor
        (its lazy video mapping fails); images need none, so the processor is built without it."""

        @classmethod
        def get_attributes(cls):
            return ["image_processor", "tokenizer"]

    # the PIL image processor: the default one needs torchvision
    return ImagesOnly(image_processor=Qwen2VLImageProcessorPil(size=size, **kw), tokenizer=tokenizer)


def gemma3_processor(model):
    from transformers import Gemma3ImageProcessorPil, Gemma3Processor

    cfg, v = model.config, model.config.vision_config
    tokenizer = _tokenizer({"<image_soft_token>": cfg.image_token_id, "<start_of_image>": cfg.boi_token_index,
                            "<end_of_image>": cfg.eoi_token_index},
                           {"image_token": "<image_soft_token>", "boi_token": "<start_of_image>",
                            "eoi_token": "<end_of_image>"})
    images = Gemma3ImageProcessorPil(size={"height": v.image_size, "width": v.image_size})
    return Gemma3Processor(image_processor=images, tokenizer=tokenizer, image_seq_length=cfg.mm_tokens_per_image)


def processor_samples(processor, texts_and_images, image_token_id, seed=0):
    """One sample per (text, number of images): the processor's output for it, labels = the ids
    outside image placeholders. Images are random RGB arrays of varied sizes."""
    rng = np.random.default_rng(seed)
    samples = []
    for text, n in texts_and_images:
        images = [rng.integers(0, 256, (int(rng.choice([20, 32, 48])), int(rng.choice([16, 32, 40])), 3),
                               dtype=np.uint8) for _ in range(n)]
        out = processor(text=[text], images=[images] if images else None, return_tensors="pt")
        ids = out["input_ids"][0]
        sample = {"input_ids": ids, "labels": ids.masked_fill(ids == image_token_id, -100)}
        for key in ("pixel_values", "image_grid_thw", "image_sizes"):
            if images and key in out:
                sample[key] = out[key]
        samples.append(sample)
    return samples


def llava_onevision_processor(model):
    from transformers import LlavaOnevisionImageProcessorPil, LlavaOnevisionProcessor

    cfg, v = model.config, model.config.vision_config

    class ImagesOnly(LlavaOnevisionProcessor):
        """No video processor: transformers cannot type-check an absent one without torchvision."""

        @classmethod
        def get_attributes(cls):
            return ["image_processor", "tokenizer"]

    tokenizer = _tokenizer({"<image>": cfg.image_token_id, "<video>": cfg.video_token_id}, {})
    images = LlavaOnevisionImageProcessorPil(size={"height": v.image_size, "width": v.image_size},
                                             image_grid_pinpoints=cfg.image_grid_pinpoints)
    return ImagesOnly(image_processor=images, tokenizer=tokenizer, num_image_tokens=(v.image_size // v.patch_size) ** 2,
                      vision_feature_select_strategy=cfg.vision_feature_select_strategy,
                      vision_aspect_ratio=cfg.vision_aspect_ratio)


def qwen2_5_omni_processor(model):
    """Qwen2_5OmniProcessor for the tiny thinker: Whisper features at its mel bins, Qwen2-VL patches,
    the thinker's special tokens (without the video processor, which needs torchvision)."""
    from transformers import ProcessorMixin, Qwen2_5OmniProcessor, Qwen2VLImageProcessorPil, WhisperFeatureExtractor

    c, v = model.config, model.config.vision_config
    names = {"<|IMAGE|>": c.image_token_id, "<|VIDEO|>": c.video_token_id, "<|AUDIO|>": c.audio_token_id,
             "<|vision_bos|>": c.vision_start_token_id, "<|vision_eos|>": c.vision_end_token_id,
             "<|audio_bos|>": c.audio_start_token_id, "<|audio_eos|>": c.audio_end_token_id}
    extra = {"image_token": "<|IMAGE|>", "video_token": "<|VIDEO|>", "audio_token": "<|AUDIO|>",
             "vision_bos_token": "<|vision_bos|>", "vision_eos_token": "<|vision_eos|>",
             "audio_bos_token": "<|audio_bos|>", "audio_eos_token": "<|audio_eos|>"}
    tokenizer = _tokenizer(names, extra, words=min(names.values()))  # the specials sit at the top ids

    class NoVideo(Qwen2_5OmniProcessor):
        @classmethod
        def get_attributes(cls):
            return ["image_processor", "feature_extractor", "tokenizer"]

        def __init__(self, image_processor=None, feature_extractor=None, tokenizer=None, chat_template=None):
            self.video_processor = None
            ProcessorMixin.__init__(self, image_processor, feature_extractor, tokenizer, chat_template=chat_template)
            for a in ("image_token", "audio_token", "video_token", "image_token_id", "audio_token_id",
                      "video_token_id", "vision_bos_token", "vision_eos_token", "audio_bos_token", "audio_eos_token"):
                setattr(self, a, getattr(tokenizer, a))

    size = dict(shortest_edge=4 * (v.patch_size * v.spatial_merge_size) ** 2, longest_edge=4096)
    images = Qwen2VLImageProcessorPil(size=size, patch_size=v.patch_size, merge_size=v.spatial_merge_size,
                                      temporal_patch_size=v.temporal_patch_size)
    audio = WhisperFeatureExtractor(feature_size=c.audio_config.num_mel_bins, sampling_rate=16000)
    return NoVideo(image_processor=images, feature_extractor=audio, tokenizer=tokenizer)


AUDIO_RUN, IMAGE_RUN = "<|audio_bos|><|AUDIO|><|audio_eos|>", "<|vision_bos|><|IMAGE|><|vision_eos|>"


def _omni_inputs(rng, items):
    """(text, audios, images) of one sample: random words around each item's placeholder run."""
    words = [f"w{int(w)}" for w in rng.integers(5, 250, 3)]
    text, audios, images = [words[0]], [], []
    for kind, what in items:
        if kind == "audio":
            audios.append((0.3 * rng.standard_normal(int(16000 * what))).astype(np.float32))
        else:
            images.append(rng.integers(0, 256, (*what, 3), dtype=np.uint8))
        text += [AUDIO_RUN if kind == "audio" else IMAGE_RUN, f"w{int(rng.integers(5, 250))}"]
    return " ".join(text + words[1:]), audios, images


def _omni_labels(model, ids):
    c = model.config
    specials = [c.image_token_id, c.audio_token_id, c.vision_start_token_id, c.vision_end_token_id,
                c.audio_start_token_id, c.audio_end_token_id]
    return ids.masked_fill(torch.isin(ids, torch.tensor(specials)), -100)


def omni_processor_samples(processor, model, items_per_sample, seed=0):
    """One sample per list of items ("audio", seconds) / ("image", (h, w)): the processor's whole output
    for it (input_ids [1, S], attention_mask, pixel_values, image_grid_thw, input_features [clips, mel,
    3000] padded, feature_attention_mask), labels = the ids outside placeholders and their delimiters."""
    rng = np.random.default_rng(seed)
    samples = []
    for items in items_per_sample:
        text, audios, images = _omni_inputs(rng, items)
        sample = dict(processor(text=[text], images=images or None, audio=audios or None, return_tensors="pt"))
        sample["labels"] = _omni_labels(model, sample["input_ids"])
        samples.append(sample)
    return samples


def omni_processor_batch(processor, model, items_per_sample, seed=0):
    """The same samples (same seed) as one processor call on the whole batch: its collated output
    (left-padded input_ids, every clip's features and mask rows, every image's patches), with labels."""
    rng = np.random.default_rng(seed)
    texts, audios, images = zip(*[_omni_inputs(rng, items) for items in items_per_sample])
    audios, images = [a for per in audios for a in per], [i for per in images for i in per]
    out = dict(processor(text=list(texts), images=images or None, audio=audios or None, padding=True,
                         return_tensors="pt"))
    out["labels"] = _omni_labels(model, out["input_ids"]).masked_fill(out["attention_mask"] == 0, -100)
    return out


def qwen3_vl_processor(model):
    """Qwen3VLProcessor for the tiny Qwen3-VL (Qwen2-VL patches at its patch size), images only."""
    from transformers import ProcessorMixin, Qwen2VLImageProcessorPil, Qwen3VLProcessor

    cfg, v = model.config, model.config.vision_config
    names = {"<|image_pad|>": cfg.image_token_id, "<|video_pad|>": cfg.video_token_id,
             "<|vision_start|>": cfg.vision_start_token_id, "<|vision_end|>": cfg.vision_end_token_id}
    tokenizer = _tokenizer(names, {}, words=min(names.values()))

    class ImagesOnly(Qwen3VLProcessor):
        @classmethod
        def get_attributes(cls):
            return ["image_processor", "tokenizer"]

        def __init__(self, image_processor=None, tokenizer=None, chat_template=None):
            self.video_processor = None
            ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template)
            for name, token in names.items():  # the attributes Qwen3VLProcessor.__init__ would set
                attr = {"<|image_pad|>": "image_token", "<|video_pad|>": "video_token",
                        "<|vision_start|>": "vision_start_token", "<|vision_end|>": "vision_end_token"}[name]
                setattr(self, attr, name)
                setattr(self, attr + "_id", token)

    size = dict(shortest_edge=4 * (v.patch_size * v.spatial_merge_size) ** 2, longest_edge=4096)
    images = Qwen2VLImageProcessorPil(size=size, patch_size=v.patch_size, merge_size=v.spatial_merge_size,
                                      temporal_patch_size=v.temporal_patch_size)
    return ImagesOnly(image_processor=images, tokenizer=tokenizer)


def internvl_processor(model, start_id=297, end_id=296, video_id=298):
    """InternVLProcessor for the tiny InternVL: GotOcr2 tiling (up to 4 tiles + a thumbnail), images only."""
    import re

    from transformers import GotOcr2ImageProcessorPil, InternVLProcessor, ProcessorMixin

    cfg, v = model.config, model.config.vision_config
    names = {"<IMG_CONTEXT>": cfg.image_token_id, "<video>": video_id, "<img>": start_id, "</img>": end_id}
    extra = {"context_image_token": "<IMG_CONTEXT>", "video_token": "<video>", "start_image_token": "<img>",
             "end_image_token": "</img>"}
    tokenizer = _tokenizer(names, extra, words=min(names.values()))

    class ImagesOnly(InternVLProcessor):
        @classmethod
        def get_attributes(cls):
            return ["image_processor", "tokenizer"]

        def __init__(self, image_processor=None, tokenizer=None, image_seq_length=256, chat_template=None):
            self.video_processor = None
            ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template)
            self.image_seq_length = image_seq_length  # what InternVLProcessor.__init__ sets
            self.start_image_token, self.end_image_token = "<img>", "</img>"
            self.start_image_token_id, self.end_image_token_id = start_id, end_id
            self.image_token, self.video_token, self.image_token_id = "<IMG_CONTEXT>", "<video>", cfg.image_token_id
            self.multimodal_pattern = re.compile(r"(?P<image><IMG_CONTEXT>)|(?P<video><video>)")

    tile = v.image_size[0] if isinstance(v.image_size, (list, tuple)) else v.image_size
    images = GotOcr2ImageProcessorPil(size={"height": tile, "width": tile}, crop_to_patches=True, min_patches=1,
                                      max_patches=4)
    return ImagesOnly(image_processor=images, tokenizer=tokenizer, image_seq_length=cfg.image_seq_length)
