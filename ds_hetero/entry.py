"""`ds_hetero.initialize`: the config read, planned ("auto"), parsed and checked once, then the engine built.

    engine = ds_hetero.initialize(model, "ds_config.json", training_data=dataset)

Order, the same on every rank: the model's adapter and its weights' headers, the DeepSpeed config
read once, an "auto" section planned (rank 0 plans and broadcasts: planner/auto.py), the
`hetero_parallel` section parsed for the world size and checked with the checks `ds-hetero
validate` runs (validation.py), all before the first collective of the engine; then the
default process group with the config's timeout, then the engine (engine.py). The engine takes
the parsed config and never imports the planner; the planner never imports the engine: entry
hands it the trial runner (trial_runner.py) for `"trial"`.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Mapping

import torch
import torch.distributed as dist

from .config import DEFAULT_TIMEOUT_S, HeteroConfig, parse_config, read_ds_config
from .config.trainer_only import refuse_trainer_auto
from .engine import HeteroEngine
from .families import adapter_for, known_encoder_stages
from .planner.auto import resolve_auto
from .reporting.startup import PhaseClock
from .validation import check_all
from .tensor_parallel.lora_checks import check_lora
from .topology.distributed import ensure_distributed
from .throughput.meter import ThroughputMeter
from .trial_runner import trials_in_process
from .weights import open_weights


def base_model(model: torch.nn.Module) -> torch.nn.Module:
    """The Hugging Face model inside a PEFT `PeftModel` (its LoRA layers injected in place); others as given."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) and type(model).__name__.startswith("Peft") else model


def prepare_config(model: torch.nn.Module, config: str | os.PathLike | Mapping[str, Any], adapter=None,
                   has_client_optimizer: bool = False) -> HeteroConfig:
    """The parsed, checked config for this world, joining the default process group on the way.

    The world size comes from the launcher's environment when no process group exists yet, so
    a bad config raises on every rank before any rendezvous or collective.
    """
    clock = PhaseClock()  # startup lines (reporting/startup.py)
    ds = read_ds_config(config)
    # the optimizer's "auto" too: DeepSpeed builds it from this JSON as written (config/trainer_only.py)
    refuse_trainer_auto(ds, as_written=True)
    ds = resolve_auto(model, ds, adapter, has_client_optimizer, run_trials=trials_in_process)
    if dist.is_initialized():
        world = dist.get_world_size()
    else:
        world = int(os.environ.get("WORLD_SIZE", "0")) or ensure_distributed(DEFAULT_TIMEOUT_S)[1]
    cfg = parse_config(ds, world, known_encoder_stages())
    check_all(cfg, model, has_client_optimizer, adapter)
    check_lora(model, adapter or adapter_for(model), cfg)  # PEFT LoRA layers (tensor_parallel/lora.py)
    ensure_distributed(cfg.timeout_s)  # the default group waits as long as the stages' groups do
    clock.done("config checked, default process group joined")
    return cfg


def initialize(
    model: torch.nn.Module,
    config: str | os.PathLike | Mapping[str, Any],
    training_data: Any = None,
    collate_fn: Callable[[list[Any]], list[dict[str, Any]]] | None = None,
    *,
    optimizer: Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer] | None = None,
    seed: int = 0,
    weights: str | os.PathLike | None = None,
) -> HeteroEngine:
    """Build a HeteroEngine (see its docstring for the arguments)."""
    model = base_model(model)  # a PEFT model trains through its base model, LoRA layers in place
    adapter = adapter_for(model)
    checkpoint = open_weights(model, weights)  # headers only; None for a fully built model
    cfg = prepare_config(model, config, adapter, optimizer is not None)
    shapes = ThroughputMeter.shapes_of(model, cfg, adapter)  # on the whole model: before the stages cut it
    engine = HeteroEngine(model, cfg, training_data, collate_fn, optimizer=optimizer, seed=seed,
                          adapter=adapter, checkpoint=checkpoint)
    engine.throughput = ThroughputMeter.build(shapes, cfg, engine.device, engine.stages.dtype,
                                              {s.name: s.trains for s in engine.stages})
    return engine
