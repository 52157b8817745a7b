"""Validation of the `hetero_parallel` section: a pure function of the config and the world size.

Every rank raises the same `HeteroConfigError` before any collective (schema.py says what the
section holds).
"""

from __future__ import annotations

import copy
import math
import os
from types import MappingProxyType
from typing import Any, Mapping, Sequence

from ..errors import HeteroConfigError
from .batch_divisors import check_global_batch, stage_divisors
from .batching import parse_language_batching, parse_packed_attention
from .data_keys import parse_data_keys
from .pipeline_keys import parse_pipeline
from .ranks import assign_ranks
from .read import read_ds_config
from .stage_options import ZERO_STAGES, parse_stage_options
from .trainer_only import refuse_trainer_auto
from .schema import (BALANCES, DEFAULT_TIMEOUT_S, DERIVED_BATCH_KEYS, LANGUAGE, MAX_TIMEOUT_S,
                     PLACEMENTS, SECTION, SECTION_KEYS, STAGE_KEYS, HeteroConfig)


def load_config(source: str | os.PathLike | Mapping[str, Any], world_size: int,
                encoder_stages: Sequence[str] = ()) -> HeteroConfig:
    """Read and validate a DeepSpeed config with a `hetero_parallel` section for `world_size` ranks;
    `encoder_stages`: the stage names the model families have (`ds_hetero.load_config` passes them)."""
    ds = read_ds_config(source)
    return parse_config(ds, world_size, encoder_stages)


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


def parse_config(ds: Mapping[str, Any], world_size: int, encoder_stages: Sequence[str] = ()) -> HeteroConfig:
    """The parsed config; HeteroConfigError naming the field. `encoder_stages`: the encoder stage names a
    config may use (every model family's: families/ `known_encoder_stages`); empty, a name is checked
    later, against the model (validation.py)."""
    world_size = _positive_int(world_size, "world_size")
    if SECTION not in ds:
        raise HeteroConfigError(SECTION, "missing; add a top-level \"hetero_parallel\" section with \"stages\"")
    section = ds[SECTION]
    if not isinstance(section, Mapping):
        raise HeteroConfigError(SECTION, f"must be a mapping, got {type(section).__name__}")
    _check_known_keys(section, SECTION_KEYS, SECTION)

    placement = section.get("placement", "colocated")
    if placement not in PLACEMENTS:
        raise HeteroConfigError(f"{SECTION}.placement", f"got {placement!r}; valid values are {', '.join(PLACEMENTS[:-1])} or {PLACEMENTS[-1]}")
    micro_batches = _positive_int(section.get("micro_batches", 1), f"{SECTION}.micro_batches")
    timeout_s = section.get("timeout_s", DEFAULT_TIMEOUT_S)
    if (isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not timeout_s > 0
            or not timeout_s <= MAX_TIMEOUT_S):
        raise HeteroConfigError(
            f"{SECTION}.timeout_s", f"must be a positive number of seconds up to {MAX_TIMEOUT_S:g} (7 days), "
            f"got {timeout_s!r}")
    refuse_trainer_auto(ds)
    _check_gradient_clipping(ds)
    _check_zero_stage(ds)

    if "train_batch_size" not in ds:
        raise HeteroConfigError(
            "train_batch_size", "missing; set it to the global batch (samples per optimizer step, all ranks together)"
        )
    global_batch = _positive_int(ds["train_batch_size"], "train_batch_size", " (the global batch)")

    specs = _stage_specs(section, placement, encoder_stages)
    layouts = assign_ranks(specs, placement, world_size)

    balance = section.get("balance", "tokens")
    if balance not in BALANCES:
        raise HeteroConfigError(f"{SECTION}.balance", f"got {balance!r}; valid values are {' or '.join(BALANCES)}")
    encoder_mbs = _encoder_micro_batches(specs, micro_batches, placement)
    encoder_balance = _encoder_balance(specs, balance)
    language_batching, max_tokens = parse_language_batching(section)
    packed_attention = parse_packed_attention(section, language_batching)
    data_workers, prefetch_steps = parse_data_keys(section)

    balance_of = {name: encoder_balance.get(name, balance) for name in layouts if name != LANGUAGE}
    check_global_batch(global_batch, stage_divisors(layouts, micro_batches, encoder_mbs, balance_of))
    _check_derived_batch_keys(ds, global_batch // (layouts[LANGUAGE].dp * micro_batches), micro_batches)

    return HeteroConfig(
        placement=placement,
        micro_batches=micro_batches,
        global_batch_size=global_batch,
        world_size=world_size,
        stages=MappingProxyType(layouts),
        ds_config=MappingProxyType(copy.deepcopy(dict(ds))),
        timeout_s=float(timeout_s),
        balance=balance,
        encoder_micro_batches=MappingProxyType(encoder_mbs),
        encoder_balance=MappingProxyType(encoder_balance),
        options=MappingProxyType({name: spec["options"] for name, spec in specs.items()}),
        pp_layers=specs[LANGUAGE]["pp_layers"],
        language_batching=language_batching,
        max_tokens_per_micro_batch=max_tokens,
        packed_attention=packed_attention,
        data_workers=data_workers,
        prefetch_steps=prefetch_steps,
    )


def _encoder_balance(specs: dict[str, dict[str, Any]], default: str) -> dict[str, str]:
    """`stages.<encoder>.balance`: how that encoder's items go to its dp ranks (default: `balance`)."""
    out = {}
    for name, spec in specs.items():
        value = spec.get("balance")
        if value is None:
            continue
        field = f"{SECTION}.stages.{name}.balance"
        if name == LANGUAGE:
            raise HeteroConfigError(field, "applies to encoder stages only (the language stage takes its samples "
                                    "by position); remove it")
        if value not in BALANCES:
            raise HeteroConfigError(field, f"got {value!r}; valid values are {' or '.join(BALANCES)}")
        if value != default:
            out[name] = value
    return out


def _encoder_micro_batches(specs: dict[str, dict[str, Any]], micro_batches: int, placement: str) -> dict[str, int]:
    """`stages.<encoder>.micro_batches`: fewer, larger encoder passes than the language stage's.

    Colocated: it must divide `micro_batches` (each encoder pass feeds a whole number of language
    micro-batches). Disaggregated: the 1F1B pipeline's unit is the micro-batch of both stages,
    so only the global value is accepted.
    """
    out = {}
    for name, spec in specs.items():
        value = spec.get("micro_batches")
        if value is None:
            continue
        field = f"{SECTION}.stages.{name}.micro_batches"
        value = _positive_int(value, field)
        if name == LANGUAGE:
            if value != micro_batches:
                raise HeteroConfigError(
                    field, f"got {value}; the language stage's micro-batches are {SECTION}.micro_batches "
                    f"({micro_batches}): remove this key or set {SECTION}.micro_batches")
            continue
        if placement != "colocated" and value != micro_batches:
            raise HeteroConfigError(
                field, f"got {value}, but placement \"{placement}\" pipelines encoder and language "
                f"micro-batches one for one (1F1B), so an encoder takes {SECTION}.micro_batches ({micro_batches}) "
                "passes; remove the key or use placement \"colocated\"")
        if micro_batches % value:
            raise HeteroConfigError(
                field, f"got {value}, which does not divide {SECTION}.micro_batches ({micro_batches}): each "
                f"encoder pass must feed a whole number of language micro-batches; use a divisor of {micro_batches}")
        if value != micro_batches:
            out[name] = value
    return out


def _stage_specs(section: Mapping[str, Any], placement: str,
                 encoder_stages: Sequence[str]) -> dict[str, dict[str, Any]]:
    stages = section.get("stages")
    field = f"{SECTION}.stages"
    if stages is None:
        raise HeteroConfigError(field, 'missing; give e.g. {"vision": {"tp": 1, "dp": 4}, "language": {"tp": 2, "dp": 2}}')
    if not isinstance(stages, Mapping) or not stages:
        raise HeteroConfigError(field, "must be a non-empty mapping from stage name to its layout")
    names = (*encoder_stages, LANGUAGE)
    for name in stages:
        if encoder_stages and name not in names:
            raise HeteroConfigError(f"{field}.{name}", f"unknown stage name; valid names are {', '.join(names)}")
    if LANGUAGE not in stages:
        raise HeteroConfigError(f"{field}.{LANGUAGE}", "missing; every model has a language stage")
    if len(stages) < 2:
        raise HeteroConfigError(field, "needs at least one encoder stage (the model's, e.g. vision) besides language")

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
            "micro_batches": raw.get("micro_batches"),
            "balance": raw.get("balance"),
            "options": parse_stage_options(raw, sfield),
        }
        spec["pp"], spec["pp_layers"] = parse_pipeline(name, raw, _positive_int)
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
        spec["ep"] = _expert_parallel(name, raw, spec, sfield)
        if spec["ranks"] is not None:
            spec["ranks"] = _rank_list(spec["ranks"], f"{sfield}.ranks")
        specs[name] = spec
    return specs


