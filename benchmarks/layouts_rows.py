"""bench_layouts' rows: what each row is (a ds_hetero layout, or plain DeepSpeed over the whole model),
the model sizes of each scenario, the seeded model and batches every row trains on, and the
DeepSpeed config of a row."""

from __future__ import annotations

from dataclasses import dataclass

@dataclass(frozen=True)
class Layout:
    """One ds_hetero row: (tp, dp) per stage; disaggregated rows also name each stage's ranks."""

    vision: tuple[int, int]
    language: tuple[int, int]
    placement: str = "colocated"
    vision_ranks: tuple[int, ...] | None = None
    language_ranks: tuple[int, ...] | None = None
    mb: int | None = None  # micro-batches of this row only (default: see micro_batches)

    @property
    def disaggregated(self) -> bool:
        return self.placement == "disaggregated"

    def micro_batches(self, a) -> int:
        """Colocated rows run --micro-batches (1: no pipeline to fill); disaggregated rows pipeline
        --pipeline-micro-batches (a two-stage 1F1B needs >= 2 to overlap anything)."""
        if self.mb is not None:
            return self.mb
        return a["pipeline_micro_batches"] if self.disaggregated else a["micro_batches"]

    def rank_groups(self, world: int) -> list[tuple[str, tuple[int, ...]]]:
        """(label, ranks) of the rank sets that do different work: all ranks, or one set per stage."""
        if not self.disaggregated:
            return [("all", tuple(range(world)))]
        return [("vision", self.vision_ranks), ("language", self.language_ranks)]


@dataclass(frozen=True)
class Plain:
    """Plain DeepSpeed over the whole model: dp over all ranks, or DeepSpeed's own AutoTP
    (`"tensor_parallel": {"autotp_size": autotp}`), which shards the language model only and
    leaves the vision tower and projector replicated on the tp ranks."""

    autotp: int = 1
    # two engines (bench_overhead's decomposition row): one deepspeed.initialize per stage module,
    # stepped by plain DeepSpeed, each clipping by its own norm; dp over all ranks, no AutoTP
    two_engines: bool = False

    def dp(self, world: int) -> int:
        return world // self.autotp


LAYOUTS = {  # row name -> Layout, or Plain for plain DeepSpeed over the whole model
    "homogeneous": Layout((2, 2), (2, 2)),
    "homogeneous tp4": Layout((4, 1), (4, 1)),  # both stages at the language's tp4
    "hetero tp2": Layout((1, 4), (2, 2)),
    "hetero tp4": Layout((1, 4), (4, 1)),
    "ds_hetero dp4": Layout((1, 4), (1, 4)),
    "hetero Vtp4": Layout((4, 1), (1, 4)),
    "hetero tp2 mb4": Layout((1, 4), (2, 2), mb=4),  # colocated controls for the pipelined rows
    "hetero dp4 mb4": Layout((1, 4), (1, 4), mb=4),
    "plain DS dp4": Plain(),
    "DS AutoTP tp2": Plain(autotp=2),
    # disaggregated: each rank holds one stage; the vision ranks encode micro-batch m+1 while the
    # language ranks run forward + backward of m
    "disagg 2+2 tp": Layout((1, 2), (2, 1), "disaggregated", (0, 1), (2, 3)),
    "disagg 2+2 dp": Layout((1, 2), (1, 2), "disaggregated", (0, 1), (2, 3)),
    "disagg 2+2 Vtp2": Layout((2, 1), (1, 2), "disaggregated", (0, 1), (2, 3)),
    "disagg 3+1": Layout((1, 3), (1, 1), "disaggregated", (0, 1, 2), (3,)),  # needs --batch 12 or 24
    "disagg 1+3": Layout((1, 1), (1, 3), "disaggregated", (0,), (1, 2, 3)),
}
BASELINE = "homogeneous"

DEFAULTS = dict(image_size=64, patch_size=4, vision_hidden=256, vision_layers=4, vision_heads=8,
                text_hidden=256, text_layers=4, text_heads=8, text_kv_heads=4,
                batch=16, micro_batches=1, pipeline_micro_batches=4, warmup=2, steps=4, rounds=6, world=4)
QUICK = dict(image_size=32, patch_size=4, vision_hidden=64, vision_layers=2, vision_heads=4,
             text_hidden=64, text_layers=2, text_heads=4, text_kv_heads=4,
             batch=16, micro_batches=1, pipeline_micro_batches=4, warmup=1, steps=3, rounds=3, world=4)

# One run = one or more scenarios (a model size and the rows that run on it). Each scenario's sizes
# override DEFAULTS (or QUICK); explicit size flags override both.
COMPARE = ["homogeneous", "hetero tp2", "ds_hetero dp4", "hetero tp2 mb4", "disagg 2+2 tp", "disagg 2+2 dp"]
SCENARIOS = {
    "balanced": dict(
        about="vision tower about the language model's size and compute",
        sizes={}, quick_sizes={}, rows=COMPARE),
    "large-vision": dict(
        about="vision tower 2x the language model's parameters, 2.25x its compute per token",
        sizes=dict(vision_hidden=384), quick_sizes=dict(vision_hidden=128), rows=COMPARE),
    # not in the default run: a tower large in parameters for the few tokens it sees (64 per image),
    # where the work that scales with a replica's parameters (gradient reduction, optimizer) dominates
    "wide-vision": dict(
        about="vision tower 12x the language model's parameters, 64 image tokens per sample",
        sizes=dict(image_size=32, vision_hidden=768, vision_layers=6, vision_heads=12),
        quick_sizes=dict(image_size=16, vision_hidden=256, vision_layers=4),
        rows=["homogeneous", "hetero tp2", "ds_hetero dp4", "hetero Vtp4", "disagg 2+2 dp", "disagg 2+2 Vtp2"]),
}
DEFAULT_SCENARIOS = ["balanced", "large-vision"]

