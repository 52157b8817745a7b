"""The shapes-captioning dataset in the sample format of each supported model family.

`shapes_dataset_for(model_config, size, seed)` picks the format by the config's `model_type`:
LLaVA and Qwen2-VL / Qwen2.5-VL / Qwen3-VL use shapes.py's formats (the newer Qwen processors
patchify as Qwen2-VL's does); Gemma 3 puts each image as Gemma3Processor does, <boi> + placeholders +
<eoi>, with `pixel_values` [1, C, H, W] at the tower's image size; InternVL cuts each image into
tiles (1, 2 or 4 by default), all in one <img> ... </img> run; LLaVA-OneVision renders at its
pinpoint resolutions (a base tile plus the grid, unpadded features and newlines).
"""

from __future__ import annotations

import torch

from .shapes import ShapesCaptionDataset, Vocabulary, text_labels


# <img> and </img> of the tiny InternVL (models/tiny_families.py); a real checkpoint's come from its tokenizer
INTERNVL_TILE_TOKENS = (297, 296)


class Gemma3Format:
    """[bos] + <boi> + mm_tokens_per_image x <image> + <eoi> + caption + [eos]; `pixel_values` [1, 3, H, W]."""

    def __init__(self, tokens_per_image: int, image_size: int, boi_id: int, eoi_id: int):
        self.tokens_per_image, self.image_size = tokens_per_image, image_size
        self.boi_id, self.eoi_id = boi_id, eoi_id

    def check_size(self, hw: tuple[int, int]) -> None:
        if hw != (self.image_size, self.image_size):
            raise ValueError(f"Gemma 3's tower takes {self.image_size}x{self.image_size} images, got {hw}")

    def image_tokens(self, hw: tuple[int, int] | None) -> int:
        return 0 if hw is None else self.tokens_per_image

    def input_ids(self, vocab: Vocabulary, caption_ids, hw: tuple[int, int] | None) -> torch.Tensor:
        block = [] if hw is None else [self.boi_id, *[vocab.image_token_id] * self.tokens_per_image, self.eoi_id]
        return torch.tensor([vocab.bos_id, *block, *caption_ids, vocab.eos_id])

    def sample(self, vocab: Vocabulary, caption_ids, image):
        hw = None if image is None else tuple(image.shape[-2:])
        ids = self.input_ids(vocab, caption_ids, hw)
        if image is None:
            return {"input_ids": ids, "labels": text_labels(ids, 1)}
        return {"input_ids": ids, "labels": text_labels(ids, 3 + self.tokens_per_image),
                "pixel_values": image.unsqueeze(0)}


