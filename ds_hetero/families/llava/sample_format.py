"""LLaVA's sample format for the shapes-captioning data (toy/shapes.py): [bos] + tokens_per_image x <image> +
caption + [eos], the image as `pixel_values` [1, 3, H, W]. `vocab` is the dataset's word layout
(toy/shapes.py Vocabulary: pad, bos, eos and the placeholder id)."""

from __future__ import annotations

import torch

from ...models.labels import text_labels


class LlavaFormat:
    """[bos] + tokens_per_image x <image> + caption + [eos]; `pixel_values` [1, 3, H, W]."""

    def __init__(self, tokens_per_image: int, image_size: int):
        self.tokens_per_image, self.image_size = tokens_per_image, image_size

    def check_size(self, hw: tuple[int, int]) -> None:
        if hw != (self.image_size, self.image_size):
            raise ValueError(f"LLaVA's tower takes {self.image_size}x{self.image_size} images, got {hw}")

    def image_tokens(self, hw: tuple[int, int] | None) -> int:
        return 0 if hw is None else self.tokens_per_image

    def input_ids(self, vocab, caption_ids: list[int], hw: tuple[int, int] | None) -> torch.Tensor:
        image = [vocab.image_token_id] * self.image_tokens(hw)
        return torch.tensor([vocab.bos_id, *image, *caption_ids, vocab.eos_id])

    def sample(self, vocab, caption_ids, image):
        hw = None if image is None else tuple(image.shape[-2:])
        ids = self.input_ids(vocab, caption_ids, hw)
        out = {"input_ids": ids, "labels": text_labels(ids, 1 + self.image_tokens(hw))}
        if image is not None:
            out["pixel_values"] = image.unsqueeze(0)
        return out


def shapes_samples(model_config, **kwargs) -> dict:
    """The shapes dataset's arguments for this model: the tower's image size, its token count (CLS kept only
    by "full"), the vocabulary's placeholder id."""
    v = model_config.vision_config
    keeps_cls = v.model_type.startswith("clip") and model_config.vision_feature_select_strategy == "full"
    tokens = (v.image_size // v.patch_size) ** 2 + int(keeps_cls)
    return dict(image_size=v.image_size, vocab=dict(vocab_size=model_config.text_config.vocab_size,
                                                    image_token_id=model_config.image_token_id),
                sample_format=LlavaFormat(tokens, v.image_size), **kwargs)
