"""Model classes ds_hetero knows and refuses, each with the reason (what `adapter_for` says)."""

from __future__ import annotations

from types import MappingProxyType

REFUSED = MappingProxyType({
    "Qwen3VLMoeForConditionalGeneration": (
        "its language model is a mixture of experts, and ds_hetero has no expert parallelism: the experts "
        "would be replicated on every language rank and sharded by no plan; train the dense Qwen3-VL "
        "(Qwen3VLForConditionalGeneration) or a dense family instead"),
})


def refusal(class_name: str) -> str:
    return f"ds_hetero refuses {class_name}: {REFUSED[class_name]}"