def _expert_parallel(name: str, raw: Mapping[str, Any], spec: Mapping[str, Any], sfield: str) -> int:
    """`stages.language.ep`: a divisor of the stage's cp x dp (the experts are folded into those
    ranks; attention keeps tp). What the model must allow (its expert count) is checked with the
    model (expert_parallel/checks.py)."""
    ep = _positive_int(raw.get("ep", 1), f"{sfield}.ep")
    if ep > 1 and name != LANGUAGE:
        raise HeteroConfigError(f"{sfield}.ep", "expert parallelism applies to the language stage only; use ep 1")
    if (spec["cp"] * spec["dp"]) % ep:
        sizes = [d for d in range(1, spec["cp"] * spec["dp"] + 1) if (spec["cp"] * spec["dp"]) % d == 0]
        raise HeteroConfigError(
            f"{sfield}.ep", f"got {ep}, which does not divide cp x dp = {spec['cp'] * spec['dp']} (the experts are "
            f"sharded over ep ranks carved out of the dp x cp ranks; attention keeps tp); use one of {sizes}")
    return ep


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



def _check_gradient_clipping(ds: Mapping[str, Any]) -> None:
    """A finite number >= 0 (0: off). DeepSpeed itself would take NaN, which silently turns
    clipping off, and a string would fail later with a bare float() error."""
    value = ds.get("gradient_clipping", 0.0)
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) and value >= 0
    if not ok:
        raise HeteroConfigError(
            "gradient_clipping", f"must be a finite number >= 0 (the all-stage gradient norm to clip to; "
            f"0 turns clipping off), got {value!r}")


def _check_zero_stage(ds: Mapping[str, Any]) -> None:
    """`zero_optimization.stage`: 0-3, an int (every stage's engine without its own `zero_stage` runs it;
    `HeteroConfig.zero_stage_of` would read 1.5 as 1)."""
    section = ds.get("zero_optimization")
    if section is None:
        return
    if not isinstance(section, Mapping):
        raise HeteroConfigError("zero_optimization", f'must be a mapping such as {{"stage": 1}}, got {section!r}')
    value = section.get("stage", 0)
    if isinstance(value, bool) or not isinstance(value, int) or value not in ZERO_STAGES:
        raise HeteroConfigError("zero_optimization.stage", f"must be a ZeRO stage 0, 1, 2 or 3, got {value!r}")


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
