"""The families' own Hugging Face processors, built locally (no download) for the tiny models.

A word-level tokenizer over `w0 .. w295` plus each family's special tokens at the tiny models'
ids, wrapped in PreTrainedTokenizerFast with the attributes the processors read; the image
processors are transformers' own with the tiny towers' patch sizes. Their output, cut per
sample, is what a user hands ds_hetero.
"""

import numpy as np
import torch


def _tokenizer(specials: dict[str, int], extra: dict[str, str]):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(296)}
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
