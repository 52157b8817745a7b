"""Gemma 4's sample format for the shapes-captioning data (toy/shapes.py), constructed from the config as
Gemma4Processor lays it out: each image as <boi> + soft-token placeholders + <eoi>, its `pixel_values`
patchified [1, P, p * p * 3] with `image_position_ids` [1, P, 2] (media.py `patchify`); an H x W image
gives (H / p) (W / p) / k^2 soft tokens (k the pooling kernel). The shapes data has no audio. `vocab` is the
dataset's word layout (toy/shapes.py Vocabulary: pad, bos, eos and the placeholder id)."""

from __future__ import annotations

import torch

from ...models.labels import text_labels
from .media import patchify


class Gemma4Format:
    """[bos] + <boi> + soft tokens x <image> + <eoi> + caption + [eos]; patches padded to `max_patches`."""

    def __init__(self, patch: int, kernel: int, boi_id: int, eoi_id: int, max_patches: int | None = None):
        self.patch, self.kernel, self.boi_id, self.eoi_id, self.max_patches = patch, kernel, boi_id, eoi_id, max_patches

    def check_size(self, hw: tuple[int, int]) -> None:
        side = self.patch * self.kernel
        if hw[0] % side or hw[1] % side:
            raise ValueError(f"Gemma 4's tower pools {self.kernel}x{self.kernel} patches of {self.patch} px: image "
                             f"sides must be multiples of {side}, got {hw}")

    def image_tokens(self, hw: tuple[int, int] | None) -> int:
        return 0 if hw is None else (hw[0] // self.patch) * (hw[1] // self.patch) // self.kernel**2

    def input_ids(self, vocab, caption_ids, hw: tuple[int, int] | None) -> torch.Tensor:
        n = self.image_tokens(hw)
        block = [] if hw is None else [self.boi_id, *[vocab.image_token_id] * n, self.eoi_id]
        return torch.tensor([vocab.bos_id, *block, *caption_ids, vocab.eos_id])

    def sample(self, vocab, caption_ids, image):
        hw = None if image is None else tuple(image.shape[-2:])
        ids = self.input_ids(vocab, caption_ids, hw)
        if image is None:
            return {"input_ids": ids, "labels": text_labels(ids, 1)}
        pixels, positions = patchify(image, self.patch, self.max_patches)
        return {"input_ids": ids, "labels": text_labels(ids, 3 + self.image_tokens(hw)),
                "pixel_values": pixels, "image_position_ids": positions}


def shapes_samples(model_config, **kwargs) -> dict:
    """The shapes dataset's arguments for this model: square images of 2 x 2 pooling kernels (4 soft
    tokens; the tiny model's 4 px patches pooled 2 x 2: 16 px), the other special ids reserved."""
    c, v = model_config, model_config.vision_config
    side = 2 * v.patch_size * v.pooling_kernel_size
    vocab = dict(vocab_size=c.text_config.vocab_size, image_token_id=c.image_token_id,
                 reserved_ids=tuple(i for i in (c.boi_token_id, c.eoi_token_id, c.audio_token_id, c.video_token_id,
                                                c.boa_token_id, c.eoa_token_index) if i is not None))
    fmt = Gemma4Format(v.patch_size, v.pooling_kernel_size, c.boi_token_id, c.eoi_token_id)
    return dict(image_size=kwargs.pop("image_size", side), vocab=vocab, sample_format=fmt, **kwargs)
