"""The `hetero_parallel` section of a DeepSpeed config: parsing, validation, per-stage DS configs.

The DeepSpeed JSON is the single carrier. DeepSpeed keeps unknown *top-level* keys (and
rejects unknown keys inside its own sections), so the plugin owns one top-level key:

    "train_batch_size": 16,                      # the global batch: samples per optimizer step
    "hetero_parallel": {
        "placement": "colocated",                # or "disaggregated", "mixed" (docs/multi-encoder.md), "first_stage"
        "micro_batches": 2,                      # gradient accumulation steps of every stage
        "timeout_s": 300,                        # a collective that waits longer raises
        "balance": "tokens",                     # encoder images to dp ranks by cost, or "position"
        "language_batching": "samples",          # or "packed": token-balanced packed rows (docs/packing.md)
        "max_tokens_per_micro_batch": null,      # packed: the longest packed row (config/batching.py)
        "packed_attention": null,                # packed under sdpa/eager: "per_sample" (default) or "row_mask"
        "data_workers": 0,                       # processes per rank reading the next steps' samples (data_keys.py)
        "prefetch_steps": 2,                     # steps they read ahead, at most
        "stages": {
            "vision":   {"tp": 1, "dp": 4, "micro_batches": 1},   # encoder passes per step
            "audio":    {"tp": 2, "dp": 2, "balance": "position"}, # per-encoder balance (docs/multi-encoder.md)
            "language": {"tp": 2, "cp": 1, "dp": 2, "sequence_parallel": false,
                         "pp": 1, "pp_layers": null,          # pipeline stages (config/pipeline_keys.py)
                         "ep": 1}                             # expert parallelism (docs/expert-parallel.md)
        }                                        # + recompute, zero_stage, freeze (stage_options.py)
    }

`load_config(source, world_size)` validates everything that can be known before any process
group exists and returns a frozen `HeteroConfig`. Validation is a pure function of the config
and the world size, so every rank raises the same `HeteroConfigError` before any collective.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Mapping

from ..layout import AXES, FOLDED_AXES, StageLayout
from .stage_options import OPTION_KEYS, StageOptions

SECTION = "hetero_parallel"
# mixed: each encoder on the language stage's ranks or on ranks of its own (docs/multi-encoder.md).
# first_stage: every encoder on exactly the ranks of the language's first pipeline stage (any
# layout over them): with the language's tp it is Megatron's single layout, the usual baseline.
PLACEMENTS = ("colocated", "disaggregated", "mixed", "first_stage")
LANGUAGE = "language"
# The encoder stages the model families have (families.known_encoder_stages()), named here so that a config
# is checked without importing the families (torch, transformers); tests/base/test_validate_light.py keeps
# the two equal.
ENCODER_STAGES = ("vision", "audio")
# The encoder stages' names come from the model families (families/ `known_encoder_stages`): parsing is
# given them (parse_config `encoder_stages`); config keeps no list of its own.
SECTION_KEYS = ("placement", "micro_batches", "stages", "timeout_s", "balance", "language_batching",
                "max_tokens_per_micro_batch", "packed_attention", "data_workers", "prefetch_steps")
DEFAULT_TIMEOUT_S = 300.0  # a collective waiting longer than this raises instead of hanging
MAX_TIMEOUT_S = 7 * 24 * 3600.0  # process-group timeouts are integer milliseconds: keep them finite and sane
BALANCES = ("tokens", "position")  # how encoder images go to dp ranks (step/balance.py)
LANGUAGE_BATCHINGS = ("samples", "packed")  # how the language stage cuts its micro-batches (step/packing.py)
# how packed rows are attended under a dense kernel (sdpa, eager): each sample's own causal attention,
# or the whole row under the block-diagonal mask (models/per_sample_attention.py)
PACKED_ATTENTIONS = ("per_sample", "row_mask")
STAGE_KEYS = AXES + FOLDED_AXES + ("ranks", "sequence_parallel", "micro_batches", "balance", "pp_layers") + OPTION_KEYS
# DeepSpeed batch keys that ds_hetero derives per stage.
DERIVED_BATCH_KEYS = ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps")


@dataclass(frozen=True)
class HeteroConfig:
    """A validated heterogeneous-parallel configuration for one world size."""

    placement: str
    micro_batches: int
    global_batch_size: int
    world_size: int
    stages: Mapping[str, StageLayout]  # in the order the config lists them
    ds_config: Mapping[str, Any]  # the whole DeepSpeed config as given (read-only view)
    timeout_s: float = DEFAULT_TIMEOUT_S
    balance: str = "tokens"
    encoder_micro_batches: Mapping[str, int] = dataclasses.field(default_factory=lambda: MappingProxyType({}))
    encoder_balance: Mapping[str, str] = dataclasses.field(default_factory=lambda: MappingProxyType({}))

    def balance_of(self, stage: str) -> str:
        """How `stage`'s items go to its dp ranks: `stages.<name>.balance`, else `balance`."""
        return self.encoder_balance.get(stage, self.balance)

    options: Mapping[str, StageOptions] = dataclasses.field(default_factory=lambda: MappingProxyType({}))

    def options_of(self, stage: str) -> StageOptions:
        """`recompute`, `zero_stage`, `freeze` of `stage` (config/stage_options.py)."""
        return self.options.get(stage, StageOptions())

    def zero_stage_of(self, stage: str) -> int:
        """The ZeRO stage of `stage`'s engine: its `zero_stage`, else `zero_optimization.stage`."""
        own = self.options_of(stage).zero_stage
        if own is not None:
            return own
        section = self.ds_config.get("zero_optimization")
        return int(section.get("stage", 0)) if isinstance(section, Mapping) else 0

    pp_layers: tuple[int, ...] | None = None  # the language's layers per pipeline stage (None: even cut)
    # "samples": each language dp rank takes a contiguous share, padded; "packed": samples go to dp
    # ranks by token cost and are packed into rows (step/packing.py, docs/packing.md)
    language_batching: str = "samples"
    max_tokens_per_micro_batch: int | None = None  # packed: the longest packed row (None: one row per rank)
    # packed under sdpa / eager: "per_sample" or "row_mask"; None: per_sample where the decoder allows it
    packed_attention: str | None = None
    data_workers: int = 0  # worker processes per rank reading its share of the next steps (config/data_keys.py)
    prefetch_steps: int = 2

    @property
    def packed(self) -> bool:
        return self.language_batching == "packed"

    def micro_batches_of(self, stage: str) -> int:
        """Forward/backward passes of `stage` per step (its DeepSpeed gradient_accumulation_steps)."""
        return self.encoder_micro_batches.get(stage, self.micro_batches)

    @property
    def stage_names(self) -> tuple[str, ...]:
        return tuple(self.stages)

    @property
    def language(self) -> StageLayout:
        return self.stages[LANGUAGE]

    @property
    def encoders(self) -> tuple[StageLayout, ...]:
        return tuple(layout for name, layout in self.stages.items() if name != LANGUAGE)

    def stages_of_rank(self, rank: int) -> tuple[str, ...]:
        return tuple(name for name, layout in self.stages.items() if layout.contains(rank))

    def micro_batch_size(self, stage: str) -> int:
        """Samples per micro-batch on one dp rank of `stage`. An encoder with balance "tokens" may
        have more dp ranks than a pass has samples (images are its unit, step/balance.py): then
        this is the nominal ceil(samples of a pass / dp), what its DeepSpeed engine counts."""
        return -(-self.global_batch_size // (self.stages[stage].dp * self.micro_batches_of(stage)))

    @property
    def gradient_clipping(self) -> float:
        """The clipping norm for the whole model, all stages together (0 = off).

        DeepSpeed 0.19 defaults `gradient_clipping` to 1.0 when the key is absent; keep that
        default so a config means the same with and without ds_hetero.
        """
        from deepspeed.runtime.constants import GRADIENT_CLIPPING_DEFAULT

        return float(self.ds_config.get("gradient_clipping", GRADIENT_CLIPPING_DEFAULT))

    def stage_ds_config(self, stage: str, trains: bool = True) -> dict[str, Any]:
        """A deep copy of the DeepSpeed config for one stage's engine.

        Every stage takes `micro_batches` accumulation steps over the same global batch, split
        by its own dp, so the batch keys are per stage. Clipping is turned off in the stage
        engine: an engine would clip by its own stage's norm, while the model's norm spans all
        stages; `gradient_clipping` is applied over all stages by ds_hetero instead. The
        plugin's own section is dropped so the engine sees a plain DeepSpeed config.

        `stages.<name>.zero_stage` replaces `zero_optimization.stage` (the other ZeRO keys are
        shared). A stage that trains nothing (`trains` False: frozen by the config or by the
        model's requires_grad flags) gets no optimizer and ZeRO 0: DeepSpeed refuses an
        optimizer over no parameters, and there is no optimizer state to partition.
        """
        cfg = copy.deepcopy(dict(self.ds_config))
        cfg.pop(SECTION, None)
        # DeepSpeed checks train = micro x accumulation x dp; it only counts samples with it
        cfg["train_batch_size"] = self.micro_batch_size(stage) * self.micro_batches_of(stage) * self.stages[stage].dp
        cfg["train_micro_batch_size_per_gpu"] = self.micro_batch_size(stage)
        cfg["gradient_accumulation_steps"] = self.micro_batches_of(stage)
        cfg["gradient_clipping"] = 0.0
        zero = dict(cfg.get("zero_optimization") or {})
        zero["stage"] = self.zero_stage_of(stage) if trains else 0
        cfg["zero_optimization"] = zero
        if not trains:
            cfg.pop("optimizer", None)
            cfg.pop("scheduler", None)
        return cfg


# ----------------------------------------------------------------------------- reading
