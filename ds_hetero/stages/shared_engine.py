"""One DeepSpeed engine for stages that run on the same ranks in the same layout.

Where every stage is held by the same ranks with the same tp, cp, dp (no pipeline, no experts
sharded) and the same ZeRO stage 0 (fp32) or 1, a second engine buys nothing and costs a second
gradient reduction, a second ZeRO all-gather and a second optimizer step every step (about 8%
of a step at the quick benchmark sizes, benchmarks/bench_overhead.py --two-engines). Such stages
then share one engine over `SharedStages`, a module holding each stage's module under its name:

- the forward of stage `name` is `engine(name, ...)`: DeepSpeed's forward, then that stage's module;
- the engine takes one accumulation step per optimizer step (its micro-batch is the rank's whole
  share of the global batch); each stage's passes scale its own backward (Stage.backward), as
  the stage's own engine would have with `gradient_accumulation_steps` = its passes;
- a step's backward passes (encoder and language, every micro-batch, in the schedule's order)
  run with DeepSpeed's accumulation boundary held off, so no gradient is reduced during them;
  after the last, one `allreduce_gradients()` at the boundary reduces every stage's gradients
  together (`StageSet.reduce_once`). DeepSpeed's pipeline engine drives its ZeRO 0/1 reduction the
  same way (`set_gradient_accumulation_boundary`, `allreduce_gradients`). ZeRO 2 and 3 reduce
  during each backward and keep one engine per stage, as do overlap_comm (it reduces from the
  backward's hooks), offload, a separate `grad_accum_dtype` and bf16/fp16 at ZeRO 0 (their
  gradients accumulate in buffers of DeepSpeed's own);
- the stages' norms are the one engine's, counted once; the step is the one engine's.

Checkpoints keep one folder per stage: the engine's DeepSpeed files go to the folder of its first
stage (the owner), every stage's params.json names its own parameters as the engine's files
do (`stages.<name>.` before the module's name), and the manifest records each stage's owner, so
a checkpoint moves between shared and separate engines like any other change of layout.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from torch import nn

class SharedStages(nn.Module):
    """The modules of the stages that share one engine, by stage name; `forward(name, ...)` runs one."""

    def __init__(self, modules: Mapping[str, nn.Module]):
        super().__init__()
        self.stages = nn.ModuleDict(dict(modules))

    def forward(self, name: str, *args, **kwargs):
        return self.stages[name](*args, **kwargs)


def sharing_stages(cfg, trainable: Mapping[str, Sequence[nn.Parameter]], held: Sequence[str],
                   has_experts: bool) -> tuple[str, ...]:
    """The stages that share one engine (all of them, in config order), or () for one engine each.

    The same on every rank: it reads the config, and which parameters train (set before any rank
    differs). `held`: the stages this rank holds (all of them, where the layouts are equal).
    """
    names = list(cfg.stages)
    if len(names) < 2 or len(held) != len(names):
        return ()
    first = cfg.stages[names[0]]
    if any(_layout_key(cfg.stages[n]) != _layout_key(first) for n in names) or first.pp > 1 or first.ep > 1:
        return ()
    if has_experts or not all(trainable[n] for n in names):  # a frozen stage's engine has no optimizer
        return ()
    configs = [_without_batch_keys(cfg.stage_ds_config(n)) for n in names]
    if any(c != configs[0] for c in configs):
        return ()
    zero = dict(configs[0].get("zero_optimization") or {})
    stage = int(zero.get("stage", 0))
    if stage not in (0, 1) or zero.get("overlap_comm") or _offloads(zero):
        return ()
    if stage == 0 and any(_enabled(configs[0], k) for k in ("bf16", "fp16")):
        return ()  # DeepSpeed's BF16 / FP16 optimizer wrappers keep their own gradient buffers
    if configs[0].get("managed_gradient_accumulation") is False:
        return ()
    if (configs[0].get("data_types") or {}).get("grad_accum_dtype") is not None:
        return ()  # a separate accumulation dtype keeps ZeRO's accumulated gradients in buffers of its own
    return tuple(names)


def shared_ds_config(cfg, names: Sequence[str]) -> dict[str, Any]:
    """The shared engine's DeepSpeed config: the stages' own, with one accumulation step per
    optimizer step (the rank's whole share of the global batch per step)."""
    ds_config = cfg.stage_ds_config(names[0])
    dp = cfg.stages[names[0]].dp
    micro = -(-cfg.global_batch_size // dp)
    ds_config.update(train_micro_batch_size_per_gpu=micro, gradient_accumulation_steps=1,
                     train_batch_size=micro * dp)
    return ds_config


def engine_names(stage) -> dict[int, str]:
    """id(parameter) -> its name in the stage's engine (and so in its DeepSpeed files)."""
    return {id(p): n for n, p in stage.engine.module.named_parameters()}


def _layout_key(layout) -> tuple:
    return (layout.tp, layout.cp, layout.dp, tuple(layout.ranks), layout.sequence_parallel, layout.pp, layout.ep)


def _without_batch_keys(ds_config: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in ds_config.items()
            if k not in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")}


def _enabled(ds_config: dict[str, Any], key: str) -> bool:
    section = ds_config.get(key)
    return isinstance(section, dict) and section.get("enabled") in (True, "auto")


def _offloads(zero: dict[str, Any]) -> bool:
    return any(isinstance(zero.get(k), dict) and zero[k].get("device", "none") not in (None, "none")
               for k in ("offload_optimizer", "offload_param"))