def build_model(a):
    from ds_hetero.toy import tiny_llava

    return tiny_llava("clip", seed=a["seed"], text_hidden=a["text_hidden"], text_layers=a["text_layers"],
                      text_heads=a["text_heads"], text_kv_heads=a["text_kv_heads"], vocab=256,
                      vision_hidden=a["vision_hidden"], vision_layers=a["vision_layers"],
                      vision_heads=a["vision_heads"], image_size=a["image_size"], patch_size=a["patch_size"])


def make_batches(model, a, n):
    """n global batches (lists of samples), identical on every rank."""
    from ds_hetero.toy import ShapesCaptionDataset

    data = ShapesCaptionDataset.for_llava(model.config, size=n * a["batch"], seed=a["seed"] + 1,
                                          max_shapes=2, grid=3)
    return [[data[i * a["batch"] + j] for j in range(a["batch"])] for i in range(n)]


def ds_config(a, layout=Plain()):
    cfg = {
        "train_batch_size": a["batch"],
        "zero_optimization": {"stage": 1},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}},
        "zero_allow_untested_optimizer": True,
        "gradient_clipping": 1.0,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    if isinstance(layout, Plain):  # plain DeepSpeed, dp over the whole world (or AutoTP x dp)
        cfg["gradient_accumulation_steps"] = a["micro_batches"]
        cfg["train_micro_batch_size_per_gpu"] = a["batch"] // (layout.dp(a["world"]) * a["micro_batches"])
        if layout.autotp > 1:
            cfg["tensor_parallel"] = {"autotp_size": layout.autotp}
            # DeepSpeed checks train_batch_size against the whole world (tp ranks included) before
            # AutoTP splits it; micro-batch and accumulation steps say the same without that check
            del cfg["train_batch_size"]
    elif hasattr(layout, "section"):  # a planner Candidate (validate_planner's pipeline and first_stage rows)
        cfg["hetero_parallel"] = layout.section()
    else:
        stages = {}
        for name, (tp, dp), ranks in (("vision", layout.vision, layout.vision_ranks),
                                      ("language", layout.language, layout.language_ranks)):
            stages[name] = {"tp": tp, "dp": dp} | ({"ranks": list(ranks)} if ranks else {})
        cfg["hetero_parallel"] = {"placement": layout.placement, "micro_batches": layout.micro_batches(a),
                                  "stages": stages}
    return cfg


def layout_of(name, a):
    """A row of LAYOUTS, or one a caller added for this run (a["extra_layouts"], e.g. a planner's pick)."""
    return a.get("extra_layouts", {}).get(name) or LAYOUTS[name]


def rank_groups(name, world):
    layout = LAYOUTS[name]
    return [("all", tuple(range(world)))] if isinstance(layout, Plain) else layout.rank_groups(world)


def mb_of(name, a):
    layout = LAYOUTS[name]
    return a["micro_batches"] if isinstance(layout, Plain) else layout.micro_batches(a)


def ranks_str(ranks):
    return f"{ranks[0]}-{ranks[-1]}" if len(ranks) > 1 else str(ranks[0])


def layout_str(layout, world):
    if isinstance(layout, Plain):
        return f"whole model dp{layout.dp(world)}" + (f" AutoTP{layout.autotp}" if layout.autotp > 1 else "")
    if hasattr(layout, "section"):
        return layout.label()
    (vtp, vdp), (ltp, ldp) = layout.vision, layout.language
    if layout.disaggregated:
        return f"V tp{vtp}dp{vdp}@{ranks_str(layout.vision_ranks)} L tp{ltp}dp{ldp}@{ranks_str(layout.language_ranks)}"
    return f"V tp{vtp}dp{vdp} L tp{ltp}dp{ldp}"

def with_param_counts(a):
    from ds_hetero.families.llava.adapter import split_llava

    model = build_model(a)
    stages = split_llava(model)
    return dict(a, vision_params=sum(p.numel() for p in stages["vision"].parameters()),
                text_params=sum(p.numel() for p in stages["language"].parameters()))

def batch_problems(a, names):
    """Rows whose stages cannot split the global batch into dp x micro-batches evenly."""
    out = []
    for n in names:
        layout = LAYOUTS[n]
        stages = ([("model", (layout.autotp, layout.dp(a["world"])))] if isinstance(layout, Plain)
                  else [("vision", layout.vision), ("language", layout.language)])
        for stage, (_, dp) in stages:
            if a["batch"] % (dp * mb_of(n, a)):
                out.append(f"{n}: {stage} dp{dp} x mb{mb_of(n, a)} does not divide --batch {a['batch']}")
    return out
