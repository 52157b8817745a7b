"""Accelerate as the launcher, config and tracker host; ds_hetero builds and steps the engines.

    accelerator = Accelerator(log_with="tensorboard", project_dir="runs")   # under `accelerate launch
    engine = ds_hetero.accelerate.prepare(accelerator, model, training_data=data)  # --config_file <yaml>`
    for step in range(steps):
        result = engine.train_batch()
        ds_hetero.accelerate.log_step(accelerator, engine, result, step)
    accelerator.save_state("ckpt")            # ds_hetero's per-stage checkpoint, via a save hook

Why not `accelerator.prepare(model)`: Accelerate has no extension point for engine creation
(one whole-model DeepSpeedEngine per prepare call, no mpu, dataloaders sharded by world rank),
see shared/reference/hf-trainer-accelerate.md. What Accelerate keeps: the launch, its process
state, the DeepSpeed config (the YAML's `deepspeed_config_file`, the single source: Accelerate
itself refuses a YAML that also sets mixed precision, ZeRO stage, accumulation or clipping),
trackers, and `save_state` / `load_state`, to which `prepare` attaches the engine's checkpoint
through Accelerate's pre-hooks (they run on every rank).
"""

from __future__ import annotations

import os
from typing import Any, Callable

import torch.distributed as dist

from ..config import SECTION, read_ds_config
from ..errors import HeteroConfigError
from ..result import StepResult
from .ds_config import require_hetero_section, restore_derived_keys
from .inline import with_inline_section
from .metrics import StepMetrics


# Accelerate config fields the DeepSpeed JSON owns: field -> (its environment variable, the JSON key)
JSON_OWNED = {
    "mixed_precision": ("ACCELERATE_MIXED_PRECISION", "bf16.enabled"),
    "gradient_accumulation_steps": ("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "hetero_parallel.micro_batches"),
    "gradient_clipping": ("ACCELERATE_GRADIENT_CLIPPING", "gradient_clipping"),
    "zero_stage": ("ACCELERATE_DEEPSPEED_ZERO_STAGE", "zero_optimization.stage"),
    "offload_optimizer_device": ("ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE", "zero_optimization.offload_optimizer"),
    "offload_param_device": ("ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE", "zero_optimization.offload_param"),
}


def check_launch_environment(environ=os.environ) -> None:
    """Under `accelerate launch`: a YAML that sets what the DeepSpeed JSON owns is an error naming the field.

    Accelerate refuses it too, inside `Accelerator()`, but with a list of every field it could have
    been; this names the ones the YAML actually set, with their values and the JSON key to use.
    Runs when ds_hetero.accelerate is imported, so before the script builds its Accelerator.
    """
    json_file = environ.get("ACCELERATE_DEEPSPEED_CONFIG_FILE", "none")
    if json_file == "none":
        return
    set_in_yaml = set(environ.get("ACCELERATE_CONFIG_DS_FIELDS", "").split(","))
    bad = [f"{field}={environ.get(var, '?')} (use {key} in the JSON)"
           for field, (var, key) in JSON_OWNED.items() if field in set_in_yaml]
    if bad:
        raise HeteroConfigError(
            "deepspeed_config_file", f"the accelerate config sets {', '.join(bad)}, but it names the DeepSpeed JSON "
            f"{json_file}, which owns these settings; remove them from the accelerate YAML")


check_launch_environment()


def _user_config(plugin) -> dict[str, Any]:
    """The DeepSpeed config as the user wrote it (the plugin inserts gradient_accumulation_steps=1)."""
    path = os.environ.get("ACCELERATE_DEEPSPEED_CONFIG_FILE")
    if path and path != "none" and os.path.isfile(path):
        return read_ds_config(path)
    written = dict(plugin.deepspeed_config)
    if written.get("gradient_accumulation_steps") == 1:
        written.pop("gradient_accumulation_steps")
    return written


def prepare(accelerator, model, training_data: Any = None,
            collate_fn: Callable[[list[Any]], list[dict[str, Any]]] | None = None, **kwargs):
    """Build the HeteroEngine from the accelerator's DeepSpeed config; hook save_state / load_state.

    Every rank calls it. kwargs go to `ds_hetero.initialize` (optimizer factory, seed).
    `training_data` goes to the engine's own loader, as under the launcher: a dataset with a length index
    (SFTDataset) is prepared on the boundary group there, and each rank reads only its stages' rows of
    each step, ahead of it with `hetero_parallel.data_workers` (data/prefetch.py); `result.data_wait`.
    """
    from ..entry import initialize

    check_launch_environment()
    plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    if plugin is None:
        raise HeteroConfigError(
            "distributed_type", "the Accelerator has no DeepSpeed plugin: launch with an accelerate config whose "
            "distributed_type is DEEPSPEED and whose deepspeed_config.deepspeed_config_file names a DeepSpeed JSON "
            f"with a '{SECTION}' section (e.g. ds_configs/accelerate_colocated.yaml); not Accelerator(cpu=True), "
            "which drops DeepSpeed")
    if dist.is_initialized() and accelerator.num_processes != dist.get_world_size():
        raise HeteroConfigError(
            "num_processes", f"Accelerate sees {accelerator.num_processes} process(es), torch.distributed "
            f"{dist.get_world_size()}: on CPU create `accelerate.PartialState(backend='gloo')` before `Accelerator()`")
    if accelerator.gradient_accumulation_steps != 1:
        raise HeteroConfigError(
            "gradient_accumulation_steps", f"the Accelerator accumulates {accelerator.gradient_accumulation_steps} "
            f"steps, but one train_batch is a whole optimizer step; set it to 1 and use {SECTION}.micro_batches")
    written = with_inline_section(_user_config(plugin))  # DS_HETERO_PARALLEL: the section given inline
    require_hetero_section(written, "ds_hetero.accelerate.prepare")
    config = restore_derived_keys(plugin.deepspeed_config, written)
    config[SECTION] = written[SECTION]
    engine = initialize(model, config, training_data=training_data, collate_fn=collate_fn, **kwargs)
    accelerator.register_save_state_pre_hook(lambda models, weights, output_dir: engine.save_checkpoint(output_dir))
    accelerator.register_load_state_pre_hook(lambda models, input_dir: engine.load_checkpoint(input_dir))
    engine.step_metrics = StepMetrics()
    return engine


def log_step(accelerator, engine, result: StepResult, step: int | None = None, every: int = 1) -> dict[str, float]:
    """Log loss, grad_norm and the per-stage metrics (reduced over ranks) to the accelerator's trackers.

    Every rank calls it after every step (the reduction is collective once per `every` steps);
    returns what was logged (empty between logs).
    """
    metrics = getattr(engine, "step_metrics", None)
    if metrics is None:
        metrics = engine.step_metrics = StepMetrics()
    metrics.add(result)
    if metrics.steps < every:
        return {}
    values = {"loss": result.loss, "grad_norm": result.grad_norm, **metrics.reduce(engine.groups.boundary)}
    accelerator.log(values, step=step)
    return values
