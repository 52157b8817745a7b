"""InternVL's sample format for the shapes-captioning data (toy/shapes.py): each image cut into tiles (1, 2 or
4 by default), all in one <img> ... </img> run. `vocab` is the dataset's word layout (toy/shapes.py
Vocabulary: pad, bos, eos and the placeholder id)."""

from __future__ import annotations

import torch

from ...models.labels import text_labels

# <img> and </img> of the tiny InternVL (families/internvl/tiny.py); a real checkpoint's come from its tokenizer
INTERNVL_TILE_TOKENS = (297, 296)


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

    def input_ids(self, vocab, caption_ids, hw: tuple[int, int] | None) -> torch.Tensor:
        image = [] if hw is None else [self.start_id, *[vocab.image_token_id] * self.image_tokens(hw), self.end_id]
        return torch.tensor([vocab.bos_id, *image, *caption_ids, vocab.eos_id])

    def sample(self, vocab, caption_ids, image):
        hw = None if image is None else tuple(image.shape[-2:])
        ids = self.input_ids(vocab, caption_ids, hw)
        if image is None:
            return {"input_ids": ids, "labels": text_labels(ids, 1)}
        c, t = image.shape[0], self.tile
        tiles = image.reshape(c, hw[0] // t, t, hw[1] // t, t).permute(1, 3, 0, 2, 4).reshape(-1, c, t, t)
        return {"input_ids": ids, "labels": text_labels(ids, 3 + self.image_tokens(hw)), "pixel_values": tiles}


def shapes_samples(model_config, **kwargs) -> dict:
    """The shapes dataset's arguments for this model: images of 1, 2 and 4 tiles unless `image_sizes` is given."""
    c, v = model_config, model_config.vision_config
    tile = v.image_size if isinstance(v.image_size, int) else v.image_size[0]
    start, end = INTERNVL_TILE_TOKENS
    vocab = dict(vocab_size=c.text_config.vocab_size, image_token_id=c.image_token_id, reserved_ids=(start, end))
    sizes = kwargs.pop("image_sizes", ((tile, tile), (tile, 2 * tile), (2 * tile, 2 * tile)))
    return dict(image_sizes=sizes, vocab=vocab, sample_format=InternVLFormat(c.image_seq_length, tile, start, end),
                **kwargs)
