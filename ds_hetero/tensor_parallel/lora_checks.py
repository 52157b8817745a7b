"""The LoRA layers a layout cannot train exactly (see lora.py), refused before any collective.

`lora_dropout > 0` is not among them: on a tp-sharded layer its mask comes from the stage's
model-parallel RNG (lora_dropout.py, rng.py), equal on the tp peers where the input is replicated.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from torch import nn

from ..errors import HeteroConfigError
from .lora import is_lora_layer
from .shard_plans import PlanTable, child_of, planned_modules

LANGUAGE = "language"


def _on_replicated_experts(m: nn.Module) -> bool:
    """PEFT's ParamWrapper on a fused 3-D expert weight (`target_parameters`): tp replicates the
    experts (without sequence parallelism every tp rank routes the same tokens through them), so
    their adapter is replicated too and its gradients are equal over tp, as the experts' are
    (expert_parallel/lora.py shards it over ep)."""
    return type(m).__name__ == "ParamWrapper" and getattr(m, "_param_ndim", 2) == 3


def lora_problems(model: nn.Module, encoder_modules: Mapping[str, Sequence[nn.Module]], tp: Mapping[str, int],
                  sequence_parallel: bool = False, *, plans: PlanTable) -> list[str]:
    """What keeps the model's LoRA layers from training exactly in this layout (pure: no communication).

    `encoder_modules`: each encoder stage's modules (the adapter's `encoder_modules()`); a LoRA
    layer inside none of them belongs to the language stage. `tp`: every stage's tp size, by name.
    `plans`: the tp plans (the adapter's `tp_plans`), which say which linears tp shards.
    """
    planned = {id(child_of(module, child)) for _, module, plan in planned_modules(model, plans)
               for child in (*plan.column, *plan.row)} - {id(None)}
    stage_of = {id(m): name for name, modules in encoder_modules.items() for top in modules for m in top.modules()}
    problems = []
    for name, m in model.named_modules():
        if type(m).__name__ == "ModulesToSaveWrapper":
            problems.append(f"{name}: PEFT modules_to_save is not supported; train the module with LoRA or leave it "
                            f"frozen")
        if not is_lora_layer(m):
            continue
        stage = stage_of.get(id(m), LANGUAGE)
        size = tp[stage]
        if getattr(m, "lora_variant", None):
            problems.append(f"{name}: LoRA variants (DoRA, ...) are not supported; use plain LoRA (use_dora=False)")
        if size > 1 and id(m) not in planned and not _on_replicated_experts(m):
            problems.append(f"{name}: a LoRA layer on a module tensor parallelism does not shard, in the {stage} stage "
                            f"with tp={size}; leave it out of target_modules or use tp=1 there")
        if stage == LANGUAGE and sequence_parallel:
            problems.append(f"{name}: LoRA with sequence parallelism is not supported; set sequence_parallel=false")
    return problems


def check_lora(model: nn.Module, adapter, cfg) -> None:
    """Raise the same HeteroConfigError on every rank, before any collective, for LoRA layers this layout
    cannot train exactly (nothing to check without LoRA layers). Every encoder stage of the adapter
    is checked against its own tp size."""
    if not any(is_lora_layer(m) for m in model.modules()):
        return
    encoders = adapter.encoder_modules()
    tp = {name: cfg.stages[name].tp for name in (*encoders, LANGUAGE)}
    problems = lora_problems(model, encoders, tp, bool(getattr(cfg.stages[LANGUAGE], "sequence_parallel", False)),
                             plans=adapter.tp_plans)
    if problems:
        more = f"\n  ... and {len(problems) - 8} more" if len(problems) > 8 else ""
        raise HeteroConfigError("hetero_parallel.stages", "LoRA layers that cannot train exactly in this layout:\n  - "
                                + "\n  - ".join(problems[:8]) + more)
