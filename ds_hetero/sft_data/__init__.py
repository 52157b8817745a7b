"""Real supervised fine-tuning data: LLaVA JSON and messages (LLaMA-Factory / TRL) files with an image folder,
encoded with the model's own processor and chat template, labels on assistant turns only (docs/real-data.md)."""

from .dataset import SFTDataset
from .encode import encode_row
from .rows import BadRowError, Row, Turn, read_rows

__all__ = ["BadRowError", "Row", "SFTDataset", "Turn", "encode_row", "read_rows"]
