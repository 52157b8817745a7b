"""A DeepSpeed config as the HF Trainer or Accelerate prepared it -> the config ds_hetero builds from.

Both fill their own values into the DeepSpeed config before ds_hetero sees it: the Trainer
replaces "auto" by `TrainingArguments` values (`HfTrainerDeepSpeedConfig.trainer_config_process`,
the same filling as its DeepSpeed integration) and Accelerate inserts
`gradient_accumulation_steps`. `train_micro_batch_size_per_gpu` and `gradient_accumulation_steps`
are per stage in ds_hetero (derived from the global batch, each stage's dp and
`hetero_parallel.micro_batches`), so they go back to what the user wrote; everything else keeps
the filled value (batch size, optimizer lr / betas / eps / weight decay, clipping, dtypes).
"""

from __future__ import annotations

import copy
from typing import Any, Mapping

from ..config import DERIVED_BATCH_KEYS, SECTION, read_ds_config
from ..errors import HeteroConfigError
from .inline import with_inline_section


def restore_derived_keys(filled: Mapping[str, Any], original: Mapping[str, Any]) -> dict[str, Any]:
    cfg = copy.deepcopy(dict(filled))
    for key in DERIVED_BATCH_KEYS:
        if key in original:
            cfg[key] = original[key]
        else:
            cfg.pop(key, None)
    return cfg


def require_hetero_section(config: Mapping[str, Any], where: str) -> None:
    if SECTION not in config:
        raise HeteroConfigError(
            SECTION, f"{where} needs a DeepSpeed config with a '{SECTION}' section (see ds_configs/"
            f"llava_colocated.json), or the file DS_HETERO_PARALLEL names holding it (DeepSpeed settings inline "
            f"in an Accelerate YAML or a dict); without one, use the stock entry point")


def is_derived_mismatch(line: str) -> bool:
    """A line of the Trainer's mismatch list about a key ds_hetero derives per stage."""
    return any(f"ds {key}=" in line for key in DERIVED_BATCH_KEYS)


def trainer_conflicts(args, original: Mapping[str, Any]) -> list[str]:
    """What the DeepSpeed config and TrainingArguments disagree on, each naming both values."""
    problems = []
    hf_config = getattr(args, "hf_deepspeed_config", None)
    # The Trainer's own comparison (made when TrainingArguments was built, raised only at train()):
    # the per-device micro batch and accumulation are ds_hetero's per-stage business, checked below.
    for line in getattr(hf_config, "mismatches", []):
        if not is_derived_mismatch(line):
            problems.append(line.lstrip("- "))
    if args.gradient_accumulation_steps != 1:
        problems.append(
            f"TrainingArguments gradient_accumulation_steps={args.gradient_accumulation_steps}: one Trainer step is "
            f"one ds_hetero optimizer step over the global batch; set gradient_accumulation_steps=1 and "
            f"accumulate with {SECTION}.micro_batches in the DeepSpeed config (now "
            f"{original.get(SECTION, {}).get('micro_batches', 1)})")
    if "scheduler" in original:
        problems.append(
            f"the DeepSpeed config has a 'scheduler' section ({original['scheduler'].get('type', '?')}): under the "
            f"Trainer the learning rate belongs to TrainingArguments (lr_scheduler_type="
            f"{getattr(args.lr_scheduler_type, 'value', args.lr_scheduler_type)}, warmup); remove the section")
    return problems


def trainer_ds_config(args, plugin=None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(config for ds_hetero, the user's config as written); raises on every conflict at once.

    The DeepSpeed config is `TrainingArguments.deepspeed` (a JSON path or a dict, ms-swift's
    `--deepspeed zero3` too) or, under `accelerate launch` with DeepSpeed settings inline in the YAML,
    the Accelerate plugin's; `hetero_parallel` may come from `DS_HETERO_PARALLEL` (inline.py).
    """
    if args.deepspeed is not None:
        original = read_ds_config(args.deepspeed)
    elif plugin is not None:
        original = read_ds_config(plugin.deepspeed_config)
    else:
        raise HeteroConfigError(
            "TrainingArguments.deepspeed", "a heterogeneous Trainer needs DeepSpeed: TrainingArguments(deepspeed=<"
            "DeepSpeed JSON path or dict>) or `accelerate launch` with a DeepSpeed config, and a hetero_parallel "
            "section in it or in the file DS_HETERO_PARALLEL names")
    original = with_inline_section(original)
    require_hetero_section(original, "a heterogeneous Trainer (ds_hetero.hetero(...))")
    problems = trainer_conflicts(args, original)
    if problems:
        raise HeteroConfigError(
            "TrainingArguments.deepspeed", "the DeepSpeed config conflicts with TrainingArguments:\n  - "
            + "\n  - ".join(problems) + "\nSet the DeepSpeed values to \"auto\" to take them from TrainingArguments.")
    filled = args.hf_deepspeed_config.config
    cfg = restore_derived_keys(filled, original)
    cfg[SECTION] = original[SECTION]  # given inline, the Trainer's filled copy lacks it
    return cfg, original


def fill_trainer_auto(config: Mapping[str, Any], world_size: int, per_device_train_batch_size: int | None = None,
                      gradient_accumulation_steps: int = 1, max_grad_norm: float = 1.0) -> dict[str, Any]:
    """The values the HF Trainer would put for a Trainer-style "auto" DeepSpeed JSON, for `ds-hetero validate`.

    The Trainer fills `train_batch_size` from per_device_train_batch_size x world size x accumulation
    and `gradient_clipping` from max_grad_norm (`HfTrainerDeepSpeedConfig.trainer_config_process`);
    the per-stage batch keys may stay "auto" (ds_hetero derives them) and the others ("auto"
    optimizer, precision, bucket values) are DeepSpeed's, not checked here.
    """
    cfg = copy.deepcopy(dict(config))
    if cfg.get("train_batch_size") == "auto":
        if per_device_train_batch_size is None:
            raise HeteroConfigError(
                "train_batch_size", '"auto" (the Trainer fills it from TrainingArguments): give the batch to check '
                "with --per-device-train-batch-size N (the global batch is N x world size)")
        if gradient_accumulation_steps != 1:
            raise HeteroConfigError(
                "gradient_accumulation_steps", f"{gradient_accumulation_steps}: one Trainer step is one ds_hetero "
                f"optimizer step; accumulate with {SECTION}.micro_batches")
        cfg["train_batch_size"] = per_device_train_batch_size * world_size
    if cfg.get("gradient_clipping") == "auto":
        cfg["gradient_clipping"] = max_grad_norm
    return cfg
