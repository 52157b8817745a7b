"""Peak memory of one rank: parameters, gradients, optimizer state per ZeRO stage, activations.

Model states per parameter of a stage's tp shard (P = ModelSpec.params_per_rank: split
parameters / tp + replicated ones; the language stage's input embedding and head are split on
the vocabulary, ceil(vocab / tp) rows each, a tied matrix counted once), as DeepSpeed
allocates them with Adam (checked against a real engine in tests/test_planner_memory.py):

    ZeRO 0   parameters P, gradients P, Adam moments 2P (fp32; the torch optimizer's state)
    ZeRO 1   parameters P, gradients P, fp32 master partition P/dp, moments 2P/dp
    ZeRO 2   parameters P, gradients P/dp, fp32 master partition P/dp, moments 2P/dp
    ZeRO 3   parameters P/dp, gradients P/dp, fp32 master partition P/dp, moments 2P/dp

(dp counts the stage's dp x cp ranks, which hold the same parameters.) Activations: Korthikanti
et al. 2022 ("Reducing activation recomputation in large transformer models"), per layer and
token of a 2-byte dtype `hidden x (10 + 24/tp)`, `34 x hidden / tp` with sequence parallelism,
plus the attention scores `5 x heads x seq / tp` per token when the kernel stores them (no
flash attention); scaled by dtype_bytes / 2 and by 1/cp for the tokens a cp rank holds.
Colocated ranks hold one micro-batch of both stages; in the disaggregated 1F1B a vision rank
holds two micro-batches (it encodes m+1 before the backward of m), a language rank one.
"""

from __future__ import annotations

from dataclasses import dataclass

from .candidate import Candidate, StageChoice
from .model_spec import ModelSpec
from .workload import Workload


@dataclass(frozen=True)
class StateElements:
    """Elements (not bytes) one rank holds for one stage's model states."""

    params: float
    grads: float
    master: float  # fp32 copy of the partition (ZeRO >= 1)
    moments: float  # Adam exp_avg + exp_avg_sq

    def bytes(self, dtype_bytes: int) -> float:
        return (self.params + self.grads) * dtype_bytes + (self.master + self.moments) * 4


def state_elements(params: float, layout: StageChoice, zero: int) -> StateElements:
    """`params`: what one tp rank holds (ModelSpec.params_per_rank)."""
    p = params
    n = layout.dp * layout.cp
    if zero == 0:
        return StateElements(p, p, 0.0, 2 * p)
    return StateElements(p / n if zero == 3 else p, p / n if zero >= 2 else p, p / n, 2 * p / n)


def vision_activation_bytes(spec: ModelSpec, wl: Workload, samples: int, tp: int, flash: bool) -> float:
    v = spec.vision
    images = samples * wl.images_per_sample(spec)
    seq = v.seq_per_image(wl.tokens_per_image(spec))
    tokens = images * seq
    per_layer = tokens * v.hidden * (10 + 24 / tp) + (0 if flash else 5 * v.heads * seq * tokens / tp)
    return per_layer * v.layers_backward * wl.dtype_bytes / 2


def language_activation_bytes(spec: ModelSpec, wl: Workload, samples: int, layout: StageChoice, flash: bool) -> float:
    lm = spec.language
    tp, cp = layout.tp, layout.cp
    tokens = samples * wl.seq_len / cp
    per_token = 34 / tp if layout.sequence_parallel else 10 + 24 / tp
    per_layer = tokens * lm.hidden * per_token + (0 if flash else 5 * lm.heads * wl.seq_len * tokens / tp)
    logits = tokens * lm.vocab / tp * 4 * 2  # fp32 logits and their softmax for the loss
    return per_layer * lm.layers * wl.dtype_bytes / 2 + logits


@dataclass(frozen=True)
class RankMemory:
    states: float
    activations: float

    @property
    def total(self) -> float:
        return self.states + self.activations


def stage_memory(spec: ModelSpec, wl: Workload, cand: Candidate, stage: str, flash: bool, in_flight: int
                 ) -> RankMemory:
    layout = cand.vision if stage == "vision" else cand.language
    samples = wl.global_batch // (layout.dp * cand.micro_batches)
    states = state_elements(spec.params_per_rank(stage, layout.tp), layout, wl.zero).bytes(wl.dtype_bytes)
    if stage == "vision":  # the tower's unused tail is held (split over tp where it is sharded)
        states += spec.vision.untrained_params() / layout.tp * wl.dtype_bytes
    if stage == "vision":
        act = vision_activation_bytes(spec, wl, samples, layout.tp, flash)
    else:
        act = language_activation_bytes(spec, wl, samples, layout, flash)
    return RankMemory(states, act * in_flight)


def peak_memory(spec: ModelSpec, wl: Workload, cand: Candidate, flash: bool) -> dict[str, float]:
    """Peak bytes per rank set: {"all": ...} colocated, {"vision": ..., "language": ...} disaggregated."""
    if cand.disaggregated:
        return {"vision": stage_memory(spec, wl, cand, "vision", flash, 2).total,
                "language": stage_memory(spec, wl, cand, "language", flash, 1).total}
    return {"all": stage_memory(spec, wl, cand, "vision", flash, 1).total
            + stage_memory(spec, wl, cand, "language", flash, 1).total}
