"""Labels of a prompt + answer sample: the loss is taken on the answer only."""

from __future__ import annotations

import torch

from ..loss import IGNORE_INDEX


def text_labels(ids: torch.Tensor, prefix: int) -> torch.Tensor:
    """Loss on the caption and eos only: bos and image/special tokens (the first `prefix`) get -100 (IGNORE_INDEX)."""
    labels = ids.clone()
    labels[:prefix] = IGNORE_INDEX
    return labels
