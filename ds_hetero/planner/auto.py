"""`"hetero_parallel": "auto"`: initialize plans the layout, on rank 0, and every rank trains with it.

    "hetero_parallel": "auto"
    "hetero_parallel": {"auto": true, "seq_len": 512, "image_tokens": 256, "machine": "cpu",
                        "memory_gb": 16, "placement": "colocated", "micro_batches": [1, 2],
                        "max_tp": 8, "timeout_s": 300}

`"trial": K` runs the top K runnable candidates for `trial_steps` steps (default 3) inside these
processes before training and trains with the fastest measured: `run_trials`, which the runtime
hands in (entry.py: trial_runner.trials_in_process; the planner never imports the engine). The
ranks agree on the pick from the max-reduced times, so it needs no further broadcast.

Every key but "auto" is optional: seq_len defaults to the model's longest position
(max_position_embeddings capped at 4096), image_tokens to one image (LLaVA; Qwen2-VL needs it),
machine to "cpu" without a GPU and to the profile named after the GPU otherwise (h100, h200,
a100; h100 when unknown). Rank 0 plans (the same ranking as `ds-hetero plan`), broadcasts the
chosen DeepSpeed config (or its error: every rank then raises the same HeteroConfigError, so no
rank waits in a collective), logs the choice, and `initialize` continues as if the config had
named that layout.
"""

from __future__ import annotations

from typing import Any, Mapping

from ..config import SECTION, read_ds_config
from ..errors import HeteroConfigError
from .trials import RunTrials

AUTO_KEYS = ("auto", "seq_len", "image_tokens", "rows", "machine", "memory_gb", "placement", "micro_batches",
             "max_tp", "timeout_s", "trial", "trial_steps")


def is_auto(section: Any) -> bool:
    return section == "auto" or (isinstance(section, Mapping) and section.get("auto") is True)


def auto_options(section: Any) -> dict[str, Any]:
    """The constraints of an auto section, checked (HeteroConfigError naming the key)."""
    opts = {} if section == "auto" else dict(section)
    unknown = sorted(set(opts) - set(AUTO_KEYS))
    if unknown:
        raise HeteroConfigError(f"{SECTION}.{unknown[0]}", f"unknown key with auto; valid keys are {', '.join(AUTO_KEYS)}")
    for key in ("seq_len", "image_tokens", "max_tp", "trial", "trial_steps"):
        v = opts.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < (0 if key in ("image_tokens", "trial")
                                                                                      else 1)):
            raise HeteroConfigError(f"{SECTION}.{key}", f"must be a positive integer, got {v!r}")
    if opts.get("trial_steps") is not None and opts["trial_steps"] < 2:
        raise HeteroConfigError(f"{SECTION}.trial_steps", "must be at least 2 (the first step is not timed)")
    mb = opts.get("micro_batches")
    if mb is not None:
        opts["micro_batches"] = tuple(mb) if isinstance(mb, (list, tuple)) else (mb,)
        if not opts["micro_batches"] or any(isinstance(v, bool) or not isinstance(v, int) or v < 1
                                            for v in opts["micro_batches"]):
            raise HeteroConfigError(f"{SECTION}.micro_batches", f"must be a positive integer or a list of them "
                                    f"(the candidates the planner tries), got {mb!r}")
    gb = opts.get("memory_gb")
    if gb is not None and (isinstance(gb, bool) or not isinstance(gb, (int, float)) or not gb > 0):
        raise HeteroConfigError(f"{SECTION}.memory_gb", f"must be a positive number of GB per device, got {gb!r}")
    placement = opts.get("placement")
    if placement is not None and placement not in ("colocated", "disaggregated", "mixed"):
        raise HeteroConfigError(f"{SECTION}.placement",
                                f"got {placement!r}; valid values are colocated, disaggregated or mixed")
    rows = opts.get("rows")
    if rows is not None and (not isinstance(rows, Mapping) or any(
            isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in rows.values())):
        raise HeteroConfigError(f"{SECTION}.rows", f"must map encoder stages to rows per sample (integers >= 0), "
                                                   f"e.g. {{\"audio\": 50}}; got {rows!r}")
    return opts


def default_machine() -> str:
    import torch

    if not torch.cuda.is_available():
        return "cpu"
    name = torch.cuda.get_device_name().lower()
    return next((p for p in ("h200", "h100", "a100") if p in name), "h100")


