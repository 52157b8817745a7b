"""Shared by the pipeline tests: the layouts of a pipelined language stage, trained against the
single-process Hugging Face reference (tests/engine_parity.py), and a negative control."""

from ds_hetero.testing.parity import train_both

FOUR_LAYERS = dict(text_layers=4)  # pp up to 4, and an uneven cut [1, 3]


def drop_pipeline_gradient(engine, batches):
    """Negative control: the last pipeline stage sends zeros back instead of its input gradient,
    so the earlier stages' layers (and the encoder) train on no language gradient."""
    import torch.distributed as dist

    schedule = engine.schedule
    language = engine.stages.language
    if language.held and language.coord.pp == language.layout.pp - 1:
        isend = dist.isend

        def zero_isend(tensor, dst, group=None, **kw):
            return isend(tensor * 0, dst, group=group, **kw)

        schedule_dist = __import__("ds_hetero.schedule.one_f_one_b", fromlist=["dist"])
        schedule_dist.dist = _Patched(dist, isend=zero_isend)
    return {}


class _Patched:
    def __init__(self, module, **overrides):
        self._module, self._overrides = module, overrides

    def __getattr__(self, name):
        return self._overrides.get(name) or getattr(self._module, name)


def run_layouts(rank, world_size, runs):
    """{name: train_both(...)} for every run (one launch for several layouts)."""
    import torch.distributed as dist

    from ds_hetero.schedule import one_f_one_b as pipeline

    out = {}
    for name, kw in runs.items():
        kw = {"steps": 5, "clip": 0.3, "micro_batches": 4, "batch_size": 16, "model_kw": FOUR_LAYERS, **kw}
        try:
            out[name] = train_both(rank, world_size, kw.pop("family", "llava"), **kw)
        finally:
            pipeline.dist = dist  # undo a negative control's patch
        out[name]["pp_coord"] = _pp_coord(kw, rank, world_size)
    return out


def _pp_coord(kw, rank, world_size):
    """This rank's pipeline stage in the run's layout (None where it holds no language stage)."""
    from ds_hetero.config import load_config

    hetero = {"placement": kw.get("placement", "colocated"), "micro_batches": kw["micro_batches"],
              "stages": kw["layout"], **(kw.get("hetero") or {})}
    cfg = load_config({"train_batch_size": kw["batch_size"], "hetero_parallel": hetero}, world_size)
    return cfg.language.coord(rank).pp if cfg.language.contains(rank) else None


def quick(rank, world_size):
    import os

    which = os.environ.get("PP_QUICK", "pp2dp2")
    runs = {
        "pp2dp2": dict(layout={"vision": {"tp": 1, "dp": 4}, "language": {"dp": 2, "pp": 2}}, zero_stage=1, steps=2),
    }
    return run_layouts(rank, world_size, {which: runs[which]})


def evaluate_first(engine, batches):
    """eval_batch on the first batch before training: the reference's first loss is its answer."""
    return {"eval_loss": engine.eval_batch(batches[0])}


def bf16_losses(rank, world_size, steps=3, model_kw=FOUR_LAYERS, language=None, tied_name=None):
    """A pipelined language stage (default pp2 dp2; vision dp4) in bf16 with ZeRO 1 (and fp32 with
    ZeRO 2 for the reference losses, on the same batches): the pipeline runs in bf16 and trains the
    same function. tied_name: a tied model's embedding name; this rank's copy of the tied weight
    (None where it holds none) comes back under "copy"."""
    import torch

    import ds_hetero
    from ds_hetero.testing.parity import build_model, full_named_parameters, make_batches

    language = language or {"dp": 2, "pp": 2}
    out = {}
    for name, extra, zero in (("bf16", {"bf16": {"enabled": True}}, 1), ("fp32", {}, 2)):
        model = build_model("llava", seed=7, **model_kw)
        batches = make_batches("llava", model, steps, 16)
        config = {"train_batch_size": 16, "zero_optimization": {"stage": zero}, "gradient_clipping": 0.3,
                  "zero_allow_untested_optimizer": True, "steps_per_print": 10**6, **extra,
                  "hetero_parallel": {"micro_batches": 4, "stages": {"vision": {"dp": 4}, "language": language}}}
        engine = ds_hetero.initialize(model, config, optimizer=lambda p: torch.optim.AdamW(p, lr=1e-3, eps=1e-4))
        results = [engine.train_batch(s) for s in batches]
        out[name] = dict(losses=[r.loss for r in results], norms=[r.grad_norm for r in results],
                         dtype=str(engine.stages.dtype))
        if tied_name is not None:
            copy = engine.stages.language.tied
            out[name]["copy"] = None if copy is None else full_named_parameters(engine)[tied_name].float().tolist()
        engine.groups.destroy()
    return out


