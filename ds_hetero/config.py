"""The `hetero_parallel` section of a DeepSpeed config: parsing, validation, per-stage DS configs.

The DeepSpeed JSON is the single carrier. DeepSpeed keeps unknown *top-level* keys (and
rejects unknown keys inside its own sections), so the plugin owns one top-level key:

    "train_batch_size": 16,                      # the global batch: samples per optimizer step
    "hetero_parallel": {
        "placement": "colocated",                # or "disaggregated"
        "micro_batches": 2,                      # gradient accumulation steps of every stage
        "timeout_s": 300,                        # a collective that waits longer raises
        "stages": {
            "vision":   {"tp": 1, "dp": 4},
            "language": {"tp": 2, "cp": 1, "dp": 2, "sequence_parallel": false}
        }
    }

`load_config(source, world_size)` validates everything that can be known before any process
group exists and returns a frozen `HeteroConfig`. Validation is a pure function of the config
and the world size, so every rank raises the same `HeteroConfigError` before any collective.
"""

from __future__ import annotations

import copy
import json
import math
import os
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Mapping

from .errors import HeteroConfigError
from .layout import StageLayout

SECTION = "hetero_parallel"
PLACEMENTS = ("colocated", "disaggregated")
LANGUAGE = "language"
ENCODER_STAGES = ("vision", "audio")
STAGE_NAMES = ENCODER_STAGES + (LANGUAGE,)
SECTION_KEYS = ("placement", "micro_batches", "stages", "timeout_s")
DEFAULT_TIMEOUT_S = 300.0  # a collective waiting longer than this raises instead of hanging
MAX_TIMEOUT_S = 7 * 24 * 3600.0  # process-group timeouts are integer milliseconds: keep them finite and sane
STAGE_KEYS = ("tp", "cp", "dp", "ranks", "sequence_parallel")
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
        """Samples per micro-batch on one dp rank of `stage`."""
        return self.global_batch_size // (self.stages[stage].dp * self.micro_batches)

    @property
    def gradient_clipping(self) -> float:
        """The clipping norm for the whole model, all stages together (0 = off).

        DeepSpeed 0.19 defaults `gradient_clipping` to 1.0 when the key is absent; keep that
        default so a config means the same with and without ds_hetero.
        """
        from deepspeed.runtime.constants import GRADIENT_CLIPPING_DEFAULT

        return float(self.ds_config.get("gradient_clipping", GRADIENT_CLIPPING_DEFAULT))

    def stage_ds_config(self, stage: str) -> dict[str, Any]:
        """A deep copy of the DeepSpeed config for one stage's engine.

        Every stage takes `micro_batches` accumulation steps over the same global batch, split
        by its own dp, so the batch keys are per stage. Clipping is turned off in the stage
        engine: an engine would clip by its own stage's norm, while the model's norm spans all
        stages; `gradient_clipping` is applied over all stages by ds_hetero instead. The
        plugin's own section is dropped so the engine sees a plain DeepSpeed config.
        """
        cfg = copy.deepcopy(dict(self.ds_config))
        cfg.pop(SECTION, None)
        cfg["train_batch_size"] = self.global_batch_size
        cfg["train_micro_batch_size_per_gpu"] = self.micro_batch_size(stage)
        cfg["gradient_accumulation_steps"] = self.micro_batches
        cfg["gradient_clipping"] = 0.0
        return cfg


# ----------------------------------------------------------------------------- reading


def read_ds_config(source: str | os.PathLike | Mapping[str, Any]) -> dict[str, Any]:
    """A DeepSpeed config from a dict, a JSON file or a YAML file."""
    if isinstance(source, Mapping):
        return copy.deepcopy(dict(source))
    path = os.fspath(source)
    if os.path.isdir(path):
        raise HeteroConfigError("config", f"{path!r} is a directory; give the path of a DeepSpeed JSON or YAML file")
    if not os.path.isfile(path):
        raise HeteroConfigError("config", f"file {path!r} does not exist; give a DeepSpeed JSON or YAML path or a dict")
    with open(path) as f:
        text = f.read()
    try:
        if path.lower().endswith((".yaml", ".yml")):
            import yaml

            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    except Exception as exc:  # json.JSONDecodeError, yaml.YAMLError
        raise HeteroConfigError("config", f"cannot parse {path!r}: {exc}") from None
    if not isinstance(data, dict):
        raise HeteroConfigError("config", f"{path!r} must hold a mapping at the top level, got {type(data).__name__}")
    return data


