"""Expert parallelism on the language stage (docs/expert-parallel.md).

    dispatch.py  token dispatch and combine: AutoEP's all-to-all over the stage's ep group
    layers.py    ExpertParallelExperts: a Hugging Face fused-experts module sharded over ep
    aux_loss.py  the router's load-balancing loss over the stage's dp x cp tokens (and its
                 partial sums carried over pipeline stages)
    zero.py      the named expert groups DeepSpeed reduces expert gradients over
    checks.py    what a model and a config must satisfy (before any collective)
    gather.py    full expert tensors for checkpoints, save_pretrained and tests (where a tensor's experts are)
    lora.py      PEFT LoRA on the expert weights (target_parameters), its factors sharded with the experts
    apply.py     replacing a model's experts by their ep shards; the aux-loss hand-off
"""

from .apply import apply_expert_parallel, aux_of_carried, carry_router_stats, take_aux_loss
from .layers import ExpertParallelExperts, is_expert_parameter

__all__ = ["ExpertParallelExperts", "apply_expert_parallel", "aux_of_carried", "carry_router_stats", "is_expert_parameter",
           "take_aux_loss"]
