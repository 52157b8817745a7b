"""Gemma 3's sample format for the shapes-captioning data (toy/shapes.py): each image as Gemma3Processor puts
it, <boi> + placeholders + <eoi>, with `pixel_values` [1, C, H, W] at the tower's image size. `vocab` is the
dataset's word layout (toy/shapes.py Vocabulary: pad, bos, eos and the placeholder id)."""

from __future__ import annotations

import torch

from ...models.labels import text_labels


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

    def input_ids(self, vocab, caption_ids, hw: tuple[int, int] | None) -> torch.Tensor:
        block = [] if hw is None else [self.boi_id, *[vocab.image_token_id] * self.tokens_per_image, self.eoi_id]
        return torch.tensor([vocab.bos_id, *block, *caption_ids, vocab.eos_id])

    def sample(self, vocab, caption_ids, image):
        hw = None if image is None else tuple(image.shape[-2:])
        ids = self.input_ids(vocab, caption_ids, hw)
        if image is None:
            return {"input_ids": ids, "labels": text_labels(ids, 1)}
        return {"input_ids": ids, "labels": text_labels(ids, 3 + self.tokens_per_image),
                "pixel_values": image.unsqueeze(0)}


def shapes_samples(model_config, **kwargs) -> dict:
    """The shapes dataset's arguments for this model: the tower's image size, <boi>/<eoi> reserved."""
    c, v = model_config, model_config.vision_config
    vocab = dict(vocab_size=c.text_config.vocab_size, image_token_id=c.image_token_id,
                 reserved_ids=(c.boi_token_index, c.eoi_token_index))
    fmt = Gemma3Format(c.mm_tokens_per_image, v.image_size, c.boi_token_index, c.eoi_token_index)
    return dict(image_size=v.image_size, vocab=vocab, sample_format=fmt, **kwargs)