def load_config(source: str | os.PathLike | Mapping[str, Any], world_size: int) -> HeteroConfig:
    """Read and validate a DeepSpeed config with a `hetero_parallel` section for `world_size` ranks."""
    ds = read_ds_config(source)
    return parse_config(ds, world_size)


# ----------------------------------------------------------------------------- validation


def _positive_int(value: Any, field: str, hint: str = "") -> int:
    # bool is an int in Python; `"tp": true` is a typo, not a size.
    if isinstance(value, bool) or not isinstance(value, int):
        raise HeteroConfigError(field, f"must be a positive integer, got {value!r} ({type(value).__name__}){hint}")
    if value < 1:
        raise HeteroConfigError(field, f"must be a positive integer, got {value}{hint}")
    return value


def _check_known_keys(mapping: Mapping[str, Any], allowed: tuple[str, ...], field: str) -> None:
    unknown = sorted(set(mapping) - set(allowed))
    if unknown:
        raise HeteroConfigError(f"{field}.{unknown[0]}", f"unknown key; valid keys are {', '.join(allowed)}")


def parse_config(ds: Mapping[str, Any], world_size: int) -> HeteroConfig:
    world_size = _positive_int(world_size, "world_size")
    if SECTION not in ds:
        raise HeteroConfigError(SECTION, "missing; add a top-level \"hetero_parallel\" section with \"stages\"")
    section = ds[SECTION]
    if not isinstance(section, Mapping):
        raise HeteroConfigError(SECTION, f"must be a mapping, got {type(section).__name__}")
    _check_known_keys(section, SECTION_KEYS, SECTION)

    placement = section.get("placement", "colocated")
    if placement not in PLACEMENTS:
        raise HeteroConfigError(f"{SECTION}.placement", f"got {placement!r}; valid values are {' or '.join(PLACEMENTS)}")
    micro_batches = _positive_int(section.get("micro_batches", 1), f"{SECTION}.micro_batches")
    timeout_s = section.get("timeout_s", DEFAULT_TIMEOUT_S)
    if (isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not timeout_s > 0
            or not timeout_s <= MAX_TIMEOUT_S):
        raise HeteroConfigError(
            f"{SECTION}.timeout_s", f"must be a positive number of seconds up to {MAX_TIMEOUT_S:g} (7 days), "
            f"got {timeout_s!r}")
    _check_gradient_clipping(ds)

    if "train_batch_size" not in ds:
        raise HeteroConfigError(
            "train_batch_size", "missing; set it to the global batch (samples per optimizer step, all ranks together)"
        )
    global_batch = _positive_int(ds["train_batch_size"], "train_batch_size", " (the global batch)")

    specs = _stage_specs(section, placement)
    layouts = _assign_ranks(specs, placement, world_size)

    for name, layout in layouts.items():
        per_step = layout.dp * micro_batches
        if global_batch % per_step:
            raise HeteroConfigError(
                "train_batch_size",
                f"{global_batch} is not divisible by stage {name!r} dp x micro_batches = "
                f"{layout.dp} x {micro_batches} = {per_step}; use a multiple of {per_step}",
            )
    _check_derived_batch_keys(ds, global_batch // (layouts[LANGUAGE].dp * micro_batches), micro_batches)

    return HeteroConfig(
        placement=placement,
        micro_batches=micro_batches,
        global_batch_size=global_batch,
        world_size=world_size,
        stages=MappingProxyType(layouts),
        ds_config=MappingProxyType(copy.deepcopy(dict(ds))),
        timeout_s=float(timeout_s),
    )


def _stage_specs(section: Mapping[str, Any], placement: str) -> dict[str, dict[str, Any]]:
    stages = section.get("stages")
    field = f"{SECTION}.stages"
    if stages is None:
        raise HeteroConfigError(field, 'missing; give e.g. {"vision": {"tp": 1, "dp": 4}, "language": {"tp": 2, "dp": 2}}')
    if not isinstance(stages, Mapping) or not stages:
        raise HeteroConfigError(field, "must be a non-empty mapping from stage name to its layout")
    for name in stages:
        if name not in STAGE_NAMES:
            raise HeteroConfigError(f"{field}.{name}", f"unknown stage name; valid names are {', '.join(STAGE_NAMES)}")
    if LANGUAGE not in stages:
        raise HeteroConfigError(f"{field}.{LANGUAGE}", "missing; every model has a language stage")
    if len(stages) < 2:
        raise HeteroConfigError(field, f"needs at least one encoder stage ({', '.join(ENCODER_STAGES)}) besides language")

    specs = {}
    for name, raw in stages.items():
        sfield = f"{field}.{name}"
        if not isinstance(raw, Mapping):
            raise HeteroConfigError(sfield, f'must be a mapping such as {{"tp": 1, "dp": 2}}, got {raw!r}')
        _check_known_keys(raw, STAGE_KEYS, sfield)
        if "dp" not in raw:
            raise HeteroConfigError(f"{sfield}.dp", "missing; give the data-parallel size of the stage")
        spec = {
            "tp": _positive_int(raw.get("tp", 1), f"{sfield}.tp"),
            "cp": _positive_int(raw.get("cp", 1), f"{sfield}.cp"),
            "dp": _positive_int(raw["dp"], f"{sfield}.dp"),
            "sequence_parallel": raw.get("sequence_parallel", False),
            "ranks": raw.get("ranks"),
        }
        if not isinstance(spec["sequence_parallel"], bool):
            raise HeteroConfigError(f"{sfield}.sequence_parallel", f"must be true or false, got {spec['sequence_parallel']!r}")
        if name != LANGUAGE and spec["cp"] != 1:
            raise HeteroConfigError(
                f"{sfield}.cp", f"got {spec['cp']}; context parallelism splits the language sequence only, use cp 1"
            )
        if name != LANGUAGE and spec["sequence_parallel"]:
            raise HeteroConfigError(f"{sfield}.sequence_parallel", "applies to the language stage only; set it to false")
        if spec["sequence_parallel"] and spec["tp"] == 1:
            raise HeteroConfigError(f"{sfield}.sequence_parallel", "needs tp > 1 (it shards activations over tp)")
        if spec["ranks"] is not None:
            spec["ranks"] = _rank_list(spec["ranks"], f"{sfield}.ranks")
        specs[name] = spec
    return specs


def _rank_list(value: Any, field: str) -> tuple[int, ...]:
    if not isinstance(value, (list, tuple)) or not value:
        raise HeteroConfigError(field, f"must be a non-empty list of global ranks, got {value!r}")
    for r in value:
        if isinstance(r, bool) or not isinstance(r, int):
            raise HeteroConfigError(field, f"must hold integers, got {r!r}")
    seen = set()
    for r in value:
        if r in seen:
            raise HeteroConfigError(field, f"rank {r} is listed twice; every rank appears once")
        seen.add(r)
    return tuple(value)


def _assign_ranks(specs: dict[str, dict[str, Any]], placement: str, world_size: int) -> dict[str, StageLayout]:
    sizes = {name: s["tp"] * s["cp"] * s["dp"] for name, s in specs.items()}
    field = f"{SECTION}.stages"

    def explain(name):
        s = specs[name]
        return f"tp x cp x dp = {s['tp']} x {s['cp']} x {s['dp']} = {sizes[name]}"

    for name, spec in specs.items():
        ranks = spec["ranks"]
        if ranks is None:
            continue
        bad = [r for r in ranks if not 0 <= r < world_size]
        if bad:
            raise HeteroConfigError(f"{field}.{name}.ranks", f"rank {bad[0]} is outside the world of {world_size} ranks (0..{world_size - 1})")
        if len(ranks) != sizes[name]:
            raise HeteroConfigError(f"{field}.{name}.ranks", f"lists {len(ranks)} ranks but {explain(name)}; make them agree")

    layouts: dict[str, StageLayout] = {}
    if placement == "colocated":
        everyone = tuple(range(world_size))
        for name, spec in specs.items():
            if sizes[name] != world_size:
                hint = (
                    "; stages on different ranks need placement \"disaggregated\""
                    if spec["ranks"] is not None else ""
                )
                raise HeteroConfigError(
                    f"{field}.{name}",
                    f"{explain(name)} but a colocated stage spans all {world_size} ranks; "
                    f"choose sizes whose product is {world_size}{hint}",
                )
        # Sizes equal the world and ranks are unique and in range, so any explicit "ranks"
        # is a permutation of the world: it only reorders the stage's coordinates.
        for name, spec in specs.items():
            layouts[name] = _layout(name, spec, spec["ranks"] or everyone)
        return layouts

    # Disaggregated: pairwise disjoint rank sets that together cover the world.
    named = {name: set(s["ranks"]) for name, s in specs.items() if s["ranks"] is not None}
    names = list(named)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            common = named[a] & named[b]
            if common:
                raise HeteroConfigError(
                    f"{field}.{b}.ranks",
                    f"shares ranks {sorted(common)} with stage {a!r}; disaggregated stages need disjoint ranks "
                    "(use placement \"colocated\" to put stages on the same ranks)",
                )
    total = sum(sizes.values())
    if total != world_size:
        detail = ", ".join(f"{n} {explain(n)}" for n in specs)
        raise HeteroConfigError(
            field,
            f"disaggregated stages need {total} ranks in all ({detail}) but the world has {world_size}; "
            f"make the stage sizes add up to {world_size}",
        )
    taken = set().union(*named.values()) if named else set()
    free = [r for r in range(world_size) if r not in taken]
    for name, spec in specs.items():  # stages without "ranks" take consecutive free ranks, in listed order
        if spec["ranks"] is None:
            ranks, free = tuple(free[: sizes[name]]), free[sizes[name]:]
        else:
            ranks = spec["ranks"]
        layouts[name] = _layout(name, spec, ranks)
    return layouts


def _layout(name: str, spec: dict[str, Any], ranks: tuple[int, ...]) -> StageLayout:
    return StageLayout(
        name=name, tp=spec["tp"], cp=spec["cp"], dp=spec["dp"], ranks=tuple(ranks),
        sequence_parallel=spec["sequence_parallel"],
    )


def _check_gradient_clipping(ds: Mapping[str, Any]) -> None:
    """A finite number >= 0 (0: off). DeepSpeed itself would take NaN, which silently turns
    clipping off, and a string would fail later with a bare float() error."""
    value = ds.get("gradient_clipping", 0.0)
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) and value >= 0
    if not ok:
        raise HeteroConfigError(
            "gradient_clipping", f"must be a finite number >= 0 (the all-stage gradient norm to clip to; "
            f"0 turns clipping off), got {value!r}")


def _check_derived_batch_keys(ds: Mapping[str, Any], language_micro: int, micro_batches: int) -> None:
    """ds_hetero owns the per-stage batch keys; accept them only where they agree (or are "auto")."""
    expected = {"train_micro_batch_size_per_gpu": language_micro, "gradient_accumulation_steps": micro_batches}
    for key in DERIVED_BATCH_KEYS:
        value = ds.get(key)
        if value is None or value == "auto" or value == expected[key]:
            continue
        raise HeteroConfigError(
            key,
            f"got {value!r}, but ds_hetero derives it per stage from train_batch_size / (dp x micro_batches) "
            f"(language stage: {expected[key]}); remove it or set it to \"auto\"",
        )