def save_pretrained_roundtrip(rank, world_size, tmp):
    """Language pp2 tp2 + vision dp4: train 2 steps, save_pretrained, and compare what
    `from_pretrained` reads with every rank's live weights (gathered by the test's own path)."""
    import copy

    import torch
    import torch.distributed as dist
    from transformers import AutoModelForImageTextToText

    import ds_hetero
    from ds_hetero.testing.parity import build_model, full_named_parameters, make_batches

    model = build_model("llava", seed=7, **FOUR_LAYERS)
    untrained = copy.deepcopy(model)
    config = {"train_batch_size": 16, "zero_optimization": {"stage": 2}, "gradient_clipping": 0.3,
              "zero_allow_untested_optimizer": True, "steps_per_print": 10**6,
              "hetero_parallel": {"micro_batches": 4, "stages": {"vision": {"dp": 4},
                                                                  "language": {"tp": 2, "dp": 1, "pp": 2}}}}
    engine = ds_hetero.initialize(model, config, optimizer=lambda p: torch.optim.AdamW(p, lr=1e-2))
    for samples in make_batches("llava", model, 2, 16):
        engine.train_batch(samples)
    engine.save_pretrained(tmp)
    parts = [None] * world_size
    dist.all_gather_object(parts, full_named_parameters(engine))
    out = {}
    if rank == 0:
        live = {k: v for p in parts for k, v in p.items()}
        loaded = dict(AutoModelForImageTextToText.from_pretrained(tmp, dtype=torch.float32).named_parameters())
        base = dict(untrained.named_parameters())
        out["names"] = (sorted(live) == sorted(loaded) == sorted(base), len(live))
        out["diff"] = max((loaded[k].detach() - v).abs().max().item() for k, v in live.items())
        out["control"] = max((base[k].detach() - v).abs().max().item() for k, v in live.items())
        out["files"] = sorted(__import__("os").listdir(tmp))
    engine.groups.destroy()
    dist.barrier()
    return out


def per_shard_loading(rank, world_size, checkpoint):
    """Language pp2 tp2 + vision dp4 from a meta model and `weights=` (each rank reads only its
    pipeline stage's layers, its tp rows) against the same layout built from the full model:
    losses and weights equal after 2 steps; the other pipeline stage's layers stay on meta."""
    import torch

    import ds_hetero
    from ds_hetero.testing.parity import build_model, full_named_parameters, make_batches

    config = {"train_batch_size": 16, "zero_optimization": {"stage": 1}, "gradient_clipping": 0.3,
              "zero_allow_untested_optimizer": True, "steps_per_print": 10**6,
              "hetero_parallel": {"micro_batches": 4, "stages": {"vision": {"dp": 4},
                                                                  "language": {"tp": 2, "dp": 1, "pp": 2}}}}

    def optimizer(params):
        return torch.optim.AdamW(params, lr=1e-3, eps=1e-4)

    batches = make_batches("llava", build_model("llava", seed=7, **FOUR_LAYERS), 2, 16)
    out = {}
    for name, model, weights in (("built", build_model("llava", seed=7, **FOUR_LAYERS), None),
                                 ("loaded", ds_hetero.meta_model(checkpoint), checkpoint)):
        engine = ds_hetero.initialize(model, config, optimizer=optimizer, weights=weights)
        losses = [engine.train_batch(s).loss for s in batches]
        layers = model.model.language_model.layers
        out[name] = dict(losses=losses, weights={k: v.tolist() for k, v in full_named_parameters(engine).items()},
                         meta_layers=[all(p.is_meta for p in layer.parameters()) for layer in layers],
                         report=None if engine.load_report is None else
                         {k: (v.bytes_read, v.bytes_full) for k, v in engine.load_report.items()})
        engine.groups.destroy()
    # plain numbers back to the parent (tensors would travel as shared memory of an exited process)
    got, want = out["loaded"].pop("weights"), out["built"].pop("weights")
    out["same_names"] = sorted(got) == sorted(want) and len(want) > 0
    out["weight_diff"] = max((torch.tensor(got[n]) - torch.tensor(w)).abs().max().item() for n, w in want.items())
    return out
