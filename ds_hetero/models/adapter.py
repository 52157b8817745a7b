"""What the engine needs to know about a multimodal model family, behind one interface.

An adapter cuts a Hugging Face model into stage modules that share its parameters, and turns a
list of per-sample dicts into each stage's inputs. The boundary tensor is always `[T, H]`: one
row per image placeholder token, samples in order, placeholders in sequence order.

Samples are dicts with at least `input_ids` (1-D, with image placeholder ids) and `labels`
(1-D, -100 where no loss is taken); image samples add the model's image fields. A sample may
have no image.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import nn

from ..loss import IGNORE_INDEX


class StageAdapter:
    """Base class: padding and placeholder bookkeeping shared by every family."""

    image_token_id: int
    pad_token_id: int = 0

    model: nn.Module

    def split(self) -> dict[str, nn.Module]:
        raise NotImplementedError

    def vision_modules(self) -> list[nn.Module]:
        """The vision stage's modules that tensor parallelism shards (tower, projector)."""
        raise NotImplementedError

    @property
    def hidden_size(self) -> int:
        """Width of a boundary row: the language model's hidden size."""
        return self.model.config.text_config.hidden_size

    # ------------------------------------------------------------------ tensor parallelism
    def check_layouts(self, cfg) -> None:
        """Every tp size divides what it must (heads, kv heads, MLP width, vocabulary).

        Pure: needs only the model's config and the layouts, so it runs before any collective
        and raises the same HeteroConfigError on every rank.
        """
        from ..tensor_parallel import validate_tensor_parallel
        from ..tensor_parallel.shard import PAD_YOURSELF, _check_head

        vision, language = cfg.stages["vision"], cfg.stages["language"]
        for module in self.vision_modules():
            validate_tensor_parallel(module, vision.tp, "vision")
        validate_tensor_parallel(self.model.get_decoder(), language.tp, "language")
        if language.tp > 1:
            _check_head(self.model, language.tp, False, "language", PAD_YOURSELF)
        from ..context_parallel import check_context_parallel, is_sharded

        check_context_parallel(self.model.config.text_config, language.tp, language.cp, is_sharded(language))

    def shard(self, groups, cfg) -> None:
        """Shard each stage this rank holds over that stage's tp group (in place, no communication)."""
        from ..context_parallel import apply_sequence_sharded_attention, is_sharded
        from ..tensor_parallel import shard_language_model, shard_vision_tower

        if groups["vision"].is_member and cfg.stages["vision"].tp > 1:
            for module in self.vision_modules():
                shard_vision_tower(module, groups["vision"].tp)
        language = cfg.stages["language"]
        if groups["language"].is_member and language.tp > 1:
            # The language stage embeds only its own sequence chunk (context_parallel.sequence):
            # under sequence parallelism the decoder's input is already split.
            shard_language_model(self.model, groups["language"].tp,
                                 sequence_parallel=language.sequence_parallel, split_input=False)
        if groups["language"].is_member and is_sharded(language):
            apply_sequence_sharded_attention(self.model.get_decoder(), groups["language"].cp)

    def vision_inputs(self, samples: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        """Keyword arguments of the vision stage's forward for these samples' images."""
        raise NotImplementedError

    def position_ids(self, batch: dict[str, torch.Tensor], samples: Sequence[dict[str, Any]]) -> torch.Tensor | None:
        """Position ids of the padded batch; None lets the language model count 0..s-1."""
        return None

    def image_token_count(self, sample: dict[str, Any]) -> int:
        return int((sample["input_ids"] == self.image_token_id).sum())

    # ------------------------------------------------------------------ images (ds_hetero/balance.py)
    def image_rows(self, sample: dict[str, Any]) -> list[int]:
        """Boundary rows of each image of the sample, in order, from `input_ids` alone (light
        samples too, so every rank computes the same encoder assignment)."""
        raise NotImplementedError

    def image_cost(self, rows: int) -> int:
        """The encoder's work for an image of `rows` boundary rows (balance.transformer_cost)."""
        raise NotImplementedError

    def select_images(self, sample: dict[str, Any], images: Sequence[int]) -> dict[str, Any]:
        """The sample's image fields restricted to `images` (ascending indices), for vision_inputs."""
        raise NotImplementedError

    def language_inputs(self, samples: Sequence[dict[str, Any]], multiple: int = 1) -> dict[str, torch.Tensor]:
        """Right-padded `input_ids`, `attention_mask`, `labels` (-100 on padding), `position_ids`.

        `multiple`: pad the length up to a multiple of it (the sequence-shard count).
        """
        length = max(int(s["input_ids"].shape[-1]) for s in samples)
        length = -(-length // multiple) * multiple
        ids = torch.full((len(samples), length), self.pad_token_id, dtype=torch.long)
        labels = torch.full((len(samples), length), IGNORE_INDEX, dtype=torch.long)
        mask = torch.zeros((len(samples), length), dtype=torch.long)
        for i, s in enumerate(samples):
            n = int(s["input_ids"].shape[-1])
            ids[i, :n] = s["input_ids"].reshape(-1)
            labels[i, :n] = s["labels"].reshape(-1)
            mask[i, :n] = 1
        batch = {"input_ids": ids, "attention_mask": mask, "labels": labels}
        batch["position_ids"] = self.position_ids(batch, samples)
        return batch

    def check_sample(self, sample: dict[str, Any], index: int) -> None:
        """Reject a sample whose image fields disagree with its placeholders (before any collective)."""
        for key in ("input_ids", "labels"):
            if key not in sample:
                raise ValueError(f"sample {index}: missing '{key}'")
        if sample["input_ids"].shape != sample["labels"].shape:
            raise ValueError(
                f"sample {index}: input_ids {tuple(sample['input_ids'].shape)} and labels "
                f"{tuple(sample['labels'].shape)} differ in shape"
            )
