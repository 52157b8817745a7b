"""What the engine needs to know about a multimodal model family, behind one interface.

An adapter cuts a Hugging Face model into stage modules that share its parameters, and turns a
list of per-sample dicts into each stage's inputs. The boundary tensor is always `[T, W]`: one
row per image placeholder token, samples in order, placeholders in sequence order; W is
`hidden_size` (the language model's width, or for Qwen3-VL that width times 1 + its DeepStack
levels, carried side by side: families/qwen3_vl/adapter.py).

Samples are dicts with at least `input_ids` (1-D, with image placeholder ids) and `labels`
(1-D, -100 where no loss is taken); image samples add the model's image fields. A sample may
have no image.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Callable, Mapping, Sequence

import torch
from torch import nn

from ..loss import IGNORE_INDEX
from .item_cost import transformer_cost
from .per_sample_attention import PER_SAMPLE, ROW_MASK, apply_per_sample_attention, packed_attention_mode


# Media fields the families' processors emit (and their HF forwards take). A sample carrying one its
# family's adapter does not read (SAMPLE_FIELDS) is refused by name instead of silently training
# without it (e.g. a video's fields given to an image-only family). Per-token fields the processors
# also emit (attention_mask, token_type_ids, mm_token_type_ids) are rebuilt by the engine.
MEDIA_FIELDS = frozenset({
    "pixel_values", "image_grid_thw", "image_sizes", "batch_num_images", "num_crops", "image_num_patches",
    "pixel_attention_mask", "pixel_values_videos", "video_grid_thw", "second_per_grid_ts", "video_second_per_grid",
    "batch_num_videos", "input_features", "feature_attention_mask", "audio_feature_lengths", "input_features_mask",
})


@dataclass(frozen=True)
class EncoderPort:
    """What the engine needs of one encoder stage, without naming it: one per encoder stage.

    Everything outside the adapters (the StepPlan, the schedules, balancing, the batch
    agreement) reaches an encoder only through its port, so a model with more encoders (audio,
    video) adds ports here, not cases there.

    token_id   the placeholder id whose positions the encoder's rows replace in `input_ids`
    more_ids   further placeholder ids of the same encoder (an image tower that also encodes
               video frames: image and video placeholders take its rows in sequence order)
    rows       sample -> boundary rows of each of its items (images, clips), from `input_ids`
               alone (light samples too, so every rank computes the same plan)
    cost       rows -> the encoder's work for one item (step/balance.py transformer_cost)
    select     (sample, item indices) -> the sample's fields for those items
    inputs     selected samples -> keyword arguments of the encoder stage's forward
    costs      sample -> the encoder's work for each of its items, from `input_ids` alone, where
               an item's work is not a function of its rows (a video clip's frames attend within
               themselves, an image over all its patches); default: `cost` of each item's rows
    """

    name: str
    token_id: int
    rows: Callable[[dict[str, Any]], list[int]]
    cost: Callable[[int], int]
    select: Callable[[dict[str, Any], Sequence[int]], dict[str, Any]]
    inputs: Callable[[Sequence[dict[str, Any]]], dict[str, torch.Tensor]]
    more_ids: tuple[int, ...] = ()
    costs: Callable[[dict[str, Any]], list[int]] | None = None

    def item_costs(self, sample: dict[str, Any]) -> list[int]:
        """The encoder's work for each item of the sample, in the order of `rows`."""
        return self.costs(sample) if self.costs is not None else [self.cost(n) for n in self.rows(sample)]

    @property
    def ids(self) -> tuple[int, ...]:
        """Every placeholder id whose positions this encoder's rows replace."""
        return (self.token_id, *self.more_ids)

    def mask(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Where this encoder's rows go in `input_ids` (any of its placeholder ids)."""
        return placeholder_mask(input_ids, self.ids)

    def count(self, sample: dict[str, Any]) -> int:
        """Placeholders of this encoder in the sample."""
        return int(self.mask(sample["input_ids"]).sum())


def placeholder_mask(input_ids: torch.Tensor, ids: int | Sequence[int]) -> torch.Tensor:
    """`input_ids` equal to any of `ids` (one id: a plain comparison)."""
    ids = (ids,) if isinstance(ids, int) else tuple(ids)
    if len(ids) == 1:
        return input_ids == ids[0]
    return torch.isin(input_ids, torch.tensor(ids, dtype=input_ids.dtype, device=input_ids.device))


class StageAdapter:
    """Base class: padding and placeholder bookkeeping shared by every family."""

    image_token_id: int
    pad_token_id: int = 0
    # The encoder stages this family has, as `stages.<name>` in the config (see encoders()).
    ENCODER_STAGES: tuple[str, ...] = ("vision",)
    # Why language_batching "packed" cannot run this family (None: it can; models/packing.py).
    PACKING_REFUSED: str | None = None
    # Which module classes are sharded how over tp: every family's plans merged (a family's model may
    # hold another family's decoder or tower). Set by the family registry (families/__init__.py
    # `adapter_for`), which is what builds adapters.
    tp_plans: Mapping[str, Any] = MappingProxyType({})
    # The media fields (MEDIA_FIELDS) its samples take; any other is refused by name in check_sample.
    SAMPLE_FIELDS: tuple[str, ...] = ("pixel_values",)

    model: nn.Module

    def split(self) -> dict[str, nn.Module]:
        """{encoder stage name: module, ..., "language": module}, sharing the model's parameters."""
        raise NotImplementedError

    def check_stages(self, cfg) -> None:
        """The config's encoder stages are exactly this model's (pure: before any collective)."""
        from ..errors import HeteroConfigError

        from ..config import LANGUAGE, SECTION

        configured = [name for name in cfg.stages if name != LANGUAGE]
        for name in configured:
            if name not in self.ENCODER_STAGES:
                raise HeteroConfigError(
                    f"{SECTION}.stages.{name}", f"{type(self.model).__name__} has no {name!r} encoder; its encoder "
                    f"stages are {', '.join(self.ENCODER_STAGES)}: remove it")
        for name in self.ENCODER_STAGES:
            if name not in configured:
                raise HeteroConfigError(f"{SECTION}.stages.{name}",
                                        f"missing; {type(self.model).__name__} has a {name!r} encoder stage: give its layout")

    def encoders(self) -> dict[str, EncoderPort]:
        """The encoder stages in the order their rows are exchanged: here one image encoder
        ("vision"), reached through the image_* / vision_* methods below."""
        ports = getattr(self, "_ports", None)
        if ports is None:
            ports = self._ports = {"vision": EncoderPort("vision", self.image_token_id, self.image_rows,
                                                         self.image_cost, self.select_images, self.vision_inputs)}
        return ports

    def vision_modules(self) -> list[nn.Module]:
        """The vision stage's modules that tensor parallelism shards (tower, projector)."""
        raise NotImplementedError

    def encoder_modules(self) -> dict[str, list[nn.Module]]:
        """Each encoder stage's modules that tensor parallelism shards over that stage's tp group."""
        return {"vision": self.vision_modules()}

    # Whether the language stage adds a router load-balancing loss (a mixture-of-experts family
    # with `output_router_logits`): StepResult.aux_loss is reported then.
    @property
    def has_aux_loss(self) -> bool:
        return False

    # With the aux loss: the number of experts whose router statistics it sums (the size of what a
    # pipelined language stage passes between its pipeline stages, expert_parallel/aux_loss.py),
    # and `router_aux_loss_coef`; 0 and 0.0 without one. Read at every step (TRL sets them late).
    @property
    def router_experts(self) -> int:
        return 0

    @property
    def router_aux_coef(self) -> float:
        return 0.0

    @property
    def hidden_size(self) -> int:
        """Width of a boundary row: the language model's hidden size (Qwen3-VL: times 1 + DeepStack levels)."""
        return self.model.config.text_config.hidden_size

    # ------------------------------------------------------------------ tensor parallelism
    def check_layouts(self, cfg) -> None:
        """Every tp size divides what it must (heads, kv heads, MLP width, vocabulary).

        Pure: needs only the model's config and the layouts, so it runs before any collective
        and raises the same HeteroConfigError on every rank.
        """
        from ..tensor_parallel import validate_tensor_parallel
        from ..tensor_parallel.shard import PAD_YOURSELF, check_head

        self.check_stages(cfg)
        language = cfg.stages["language"]
        for name, modules in self.encoder_modules().items():
            for module in modules:
                validate_tensor_parallel(module, cfg.stages[name].tp, name, plans=self.tp_plans)
        validate_tensor_parallel(self.model.get_decoder(), language.tp, "language", plans=self.tp_plans)
        if language.tp > 1:
            check_head(self.model, language.tp, False, "language", PAD_YOURSELF)
        from ..context_parallel import check_context_parallel, is_sharded

        check_context_parallel(self.model.config.text_config, language.tp, language.cp, is_sharded(language))
        from ..expert_parallel.checks import check_expert_parallel

        check_expert_parallel(self.model.config.text_config, cfg)  # ep needs experts; a MoE stage's limits

    def shard(self, groups, cfg) -> None:
        """Shard each stage this rank holds over that stage's tp group, and give its language
        decoder the attention its batches need: per sample in packed rows, Ulysses over sequence
        shards (in place, no communication)."""
        from ..context_parallel import apply_sequence_sharded_attention, is_sharded
        from ..tensor_parallel import shard_language_model, shard_vision_tower

        for name, modules in self.encoder_modules().items():
            if groups[name].is_member and cfg.stages[name].tp > 1:
                for module in modules:
                    shard_vision_tower(module, groups[name].tp, name, plans=self.tp_plans)  # any encoder: plans are per class
        language = cfg.stages["language"]
        if groups["language"].is_member and language.tp > 1:
            # The language stage embeds only its own sequence chunk (context_parallel.sequence):
            # under sequence parallelism the decoder's input is already split.
            shard_language_model(self.model, groups["language"].tp,
                                 sequence_parallel=language.sequence_parallel, split_input=False,
                                 plans=self.tp_plans)
        if groups["language"].is_member and cfg.packed and self.packed_attention(cfg.packed_attention) == PER_SAMPLE:
            apply_per_sample_attention(self.model.get_decoder())  # before the shards' wrapper, which calls it
        if groups["language"].is_member and cfg.packed:
            self.separate_packed_samples(self.model.get_decoder())
        if groups["language"].is_member and is_sharded(language):
            apply_sequence_sharded_attention(self.model.get_decoder(), groups["language"].cp)

    def separate_packed_samples(self, decoder: nn.Module) -> None:
        """Keep the samples of a packed row apart in what attention does not cover: a family whose
        decoder layers carry state along the sequence (Qwen3.5's Gated DeltaNet) makes them restart
        at every sample (in place). Here nothing: attention alone mixes positions, and packing keeps
        it per sample (models/per_sample_attention.py, models/packing.py)."""

    def language_cost(self, tokens: int) -> int:
        """One decoder layer's work on a sample of `tokens` tokens (packed batching balances it,
        step/packing.py): linear layers and attention over the sample itself."""
        width = getattr(self, "_language_width", None)
        if width is None:  # read once: config attribute reads are slow, and the plan calls this per sample
            text = getattr(self.model.config, "text_config", self.model.config)
            width = self._language_width = (text.hidden_size, text.intermediate_size)
        return transformer_cost(tokens, tokens, *width)

    def packed_attention(self, choice: str | None = None) -> str:
        """How the language stage attends inside packed rows for `hetero_parallel.packed_attention`
        = choice (models/per_sample_attention.py): "per_sample" (sdpa or eager called per sample),
        "row_mask" (the whole row under the block-diagonal mask) or "kernel" (flash-attention varlen,
        flex attention: the model's kernel scores each sample alone)."""
        text = getattr(self.model.config, "text_config", self.model.config)
        return packed_attention_mode(text, choice)

    def dense_rows(self, choice: str | None = None) -> bool:
        """Whether packed rows are scored whole (ROW_MASK: a row of n samples pays the attention of
        their total length), so that packed batching cuts them to cost that least (step/rows.py)."""
        return self.packed_attention(choice) == ROW_MASK

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
        """The encoder's work for an image of `rows` boundary rows (models/item_cost.py transformer_cost)."""
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
        """Reject a sample whose image fields disagree with its placeholders (before any collective),
        a media field this family does not take (MEDIA_FIELDS), and padding inside a sample."""
        for key in ("input_ids", "labels"):
            if key not in sample:
                raise ValueError(f"sample {index}: missing '{key}'")
        for key in sample:
            if key in MEDIA_FIELDS and key not in self.SAMPLE_FIELDS:
                raise ValueError(
                    f"sample {index}: '{key}' is not a field {type(self.model).__name__} takes here (its samples take "
                    f"{', '.join(self.SAMPLE_FIELDS)}, as its processor emits them); drop it, or use a family that "
                    f"encodes it")
        mask = sample.get("attention_mask")
        if torch.is_tensor(mask) and not bool(mask.bool().all()):
            raise ValueError(
                f"sample {index}: attention_mask marks {int((~mask.bool()).sum())} padding token(s) inside the sample; "
                f"hand samples without padding (the engine pads each stage's share itself), or a collated batch "
                f"through ds_hetero.data.split_collated")
        if sample["input_ids"].shape != sample["labels"].shape:
            raise ValueError(
                f"sample {index}: input_ids {tuple(sample['input_ids'].shape)} and labels "
                f"{tuple(sample['labels'].shape)} differ in shape"
            )
