"""Qwen3.5-MoE's tensor-parallel plans: Qwen3.5's (families/qwen3_5/plans.py: the Gated DeltaNet layers by
heads, the gated full attention, the tower) for the classes of its own module. Its `Qwen3_5MoeMLP` is each
MoE block's shared expert: gate/up column, down row, one tp region. The block's router (`gate`), its
shared expert's sigmoid gate (`shared_expert_gate`, one output) and its routed experts have no tp plan: the
two gates are replicated over tp, the experts sharded over ep (expert_parallel/)."""

from __future__ import annotations

from ..qwen3_5.plans import qwen3_5_plans

TP_PLANS = qwen3_5_plans("qwen3_5_moe", "Qwen3_5Moe")
