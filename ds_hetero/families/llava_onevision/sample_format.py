"""LLaVA-OneVision's sample format for the shapes-captioning data (toy/shapes.py): images rendered at its
pinpoint resolutions (a base tile plus the grid, unpadded features and newlines). `vocab` is the dataset's
word layout (toy/shapes.py Vocabulary: pad, bos, eos and the placeholder id)."""

from __future__ import annotations

import torch

from ...models.labels import text_labels


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

    def input_ids(self, vocab, caption_ids, hw: tuple[int, int] | None) -> torch.Tensor:
        return torch.tensor([vocab.bos_id, *[vocab.image_token_id] * self.image_tokens(hw), *caption_ids, vocab.eos_id])

    def sample(self, vocab, caption_ids, image):
        hw = None if image is None else tuple(image.shape[-2:])
        ids = self.input_ids(vocab, caption_ids, hw)
        if image is None:
            return {"input_ids": ids, "labels": text_labels(ids, 1)}
        c, t = image.shape[0], self.tile
        base = torch.nn.functional.interpolate(image[None], size=(t, t), mode="bilinear", align_corners=False)
        grid = image.reshape(c, hw[0] // t, t, hw[1] // t, t).permute(1, 3, 0, 2, 4).reshape(-1, c, t, t)
        return {"input_ids": ids, "labels": text_labels(ids, 1 + self.image_tokens(hw)),
                "pixel_values": torch.cat([base, grid]), "image_sizes": torch.tensor([list(hw)])}


def shapes_samples(model_config, **kwargs) -> dict:
    """The shapes dataset's arguments for this model: images at its pinpoint resolutions unless `image_sizes`."""
    fmt = LlavaOnevisionFormat(model_config)
    vocab = dict(vocab_size=model_config.text_config.vocab_size, image_token_id=model_config.image_token_id,
                 reserved_ids=(model_config.video_token_id,))
    sizes = kwargs.pop("image_sizes", tuple(fmt.pinpoints))
    return dict(image_sizes=sizes, vocab=vocab, sample_format=fmt, **kwargs)
