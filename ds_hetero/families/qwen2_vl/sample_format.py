"""Qwen2-VL's sample format for the shapes-captioning data (toy/shapes.py): [bos] + <vision_start> + (h*w /
merge^2) x <image> + <vision_end> + caption + [eos], the image as flattened patches [h*w, C*T*p*p] and
`image_grid_thw` [[1, h, w]] (h, w in patches). Qwen2.5-VL and Qwen3-VL patchify the same way. `vocab` is
the dataset's word layout (toy/shapes.py Vocabulary: pad, bos, eos and the placeholder id)."""

from __future__ import annotations

from typing import Sequence

import torch

from ...models.labels import text_labels


class Qwen2VLFormat:
    """[bos] + <vision_start> + (h*w / merge^2) x <image> + <vision_end> + caption + [eos]."""

    def __init__(
        self, patch_size: int, merge_size: int, temporal_patch_size: int, vision_start_id: int, vision_end_id: int
    ):
        self.patch, self.merge, self.temporal = patch_size, merge_size, temporal_patch_size
        self.start_id, self.end_id = vision_start_id, vision_end_id

    def check_size(self, hw: tuple[int, int]) -> None:
        side = self.patch * self.merge
        if hw[0] % side or hw[1] % side:
            raise ValueError(
                f"Qwen2-VL image size {hw} must be a multiple of patch_size * merge_size = {side} on both sides"
            )

    def image_tokens(self, hw: tuple[int, int] | None) -> int:
        return 0 if hw is None else (hw[0] // self.patch) * (hw[1] // self.patch) // self.merge**2

    def input_ids(self, vocab, caption_ids: list[int], hw: tuple[int, int] | None) -> torch.Tensor:
        image = [] if hw is None else [self.start_id, *[vocab.image_token_id] * self.image_tokens(hw), self.end_id]
        return torch.tensor([vocab.bos_id, *image, *caption_ids, vocab.eos_id])

    def patches(self, image: torch.Tensor) -> torch.Tensor:
        """[h*w, C*T*p*p] rows in the order of transformers' Qwen2VLImageProcessor.patchify.

        Rows go merge block by merge block (the vision tower merges m x m consecutive rows into one
        token); each row is (channel, time, py, px) with the still image repeated T times in time.
        """
        c, height, width = image.shape
        p, m, t = self.patch, self.merge, self.temporal
        gh, gw = height // p, width // p
        x = image.reshape(c, gh // m, m, p, gw // m, m, p).permute(1, 4, 2, 5, 0, 3, 6)  # (gh/m, gw/m, m, m, c, p, p)
        x = x.unsqueeze(5).expand(-1, -1, -1, -1, -1, t, -1, -1)
        return x.reshape(gh * gw, c * t * p * p)

    def sample(self, vocab, caption_ids, image):
        hw = None if image is None else tuple(image.shape[-2:])
        ids = self.input_ids(vocab, caption_ids, hw)
        if image is None:
            return {"input_ids": ids, "labels": text_labels(ids, 1)}
        out = {"input_ids": ids, "labels": text_labels(ids, 3 + self.image_tokens(hw))}
        out["pixel_values"] = self.patches(image)
        out["image_grid_thw"] = torch.tensor([[1, hw[0] // self.patch, hw[1] // self.patch]])
        return out


def shapes_samples(model_config, image_sizes: Sequence[tuple[int, int]] = ((16, 16), (32, 16), (16, 32), (32, 32)),
                   **kwargs) -> dict:
    """The shapes dataset's arguments for this model; each (height, width) a multiple of patch * merge pixels."""
    c, v = model_config, model_config.vision_config
    vocab = dict(vocab_size=c.text_config.vocab_size, image_token_id=c.image_token_id,
                 reserved_ids=(c.video_token_id, c.vision_start_token_id, c.vision_end_token_id))
    fmt = Qwen2VLFormat(v.patch_size, v.spatial_merge_size, v.temporal_patch_size,
                        c.vision_start_token_id, c.vision_end_token_id)
    return dict(image_sizes=image_sizes, vocab=vocab, sample_format=fmt, **kwargs)
