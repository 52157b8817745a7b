"""What expert parallelism needs of the model and of the rest of the config (pure: before any collective).

The structural part of `stages.language.ep` (a divisor of cp x dp, the language stage only) is
checked with the config (config/parse.py); here, with the model:
- the model has experts, and ep divides their count;
- ZeRO 0-3 with ep > 1, and a pipelined MoE language stage (pp > 1, with or without ep: the
  experts on every pipeline stage, the aux loss's sums carried between them, aux_loss.py).
Each refusal names the field and what would be valid.
"""

from __future__ import annotations

from ..errors import HeteroConfigError

SECTION = "hetero_parallel"  # config.SECTION; not imported: the config sits above the axes


def check_expert_parallel(text_config, cfg) -> None:
    language = cfg.stages["language"]
    field = f"{SECTION}.stages.language"
    experts = int(getattr(text_config, "num_experts", 0) or 0)
    if language.ep > 1 and experts == 0:
        raise HeteroConfigError(f"{field}.ep", f"got {language.ep}, but the model has no experts; use ep 1")
    if experts and experts % language.ep:
        sizes = [d for d in range(1, experts + 1) if experts % d == 0 and (language.cp * language.dp) % d == 0]
        raise HeteroConfigError(f"{field}.ep", f"ep={language.ep} does not divide the {experts} experts; use one of {sizes}")

