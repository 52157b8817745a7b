"""Model classes ds_hetero knows and refuses, each with the reason (what `adapter_for` says)."""

from __future__ import annotations

from types import MappingProxyType

# Qwen3VLMoeForConditionalGeneration, refused here until expert parallelism was built, has its
# family home (families/qwen3_vl_moe/).
# Gemma4ForConditionalGeneration, refused here until its adapter was built, has its family home
# (families/gemma4/).
REFUSED = MappingProxyType({})


def refusal(class_name: str) -> str:
    return f"ds_hetero refuses {class_name}: {REFUSED[class_name]}"
