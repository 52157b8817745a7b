"""The training FLOPs of one step per stage, from the model's shapes and the step's real lengths.

The same GEMMs the cost model prices (planner/flops.py), counted for the samples as they are: the
language stage per sample at its own length (attention within the sample, as a varlen kernel
or ds_hetero's per-sample attention computes it for a packed row; a padded row's padding is not
counted: these are model FLOPs, not the kernel's), each encoder per item at its own size. The
attention's score matrix is counted whole (causal masking not discounted), as PaLM's MFU
formula and torch's FlopCounterMode count it. Forward plus backward, where the backward runs:
a frozen tower has none (planner/frozen.py). Checked against FlopCounterMode on each family's
Hugging Face model (tests/base/test_step_flops.py).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Mapping, Sequence

from ..config import LANGUAGE
from ..models.shapes import ModelSpec
from ..planner.flops import language_work, vision_work
from ..planner.frozen import Freeze
from ..planner.workload import Workload


class StepFlops:
    """FLOPs of one step per stage: `of(lengths, items)`. Per-length results are kept (a step's
    lengths repeat across steps), so a step costs a dictionary lookup per sample and item."""

    def __init__(self, spec: ModelSpec, freeze: Freeze = Freeze()):
        self.spec, self.freeze = spec, freeze
        self._language: dict[int, int] = {}
        self._items: dict[tuple[str, int], int] = {}

    def language(self, length: int) -> int:
        """One sample of `length` tokens through the decoder and the head, forward and backward."""
        if length not in self._language:
            wl = Workload(seq_len=length, image_tokens=0, global_batch=1, freeze=self.freeze)
            self._language[length] = language_work(self.spec, wl, 1, 1, 1, causal=1.0).flops
        return self._language[length]

    def item(self, encoder: str, rows: int) -> int:
        """One item (an image, a clip) of `encoder` giving `rows` boundary rows, with its projector."""
        key = (encoder, rows)
        if key not in self._items:
            view = self.spec.view(encoder)
            fixed = view.vision.tokens_per_image
            if fixed and rows % fixed:  # not whole images (or tiles) of the nominal size: one image of its
                # real size (a Gemma 4 image under its soft-token budget)
                view = replace(view, encoders=((encoder, replace(view.vision, tokens_per_image=0)),))
            wl = Workload(seq_len=rows, image_tokens=rows, global_batch=1, freeze=self.freeze.view(encoder))
            self._items[key] = vision_work(view, wl, 1, 1).flops
        return self._items[key]

    def of(self, lengths: Sequence[int], items: Mapping[str, Sequence[int]]) -> dict[str, int]:
        """{stage: FLOPs} of a step whose samples have `lengths` language tokens and whose encoders
        get items of `items[encoder]` boundary rows each (all ranks together)."""
        out = {name: sum(self.item(name, r) for r in rows) for name, rows in items.items()}
        out[LANGUAGE] = sum(self.language(n) for n in lengths)
        return out
