"""What a DeepSpeed user would run instead of ds_hetero, in the same cost model.

    plain ZeRO dp      one deepspeed.initialize over the whole model, dp over every rank: the
                       work of the colocated layout vision tp1 dpN, language tp1 dpN with no
                       boundary exchange
    DeepSpeed AutoTP   `"tensor_parallel": {"autotp_size": t}`: the language model is sharded
                       over t ranks, the vision tower and projector stay replicated (see
                       /work/shared/reference/probes/autotp_llava.py), so every tp rank encodes
                       the images of its dp group: vision work of tp1 dp(N/t) on every rank,
                       language tp t dp(N/t), no boundary exchange

Both are predicted per rank and combined as a colocated step (pipeline.colocated_step). For a MoE
language model `ep` shards its experts over ep of the language's dp ranks (DeepSpeed's MoE /
AutoEP `ep_size`, the experts' gradients over the remaining dp / ep ranks); the encoder is
unchanged. (Megatron's single layout with ep, the tuned baseline, is the first_stage placement:
modelled.py.)
"""

from __future__ import annotations

from .candidate import StageChoice
from .cost import stage_times
from .machine import MachineProfile
from ..models.shapes import ModelSpec
from .step_time import colocated_step
from .workload import Workload


def plain_deepspeed_step(spec: ModelSpec, wl: Workload, machine: MachineProfile, world: int, autotp: int = 1,
                         micro_batches: int = 1, ep: int = 1) -> float:
    dp = world // autotp
    if ep > 1 and (not spec.language.moe or dp % ep or spec.language.experts % ep):
        raise ValueError(f"ep={ep}: needs a MoE language model whose experts and dp ({dp}) it divides")
    v, _ = stage_times(spec, wl, machine, "vision", StageChoice(tp=1, dp=dp), micro_batches)
    lang, _ = stage_times(spec, wl, machine, "language", StageChoice(tp=autotp, dp=dp, ep=ep), micro_batches)
    step, busy = colocated_step(v, lang, 0.0, micro_batches)
    if machine.compute_units and machine.compute_units < world:
        step = max(step, busy * world / machine.compute_units)
    return step + machine.collective_time("all_reduce", 64, world)  # the loss all-reduce