class InternVLFormat:
    """[bos] + <img> + tiles x image_seq_length x <IMG_CONTEXT> + </img> + caption + [eos].

    An image of (h, w), both multiples of the tile size, is cut into (h / tile) x (w / tile) tiles
    row by row (the processor's dynamic tiling without its thumbnail): `pixel_values` [tiles, 3, tile, tile].
    """

    def __init__(self, tokens_per_tile: int, tile: int, start_id: int, end_id: int):
        self.tokens_per_tile, self.tile, self.start_id, self.end_id = tokens_per_tile, tile, start_id, end_id

    def check_size(self, hw: tuple[int, int]) -> None:
        if hw[0] % self.tile or hw[1] % self.tile:
            raise ValueError(f"InternVL image size {hw} must be a multiple of the tile size {self.tile} on both sides")

    def image_tokens(self, hw: tuple[int, int] | None) -> int:
        return 0 if hw is None else (hw[0] // self.tile) * (hw[1] // self.tile) * self.tokens_per_tile

    def input_ids(self, vocab: Vocabulary, caption_ids, hw: tuple[int, int] | None) -> torch.Tensor:
        image = [] if hw is None else [self.start_id, *[vocab.image_token_id] * self.image_tokens(hw), self.end_id]
        return torch.tensor([vocab.bos_id, *image, *caption_ids, vocab.eos_id])

    def sample(self, vocab: Vocabulary, caption_ids, image):
        hw = None if image is None else tuple(image.shape[-2:])
        ids = self.input_ids(vocab, caption_ids, hw)
        if image is None:
            return {"input_ids": ids, "labels": text_labels(ids, 1)}
        c, t = image.shape[0], self.tile
        tiles = image.reshape(c, hw[0] // t, t, hw[1] // t, t).permute(1, 3, 0, 2, 4).reshape(-1, c, t, t)
        return {"input_ids": ids, "labels": text_labels(ids, 3 + self.image_tokens(hw)), "pixel_values": tiles}


class LlavaOnevisionFormat:
    """[bos] + the image's placeholders + caption + [eos]; `pixel_values` [1 + tiles, 3, t, t], `image_sizes`.

    Images are rendered at one of the model's `image_grid_pinpoints` resolutions, so the
    processor's any-resolution step keeps them as they are: a base tile (the image resized to
    one tile) then the grid's tiles row by row. The placeholder count is the processor's own
    (`LlavaOnevisionProcessor._get_number_of_features`: base tokens, unpadded grid, newlines).
    """

    def __init__(self, model_config):
        from transformers import LlavaOnevisionProcessor

        v = model_config.vision_config
        self.tile, self.pinpoints = v.image_size, [tuple(p) for p in model_config.image_grid_pinpoints]
        shim = type("Shim", (), {})()  # the processor's arithmetic without its tokenizer and image processor
        shim.image_processor = type("P", (), {"image_grid_pinpoints": model_config.image_grid_pinpoints})()
        shim.num_image_tokens = (v.image_size // v.patch_size) ** 2
        shim.vision_aspect_ratio = model_config.vision_aspect_ratio
        shim._get_unpadded_features = LlavaOnevisionProcessor._get_unpadded_features.__get__(shim)
        self._features = LlavaOnevisionProcessor._get_number_of_features.__get__(shim)
        self._drop_cls = model_config.vision_feature_select_strategy == "default"

    def check_size(self, hw: tuple[int, int]) -> None:
        if tuple(hw) not in self.pinpoints:
            raise ValueError(f"LLaVA-OneVision shapes images must have a pinpoint resolution {self.pinpoints}, got {hw}")

    def image_tokens(self, hw: tuple[int, int] | None) -> int:
        if hw is None:
            return 0
        return self._features(hw[0], hw[1], self.tile, self.tile) - int(self._drop_cls)

    def input_ids(self, vocab: Vocabulary, caption_ids, hw: tuple[int, int] | None) -> torch.Tensor:
        return torch.tensor([vocab.bos_id, *[vocab.image_token_id] * self.image_tokens(hw), *caption_ids, vocab.eos_id])

    def sample(self, vocab: Vocabulary, caption_ids, image):
        hw = None if image is None else tuple(image.shape[-2:])
        ids = self.input_ids(vocab, caption_ids, hw)
        if image is None:
            return {"input_ids": ids, "labels": text_labels(ids, 1)}
        c, t = image.shape[0], self.tile
        base = torch.nn.functional.interpolate(image[None], size=(t, t), mode="bilinear", align_corners=False)
        grid = image.reshape(c, hw[0] // t, t, hw[1] // t, t).permute(1, 3, 0, 2, 4).reshape(-1, c, t, t)
        return {"input_ids": ids, "labels": text_labels(ids, 1 + self.image_tokens(hw)),
                "pixel_values": torch.cat([base, grid]), "image_sizes": torch.tensor([list(hw)])}


def shapes_dataset_for(model_config, size: int, seed: int = 0, **kwargs) -> ShapesCaptionDataset:
    """The shapes dataset in the sample format of the model family of `model_config`."""
    kind = model_config.model_type
    if kind == "llava":
        return ShapesCaptionDataset.for_llava(model_config, size, seed=seed, **kwargs)
    if kind in ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe"):
        return ShapesCaptionDataset.for_qwen2_vl(model_config, size, seed=seed, **kwargs)
    if kind == "gemma3":
        c, v = model_config, model_config.vision_config
        vocab = Vocabulary(c.text_config.vocab_size, c.image_token_id, reserved_ids=(c.boi_token_index,
                                                                                     c.eoi_token_index))
        fmt = Gemma3Format(c.mm_tokens_per_image, v.image_size, c.boi_token_index, c.eoi_token_index)
        return ShapesCaptionDataset(size, image_size=v.image_size, seed=seed, vocab=vocab, sample_format=fmt, **kwargs)
    if kind == "internvl":
        c, v = model_config, model_config.vision_config
        tile = v.image_size if isinstance(v.image_size, int) else v.image_size[0]
        start, end = INTERNVL_TILE_TOKENS
        vocab = Vocabulary(c.text_config.vocab_size, c.image_token_id, reserved_ids=(start, end))
        fmt = InternVLFormat(c.image_seq_length, tile, start, end)
        sizes = kwargs.pop("image_sizes", ((tile, tile), (tile, 2 * tile), (2 * tile, 2 * tile)))
        return ShapesCaptionDataset(size, seed=seed, image_sizes=sizes, vocab=vocab, sample_format=fmt, **kwargs)
    if kind == "llava_onevision":
        fmt = LlavaOnevisionFormat(model_config)
        vocab = Vocabulary(model_config.text_config.vocab_size, model_config.image_token_id,
                           reserved_ids=(model_config.video_token_id,))
        sizes = kwargs.pop("image_sizes", tuple(fmt.pinpoints))
        return ShapesCaptionDataset(size, seed=seed, image_sizes=sizes, vocab=vocab, sample_format=fmt, **kwargs)
    raise ValueError(f"no shapes-dataset format for model_type {kind!r} (llava, qwen2_vl, qwen2_5_vl, qwen3_vl, qwen3_vl_moe, internvl, llava_onevision, gemma3)")