def plan_config(model, ds: Mapping[str, Any], world_size: int, adapter=None, has_client_optimizer: bool = False):
    """(the DeepSpeed config with a concrete hetero_parallel section, the plan) for an auto config."""
    from .calibrate import machine_profile
    from .model_spec import model_spec
    from .search import plan

    opts = auto_options(ds[SECTION])
    if "train_batch_size" not in ds:
        raise HeteroConfigError("train_batch_size", "missing; the planner needs the global batch")
    text = model.config.text_config if hasattr(model.config, "text_config") else model.config
    seq_len = opts.get("seq_len") or min(4096, int(getattr(text, "max_position_embeddings", 4096)))
    image_tokens = opts.get("image_tokens")
    several = len(model_spec(model.config).encoders) > 1
    if image_tokens is None and not several:
        image_tokens = model_spec(model.config).vision.tokens_per_image
        if not image_tokens:
            raise HeteroConfigError(f"{SECTION}.image_tokens", "missing; this model's image tokens vary, give them")
    if several and opts.get("trial"):
        raise HeteroConfigError(f"{SECTION}.trial", "trials do not run models with several encoders yet: remove trial")
    machine = machine_profile(opts.get("machine") or default_machine())
    base = {k: v for k, v in ds.items() if k != SECTION}
    try:
        result = plan(model, world_size, seq_len, image_tokens, int(ds["train_batch_size"]), machine, base=base,
                      memory_gb=opts.get("memory_gb"), max_tp=opts.get("max_tp"),
                      placements=(opts["placement"],) if opts.get("placement") else None,
                      micro_batches=opts.get("micro_batches"), adapter=adapter,
                      has_client_optimizer=has_client_optimizer, rows=opts.get("rows") if several else None)
    except ValueError as exc:
        if isinstance(exc, HeteroConfigError):
            raise
        field = f"{SECTION}.rows" if several and "rows" in str(exc) else SECTION
        raise HeteroConfigError(field, f"auto: {exc}") from None
    if not result.predictions:
        raise HeteroConfigError(SECTION, f"auto: no valid layout for {world_size} ranks "
                                         f"(rejections by field: {result.stats['reasons']})")
    extra = {"timeout_s": opts["timeout_s"]} if "timeout_s" in opts else None
    return result.ds_config(extra_section=extra), result


def _trial_payload(result, opts: Mapping[str, Any]) -> list[tuple[dict, str]]:
    from .trials import top_runnable

    extra = {"timeout_s": opts["timeout_s"]} if "timeout_s" in opts else None
    return [(result.ds_config(p, extra), p.candidate.label()) for p in top_runnable(result, opts["trial"])]


def _run_trials(model, payload, opts, rank: int, run_trials) -> tuple[dict, str]:
    """Every rank: the trials of rank 0's candidates; the fastest measured (the same on every rank)."""
    from .trial_data import workload_samples

    configs = [c for c, _ in payload["trials"]]
    samples = workload_samples(model.config, payload["seq_len"], payload["image_tokens"],
                               int(configs[0]["train_batch_size"]))
    if next(model.parameters()).is_meta:
        raise HeteroConfigError(f"{SECTION}.trial", "in-process trials need the model's weights; this model is on "
                                                    "the meta device (weights=...): remove trial")
    times = run_trials(model, configs, samples, opts.get("trial_steps", 3))
    best = min(range(len(times)), key=lambda i: times[i])
    if rank == 0:
        from deepspeed.utils import logger

        for (_, label), t in zip(payload["trials"], times):
            logger.info(f"ds_hetero: auto trial {label}: {t:.4f} s/step")
    label = payload["trials"][best][1]
    return configs[best], f"{label} (fastest of {len(times)} trials: {times[best]:.4g} s/step)"


def resolve_auto(model, config, adapter=None, has_client_optimizer: bool = False, timeout_s: float | None = None,
                 run_trials: RunTrials | None = None):
    """`config` unchanged unless its hetero_parallel section is auto; else the planned DeepSpeed config.

    Joins the default process group (it must broadcast), plans on rank 0, broadcasts. `run_trials`:
    how to measure candidates in these processes (`"trial": K`), handed in by the runtime.
    """
    if isinstance(config, Mapping):
        ds = dict(config)
    else:
        ds = read_ds_config(config)
    if not is_auto(ds.get(SECTION)):
        return config
    import torch.distributed as dist

    from ..config import DEFAULT_TIMEOUT_S
    from ..topology.distributed import ensure_distributed

    opts = auto_options(ds[SECTION])  # a bad key raises on every rank before any collective
    if opts.get("trial") and run_trials is None:
        raise HeteroConfigError(f"{SECTION}.trial", "this entry point runs no trials (no trial runner): remove trial")
    rank, world = ensure_distributed(timeout_s or opts.get("timeout_s", DEFAULT_TIMEOUT_S))
    payload: list[Any] = [None]
    if rank == 0:
        try:
            chosen, result = plan_config(model, ds, world, adapter, has_client_optimizer)
            best = result.best
            payload[0] = ("ok", chosen, f"{best.candidate.label()} (predicted {best.step_s:.3g} s/step, "
                                        f"{best.tokens_per_s:.0f} tokens/s on {result.machine.name}; "
                                        f"{len(result.runnable)} runnable layouts)")
            if opts.get("trial"):
                wl = result.workload
                payload[0] = ("trial", {"trials": _trial_payload(result, opts), "seq_len": wl.seq_len,
                                        "image_tokens": wl.image_tokens}, "")
        except HeteroConfigError as exc:
            payload[0] = ("error", exc.field, str(exc).split(": ", 1)[-1])
    device = None
    if dist.get_backend() != "gloo":
        from deepspeed.accelerator import get_accelerator

        device = get_accelerator().current_device_name()
    dist.broadcast_object_list(payload, src=0, device=device)
    status, a, b = payload[0]
    if status == "error":
        raise HeteroConfigError(a, b)
    if status == "trial":
        a, b = _run_trials(model, a, opts, rank, run_trials)
    if rank == 0:
        from deepspeed.utils import logger

        logger.info(f"ds_hetero: hetero_parallel auto chose {b}: {a[SECTION]}")
    return a
