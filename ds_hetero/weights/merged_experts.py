"""Experts stored one tensor per expert, read into the model's fused `[E, ...]` expert tensors slice by slice.

Some families' checkpoints keep each expert's projections apart (Qwen3.5-MoE on the Hub, and what
`save_pretrained` writes back for it: `mlp.experts.<e>.gate_proj.weight`, `.up_proj.weight`,
`.down_proj.weight`), while the model holds them fused (`gate_up_proj [E, 2I, H]`, `down_proj [E, H, I]`).
transformers' conversion for them (its `qwen2_moe` table) is `MergeModulelist(dim=0)` (stack the experts
on a new dim 0), then for gate | up `Concatenate(dim=1)` (the projections one after the other). Both
act along the experts or inside one expert, so reading experts [a, b) of dim 0 (an ep rank's) is reading
those experts' own tensors, each one whole: no other tensor is touched.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


def is_merge(converter) -> bool:
    """Whether a transformers WeightConverter stacks per-expert tensors (and at most concatenates them
    inside an expert) into one: the conversion per-expert reads can apply."""
    from transformers.core_model_loading import Concatenate, MergeModulelist

    ops = list(getattr(converter, "operations", ()))
    if not ops or not isinstance(ops[0], MergeModulelist) or ops[0].dim != 0:
        return False
    rest = ops[1:]
    return not rest or (len(rest) == 1 and isinstance(rest[0], Concatenate) and rest[0].dim == 1)


def converter_of(converters, pattern: str):
    return next((c for c in converters if pattern in getattr(c, "source_patterns", ())), None)


def expert_index(name: str, pattern: str) -> int:
    """The expert number the `*` of `pattern` matches in checkpoint name `name`."""
    regex = re.escape(pattern).replace(r"\*", r"(\d+)")
    found = re.search(regex, name)
    if found is None:
        raise ValueError(f"{name!r} does not match {pattern!r}")
    return int(found.group(1))


@dataclass
class MergedExperts:
    """One fused model tensor: per source pattern (the concatenation order), expert number -> checkpoint name."""

    patterns: tuple[str, ...]
    names: dict[str, dict[int, str]]

    def add(self, name: str, pattern: str) -> None:
        self.names.setdefault(pattern, {})[expert_index(name, pattern)] = name

    def experts(self) -> int:
        counts = {len(self.names.get(p, {})) for p in self.patterns}
        return min(counts) if counts else 0

    def pieces(self, expert: int) -> list[str]:
        """The checkpoint tensors of one expert, in the order they are concatenated."""
        return [self.names[p][expert] for p in self.patterns]

    def complete(self) -> str | None:
        """None, or what is missing (an expert number absent for one of the projections)."""
        n = max((len(self.names.get(p, {})) for p in self.patterns), default=0)
        for p in self.patterns:
            missing = sorted(set(range(n)) - set(self.names.get(p, {})))
            if missing:
                return f"{p!r} has no tensor for experts {missing}"
        return None

    def shape(self, shape_of) -> tuple[int, ...]:
        first = [shape_of[n] for n in self.pieces(0)]
        return (self.experts(), sum(s[0] for s in first), *first[0][1:])
