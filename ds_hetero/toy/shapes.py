"""Synthetic "coloured shapes" captioning data that a tiny VLM learns in minutes on a CPU.

An image shows one or a few filled shapes (square, circle, triangle, cross) in one of six colours,
each in a cell of a 2x2 or 3x3 grid, on a dark noisy background. Its caption says what is where:

    "a red circle at the top left and a blue square at the bottom right"

Everything is a pure function of (seed, index): every item draws from its own `torch.Generator`,
so any rank, worker or process rebuilds the same sample without shared state, and the scene (hence
the caption and the image-token count) can be drawn without rendering the image (`input_ids(i)`).

Sample formats live in each model family's home (ds_hetero/families/<family>/sample_format.py): LLaVA
puts `tokens_per_image` placeholders and the image as
`pixel_values` [1, 3, H, W]; Qwen2-VL puts <vision_start> placeholders <vision_end>, the image as
flattened patches [h*w, C*T*p*p] and `image_grid_thw` [[1, h, w]] (h, w in patches).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch.utils.data import Dataset

from ..models.labels import text_labels


# RGB in [0, 1]; far apart in RGB so a colour is recoverable from a cell's mean.
COLOURS = {
    "red": (0.95, 0.10, 0.10),
    "green": (0.10, 0.85, 0.10),
    "blue": (0.15, 0.30, 1.00),
    "yellow": (0.95, 0.90, 0.10),
    "cyan": (0.10, 0.85, 0.90),
    "magenta": (0.90, 0.15, 0.90),
}
SHAPES = ("square", "circle", "triangle", "cross")
ROWS = {2: ("top", "bottom"), 3: ("top", "middle", "bottom")}
COLS = {2: ("left", "right"), 3: ("left", "center", "right")}
WORDS = ("a", "at", "the", "and", *COLOURS, *SHAPES, "top", "middle", "bottom", "left", "center", "right")

# Per-channel pixel mean/std of the rendered [0, 1] images, measured once over 4096 32x32 images
# (1 and 2 shapes, 2x2 and 3x3 grids); they are mostly dark background. Normalising by them makes
# the model input roughly mean 0 / std 1, as a real image processor's normalisation would.
PIXEL_MEAN = (0.102, 0.102, 0.101)
PIXEL_STD = (0.178, 0.168, 0.175)


class Vocabulary:
    """Word-level ids laid out inside a model's vocabulary.

    0 pad, 1 bos, 2 eos, then the caption words from 3. The model's image placeholder id (the last
    id of its vocabulary) and any other reserved ids (Qwen2-VL's vision start/end) must lie above
    the words, so a caption id can never be mistaken for a placeholder.
    """

    pad_id, bos_id, eos_id = 0, 1, 2
    first_word_id = 3

    def __init__(
        self, vocab_size: int | None = None, image_token_id: int | None = None, reserved_ids: Sequence[int] = ()
    ):
        self.words = WORDS
        words_end = self.first_word_id + len(self.words)
        self.vocab_size = words_end + 1 if vocab_size is None else int(vocab_size)
        self.image_token_id = self.vocab_size - 1 if image_token_id is None else int(image_token_id)
        self.reserved_ids = tuple(int(r) for r in reserved_ids)
        lowest = min((self.image_token_id, *self.reserved_ids))
        if words_end > lowest or self.image_token_id >= self.vocab_size:
            raise ValueError(
                f"{len(self.words)} caption words need ids {self.first_word_id}..{words_end - 1}, below the "
                f"image token {self.image_token_id} and reserved ids {list(self.reserved_ids)}, inside "
                f"vocab_size {self.vocab_size}"
            )
        self._ids = {w: self.first_word_id + k for k, w in enumerate(self.words)}

    def __len__(self) -> int:
        return self.vocab_size

    def encode(self, text: str) -> list[int]:
        try:
            return [self._ids[w] for w in text.split()]
        except KeyError as e:
            raise ValueError(f"word {e.args[0]!r} is not in the shapes vocabulary {list(self.words)}") from None

    def decode(self, ids: Sequence[int] | torch.Tensor) -> str:
        """Caption text of `ids`; specials, placeholders and -100 label fill are dropped (for logging)."""
        ids = ids.reshape(-1).tolist() if isinstance(ids, torch.Tensor) else list(ids)
        end = self.first_word_id + len(self.words)
        return " ".join(self.words[i - self.first_word_id] for i in ids if self.first_word_id <= i < end)


@dataclass(frozen=True)
class Shape:
    colour: str
    kind: str
    row: int
    col: int


def caption(scene: Sequence[Shape], grid: int) -> str:
    """Shapes are listed in reading order of their cells, so the caption is a function of the image."""
    parts = [
        f"a {s.colour} {s.kind} at the {ROWS[grid][s.row]} {COLS[grid][s.col]}"
        for s in sorted(scene, key=lambda s: (s.row, s.col))
    ]
    return " and ".join(parts)


def draw_scene(gen: torch.Generator, grid: int, max_shapes: int) -> tuple[Shape, ...]:
    n = int(torch.randint(1, max_shapes + 1, (1,), generator=gen))
    cells = torch.randperm(grid * grid, generator=gen)[:n].tolist()  # distinct cells: no overlap
    colours = torch.randint(len(COLOURS), (n,), generator=gen).tolist()
    kinds = torch.randint(len(SHAPES), (n,), generator=gen).tolist()
    names = list(COLOURS)
    return tuple(Shape(names[c], SHAPES[k], cell // grid, cell % grid) for cell, c, k in zip(cells, colours, kinds))


def shape_mask(kind: str, dy: torch.Tensor, dx: torch.Tensor, r: float) -> torch.Tensor:
    """Filled mask of a shape of half-size `r` at offsets (dy, dx) from its centre (y grows downward)."""
    if kind == "square":
        return (dx.abs() <= r) & (dy.abs() <= r)
    if kind == "circle":
        return dx * dx + dy * dy <= r * r
    if kind == "triangle":  # apex up, base down: half-width grows from 0 to r
        return (dy.abs() <= r) & (dx.abs() <= (dy + r) / 2)
    if kind == "cross":
        arm = max(r / 3, 0.75)  # at least ~2 px wide bars in small cells
        return ((dx.abs() <= arm) & (dy.abs() <= r)) | ((dy.abs() <= arm) & (dx.abs() <= r))
    raise ValueError(f"unknown shape {kind!r}")


def render(
    scene: Sequence[Shape], grid: int, height: int, width: int, gen: torch.Generator, noise: float = 0.03
) -> torch.Tensor:
    """Normalised RGB image [3, height, width]: each shape filled in its colour inside its cell.

    Jitter (background tint, shape size/offset, brightness, pixel noise) keeps images of one
    caption distinct, so the model has to read the colour/shape rather than memorise pixels.
    """
    background = torch.rand(3, 1, 1, generator=gen) * 0.12
    image = background + noise * torch.randn(3, height, width, generator=gen)
    ys = torch.arange(height, dtype=torch.float32).view(-1, 1) + 0.5
    xs = torch.arange(width, dtype=torch.float32).view(1, -1) + 0.5
    cell_h, cell_w = height / grid, width / grid
    for s in scene:
        j = torch.rand(4, generator=gen)
        r = min(cell_h, cell_w) / 2 * (0.65 + 0.25 * j[0].item())  # half-size: 65-90% of the cell
        slack_h, slack_w = cell_h / 2 - r, cell_w / 2 - r  # the shape stays inside its cell
        cy = (s.row + 0.5) * cell_h + slack_h * (2 * j[1].item() - 1)
        cx = (s.col + 0.5) * cell_w + slack_w * (2 * j[2].item() - 1)
        mask = shape_mask(s.kind, ys - cy, xs - cx, r)
        colour = torch.tensor(COLOURS[s.colour]).view(3, 1, 1) * (0.85 + 0.15 * j[3].item())
        image = torch.where(mask, colour + noise * torch.randn(3, height, width, generator=gen), image)
    image = image.clamp(0, 1)
    return (image - torch.tensor(PIXEL_MEAN).view(3, 1, 1)) / torch.tensor(PIXEL_STD).view(3, 1, 1)


def item_seed(seed: int, index: int) -> int:
    """A 32-bit generator seed for item `index` of dataset `seed`.

    torch's CPU generator keeps only the low 32 bits of its seed, so (seed, index) must be folded
    into 32 bits: index + seed * golden-ratio constant is a bijection of the index for each seed
    (no two items of one dataset share a stream), and murmur3's bijective finaliser spreads
    neighbouring values apart.
    """
    x = (index + seed * 0x9E3779B1) & 0xFFFFFFFF
    x = ((x ^ (x >> 16)) * 0x85EBCA6B) & 0xFFFFFFFF
    x = ((x ^ (x >> 13)) * 0xC2B2AE35) & 0xFFFFFFFF
    return x ^ (x >> 16)


class RawFormat:
    """No model: the image and the caption ids as they are."""

    def check_size(self, hw: tuple[int, int]) -> None:
        pass  # any size renders

    def input_ids(self, vocab: Vocabulary, caption_ids: list[int], hw: tuple[int, int] | None) -> torch.Tensor:
        return torch.tensor([vocab.bos_id, *caption_ids, vocab.eos_id])

    def sample(self, vocab, caption_ids, image):
        ids = self.input_ids(vocab, caption_ids, None)
        return {"image": image, "input_ids": ids, "labels": text_labels(ids, 1)}


class ShapesCaptionDataset(Dataset):
    """Map-style dataset of `size` captioned shape images, deterministic in (seed, index).

    image_sizes: (height, width) per sample, cycled by index (image i has image_sizes[i % n]);
        defaults to one square `image_size`. Different sizes give different image-token counts.
    text_only_every: k > 0 makes samples k-1, 2k-1, ... text only (no image, same caption).
    sample_format: RawFormat (default) or a model family's format (families/<family>/sample_format.py); see
        for_model (for_llava / for_qwen2_vl).
    """

    def __init__(
        self,
        size: int,
        image_size: int = 32,
        seed: int = 0,
        max_shapes: int = 1,
        grid: int = 2,
        *,
        image_sizes: Sequence[tuple[int, int]] | None = None,
        text_only_every: int = 0,
        noise: float = 0.03,
        vocab: Vocabulary | None = None,
        sample_format: Any = None,
    ):
        if grid not in ROWS:
            raise ValueError(f"grid must be one of {sorted(ROWS)}, got {grid}")
        if not 1 <= max_shapes <= grid * grid:
            raise ValueError(f"max_shapes must be in 1..{grid * grid} for a {grid}x{grid} grid, got {max_shapes}")
        self.size, self.seed, self.max_shapes, self.grid = int(size), int(seed), int(max_shapes), grid
        self.image_sizes = tuple(tuple(int(v) for v in hw) for hw in (image_sizes or [(image_size, image_size)]))
        self.text_only_every = int(text_only_every)
        self.noise = noise
        self.vocab = vocab or Vocabulary()
        self.format = sample_format or RawFormat()
        for hw in self.image_sizes:  # reject sizes the model cannot take now, not at the first batch
            self.format.check_size(hw)

    @classmethod
    def for_model(cls, model_config, size: int, seed: int = 0, **kwargs) -> "ShapesCaptionDataset":
        """Samples in the format of the model family of `model_config` (its home's `shapes_samples`)."""
        from ..families import family_of_config

        spec = family_of_config(model_config).shapes_samples(model_config, **kwargs)
        vocab = Vocabulary(**spec.pop("vocab"))
        return cls(size, seed=seed, vocab=vocab, **spec)

    @classmethod
    def for_llava(cls, model_config, size: int, seed: int = 0, **kwargs) -> "ShapesCaptionDataset":
        """Samples for LlavaAdapter: the tower's image size, its token count (CLS kept only by "full")."""
        return cls.for_model(model_config, size, seed, **kwargs)

    @classmethod
    def for_qwen2_vl(cls, model_config, size: int, seed: int = 0, **kwargs) -> "ShapesCaptionDataset":
        """Samples for Qwen2VLAdapter (and Qwen2.5-VL, Qwen3-VL); each (height, width) must be a multiple of
        patch * merge pixels (default sizes: families/qwen2_vl/sample_format.py)."""
        return cls.for_model(model_config, size, seed, **kwargs)

    def __len__(self) -> int:
        return self.size

    def generator(self, index: int) -> torch.Generator:
        if not 0 <= index < self.size:
            raise IndexError(f"index {index} out of range for {self.size} samples")
        return torch.Generator().manual_seed(item_seed(self.seed, index))

    def scene(self, index: int) -> tuple[Shape, ...]:
        return draw_scene(self.generator(index), self.grid, self.max_shapes)

    def caption(self, index: int) -> str:
        return caption(self.scene(index), self.grid)

    def image_hw(self, index: int) -> tuple[int, int] | None:
        """(height, width) of sample `index`'s image, or None for a text-only sample."""
        if self.text_only_every and index % self.text_only_every == self.text_only_every - 1:
            return None
        return self.image_sizes[index % len(self.image_sizes)]

    def input_ids(self, index: int) -> torch.Tensor:
        """The sample's `input_ids` without rendering its image (image-token counts for a loader)."""
        ids = self.vocab.encode(self.caption(index))
        return self.format.input_ids(self.vocab, ids, self.image_hw(index))

    def image(self, index: int) -> torch.Tensor | None:
        """The normalised image [3, H, W] of sample `index` before any model formatting (None if text only)."""
        return self._scene_and_image(index)[1]

    def _scene_and_image(self, index: int):
        gen = self.generator(index)
        scene = draw_scene(gen, self.grid, self.max_shapes)  # first, from the same stream as scene()
        hw = self.image_hw(index)
        return scene, None if hw is None else render(scene, self.grid, hw[0], hw[1], gen, self.noise)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        scene, image = self._scene_and_image(index)
        return self.format.sample(self.vocab, self.vocab.encode(caption(scene, self.grid)), image)
