"""Main job: heterogeneous-parallel training of a small VLM on the synthetic shapes-captioning task.

    .venv/bin/deepspeed --num_gpus 4 recipes/train_llava.py --deepspeed_config ds_configs/llava_colocated.json
    .venv/bin/deepspeed --num_gpus 4 recipes/train_llava.py --deepspeed_config ds_configs/llava_disaggregated.json --trace t.json
    .venv/bin/deepspeed --num_gpus 4 recipes/train_llava.py --deepspeed_config ds_configs/llava_pipeline.json
    .venv/bin/deepspeed --num_gpus 4 recipes/train_llava.py --deepspeed_config ds_configs/llava_pipeline_first_stage.json
    .venv/bin/deepspeed --num_gpus 4 recipes/train_llava.py --model-family omni --deepspeed_config ds_configs/omni_colocated.json
    .venv/bin/deepspeed --num_gpus 4 recipes/train_llava.py --model-family gemma4 --deepspeed_config ds_configs/gemma4_colocated.json
    .venv/bin/deepspeed --num_gpus 4 recipes/train_llava.py --model-family gemma3      # or qwen2-vl, qwen2.5-vl, qwen3-vl, internvl, llava-onevision
    .venv/bin/deepspeed --num_gpus 4 recipes/train_llava.py --model-family qwen3.5-moe --deepspeed_config ds_configs/qwen3_vl_moe_ep.json
    .venv/bin/deepspeed --num_gpus 4 recipes/train_llava.py --data recipes/data/shapes_messages.jsonl --steps 20   # your data
    .venv/bin/deepspeed --num_gpus 4 recipes/train_llava.py --model-family qwen2.5-vl --videos --deepspeed_config ds_configs/qwen_video.json
    .venv/bin/deepspeed --num_gpus 4 recipes/train_llava.py --model-family qwen2-vl --data recipes/data/shapes_videos.jsonl   # real clips

`--model-family` picks the built-in tiny model (llava, the default; qwen2-vl, qwen2.5-vl, qwen3-vl, internvl,
llava-onevision, gemma3, qwen3.5, gemma4 (vision, audio and language stages; the shapes data has images
only); qwen3-vl-moe and qwen3.5-moe, with experts over ep in ds_configs/qwen3_vl_moe_ep.json; omni: a Qwen2.5-Omni thinker with vision, audio and language stages, on the same
captions shown as an image, described by a synthetic clip, both, or neither: ds_hetero/toy/omni_shapes.py);
with `--model PATH` the family is the checkpoint's own (its config's model_type).

`--videos` trains a Qwen-VL family (qwen2-vl, qwen2.5-vl, qwen3-vl, qwen3.5) on synthetic clips in place of
images: a shape that moves between two cells, captioned in time order (ds_hetero/toy/shape_clips.py,
docs/video.md).

`--data FILE` trains on a conversation file in place of the synthetic task: LLaVA JSON or the messages
format (LLaMA-Factory / TRL), images (and, for the Qwen-VL families, video files: docs/video.md) from
`--image-folder` (default: the file's folder), encoded with the model's own processor and chat template,
labels on assistant turns only (docs/real-data.md).

The model is built from config with seeded weights (a CLIP tower + projector and a Llama LM),
unless `--model PATH` names a Hugging Face safetensors checkpoint directory: then every rank
builds the model on the meta device and reads only its own stages' tp shards from PATH
(`ds_hetero.initialize(..., weights=PATH)`), so no rank ever holds the whole model. Every rank
builds the same dataset; ds_hetero gives each stage its own layout from the config's
`hetero_parallel` section. Rank 0 prints its startup phases with their times, the layout line, a progress
bar on a terminal (a line every few steps under a log file or pipe) and a summary at the end
(`--summary-json` adds every step's loss and grad norm).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
import warnings

if __name__ == "__main__":
    from ds_hetero.reporting.startup import first_line, hide_cpu_accelerator_message  # light: no torch

    # rank 0's first line, before the imports that take seconds on every rank; DeepSpeed's per-process
    # "Setting accelerator to CPU" (6 times under the launcher) left out, rank 0 says it once (device_note)
    first_line(__file__, "torch, DeepSpeed and transformers")
    hide_cpu_accelerator_message()

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for the hub from a training job
# DeepSpeed's ZeRO still calls the collectives torch 2.13 renamed; the warning is not ours to fix.
warnings.filterwarnings("ignore", category=FutureWarning, message=".*torch.distributed.*is deprecated")

import torch


from ds_hetero.families import FAMILIES as _REGISTRY  # noqa: E402

# --model-family -> the built-in tiny model: every family of the registry (ds_hetero/families/), and
# "omni", the short name this recipe has always taken for the Qwen2.5-Omni thinker
FAMILIES = {**{family.name: family.tiny_name for family in _REGISTRY}, "omni": "tiny-qwen2.5-omni"}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--deepspeed_config", default="ds_configs/llava_colocated.json",
                   help="DeepSpeed JSON with a hetero_parallel section")
    p.add_argument("--steps", type=int, default=100, help="optimizer steps")
    p.add_argument("--samples", type=int, default=4096, help="size of the synthetic dataset")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data", default=None,
                   help="train on this conversation file (LLaVA JSON or messages JSONL, docs/real-data.md; video "
                        "files for the Qwen-VL families, docs/video.md) in place of the synthetic task")
    p.add_argument("--image-folder", default=None,
                   help="where --data's image and video paths point (default: its folder)")
    p.add_argument("--skip-bad-rows", action="store_true",
                   help="leave out --data's bad rows (printed with their count) instead of stopping at the first")
    p.add_argument("--data-workers", type=int, default=None,
                   help="worker processes per rank reading its samples of the next steps (sets "
                        "hetero_parallel.data_workers; default: the config's, else 0)")
    p.add_argument("--model", default=None,
                   help="a safetensors checkpoint directory of a supported family (LLaVA, Qwen2-VL, Qwen2.5-VL, "
                        "Qwen3-VL, InternVL, LLaVA-OneVision, Gemma 3), loaded per stage and tp shard")
    p.add_argument("--model-family", default="llava", choices=list(FAMILIES),
                   help="the built-in tiny model to train (ignored with --model, whose config names its family)")
    p.add_argument("--videos", action="store_true",
                   help="synthetic moving-shape clips in place of images (qwen2-vl, qwen2.5-vl, qwen3-vl, qwen3.5)")
    p.add_argument("--vision", default="clip", choices=["clip", "siglip"], help="tower of the built-in tiny LLaVA")
    p.add_argument("--save", default=None, help="save a checkpoint here at the end")
    p.add_argument("--load", default=None,
                   help="resume from a checkpoint saved with --save (weights, optimizer, data position): the "
                        "run's --steps continue from its step, mid-epoch included")
    p.add_argument("--summary-json", default=None, help="rank 0 writes the summary here as JSON")
    p.add_argument("--trace", default=None,
                   help="rank 0 writes a Chrome trace (chrome://tracing, Perfetto) of every rank's spans here")
    p.add_argument("--trace-window", type=int, default=100_000,
                   help="spans per rank the trace keeps: the last ones (memory stays bounded on long runs)")
    p.add_argument("--local_rank", type=int, default=-1, help="set by the deepspeed launcher")
    args = p.parse_args(argv)
    if not args.data and (args.image_folder or args.skip_bad_rows):
        p.error("--image-folder and --skip-bad-rows apply to --data FILE, which is not given")
    if args.data_workers is not None and args.data_workers < 0:
        p.error(f"--data-workers must be 0 or more, got {args.data_workers}")
    return args


def build_model(args):
    """(model, weights): on the meta device with its checkpoint directory, or built with seeded weights."""
    if args.model:
        from ds_hetero import meta_model

        return meta_model(args.model, dtype=torch.float32), args.model
    if args.model_family != "llava":
        from ds_hetero.families.meta import builtin_model

        return builtin_model(FAMILIES[args.model_family], seed=args.seed), None
    from ds_hetero.toy import tiny_llava

    return tiny_llava(args.vision, seed=args.seed), None


# --model-family values whose tiny model has a locally built processor (ds_hetero/toy/processors.py)
DATA_FAMILIES = ("llava", "qwen2-vl", "qwen2.5-vl", "qwen3-vl", "qwen3.5")


def data_processor(args, model):
    """The processor --data is encoded with: the checkpoint's own, or the tiny model's, built locally."""
    if not args.model and args.model_family not in DATA_FAMILIES:
        raise SystemExit(f"--data: the built-in tiny {args.model_family} has no processor to encode conversations "
                         f"with; use --model-family {' / '.join(DATA_FAMILIES)}, or --model PATH (a checkpoint "
                         f"directory with its processor files)")
    from ds_hetero.toy.processors import processor_for

    return processor_for(args.model, model)


def build_dataset(args, model):
    if args.videos:
        from ds_hetero.families import adapter_for

        if args.data or not hasattr(adapter_for(model), "FRAME_RUNS"):
            sys.exit("--videos: the synthetic clips are for the Qwen-VL families (--model-family qwen2-vl, "
                     "qwen2.5-vl, qwen3-vl, qwen3.5) and take no --data (give real clips as the rows' \"videos\" "
                     "in --data instead: docs/video.md)")
        from ds_hetero.toy.shape_clips import ShapeClipsDataset

        return ShapeClipsDataset(model, args.samples, seed=args.seed)
    if args.data:
        from ds_hetero.sft_data import SFTDataset

        dataset = SFTDataset.from_file(args.data, data_processor(args, model), image_folder=args.image_folder,
                                       skip_bad_rows=args.skip_bad_rows)
        if int(os.environ.get("RANK", "0")) == 0:  # how the length index was found or measured (initialize builds it)
            dataset.log = lambda line: print(line, flush=True)
        return dataset
    if args.model_family == "omni" or type(model).__name__.startswith("Qwen2_5Omni"):
        from ds_hetero.toy.omni_shapes import OmniShapesDataset

        return OmniShapesDataset(args.samples, model.config, seed=args.seed, max_shapes=2)
    from ds_hetero.toy.family_formats import shapes_dataset_for

    return shapes_dataset_for(model.config, size=args.samples, seed=args.seed)  # the family's own sample format


def peak_memory_mb(device: torch.device) -> float:
    """Peak memory of this rank: device memory on an accelerator, max RSS of the process on CPU."""
    if device.type != "cpu":
        from deepspeed.accelerator import get_accelerator

        return get_accelerator().max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def _header(engine, model, dataset, data_file: str | None) -> str:
    """The layout line (reporting/layout_line.py), then the model's size and any shared DeepSpeed engine."""
    from ds_hetero.reporting import data_source, layout_line

    shared = [s.name for s in engine.stages.held if s.engine_owner is not None]
    return (layout_line(engine.config, data_source(dataset, data_file)) +
            f"\nmodel: {sum(p.numel() for p in model.parameters()):,} parameters" +
            (f"; one DeepSpeed engine for {', '.join(shared)} (same ranks and layout)" if shared else ""))


def train(engine, steps: int, clock=None) -> tuple[list, float]:
    """(the steps' results, wall seconds); rank 0 reports progress (reporting/progress.py)."""
    from ds_hetero.reporting.progress import Progress

    progress = Progress(steps, enabled=engine.rank == 0)
    history, start = [], time.perf_counter()
    for step in range(steps):
        r = engine.train_batch()
        if step == 0 and clock is not None:
            clock.done("first step done")
        history.append(r)
        progress.update(r)
    wall = time.perf_counter() - start
    progress.close()
    return history, wall


def _gather(engine, value) -> list:
    import torch.distributed as dist

    out = [None] * engine.world_size
    dist.all_gather_object(out, value)
    return out


def gathered(engine, history, tail, trace: str | None) -> dict:
    """What the summary needs from every rank (collectives: every rank calls this, in the same order)."""
    out = {"memory": _gather(engine, round(peak_memory_mb(engine.device), 1)),
           "backward": _gather(engine, sum(r.boundary_bytes_backward for r in history)),
           # the plan's figure, the same on every rank that ran a backward exchange (0 on the others)
           "backward_bound": _gather(engine, sum(r.boundary_bytes_backward_lower_bound for r in history)),
           "bubbles": _gather(engine, round(sum(r.bubble_fraction for r in tail) / len(tail), 3)),
           "data_wait": _gather(engine, round(sum(r.data_wait for r in tail) / len(tail), 5)),
           "pipeline": None}
    if engine.config.language.pp > 1:  # where each rank's time went around the pipeline, in the last step
        from ds_hetero.timeline import pipeline_overlap

        last = _gather(engine, engine.timeline.step_spans(len(history) - 1))
        out["pipeline"] = [{k: round(v, 4) for k, v in row.items()}
                           for row in pipeline_overlap(last, len(history) - 1)]
    if trace:
        from ds_hetero.timeline import chrome_trace

        spans = _gather(engine, engine.timeline.spans)
        counters = _gather(engine, engine.timeline.counters)  # TFLOP/s per device and MFU per step
        if engine.rank == 0:
            with open(trace, "w") as f:
                json.dump(chrome_trace(spans, counters), f)
    return out


def summarize(engine, history, wall: float, trace: str | None = None, layout: str = "") -> dict:
    """What --summary-json writes: averages over the second half of the run (after warm-up), peak memory of
    every rank, every step's loss and grad norm. Stage times are this rank's (rank 0); in disaggregated
    placement it runs only its own stage. reporting/summary_text.py chooses what is printed."""
    from ds_hetero.reporting.run_figures import step_figures, warm_steps

    cfg = engine.config
    tail = warm_steps(history)
    split: dict[str, float] = {}
    for r in tail:
        for stage, phases in r.stage_time.items():
            for phase, sec in phases.items():
                split[f"{stage}.{phase}"] = split.get(f"{stage}.{phase}", 0.0) + sec / len(tail)
    g = gathered(engine, history, tail, trace)
    summary = {
        "layout": layout,
        **step_figures(history),
        "wall_s": wall,
        "stage_time_s_per_step": {k: round(v, 5) for k, v in sorted(split.items())},
        "boundary_backward_bytes_per_step": sum(g["backward"]) / len(history),  # all ranks
        "boundary_backward_lower_bound_per_step": max(g["backward_bound"]) / len(history),
        "peak_memory_mb_per_rank": g["memory"],
        "bubble_fraction_per_rank": g["bubbles"],
        # seconds a step waited for the rank's share of the data (not in the bubble; docs/real-data.md)
        "data_wait_s_per_step_per_rank": g["data_wait"],
        "stages_per_rank": [cfg.stages_of_rank(r) for r in range(engine.world_size)],
    }
    if g["pipeline"] is not None:
        summary["pipeline_last_step_per_rank"] = g["pipeline"]
    return summary


def main(argv=None) -> int:
    args = parse_args(argv)
    import ds_hetero
    from deepspeed.accelerator import get_accelerator
    from ds_hetero.reporting.startup import LAUNCHER_NOTE, PhaseClock, device_note, show_startup
    from ds_hetero.reporting.summary_text import summary_lines

    rank0 = int(os.environ.get("RANK", "0")) == 0
    if rank0:  # the library logs its startup phases on every rank; rank 0 shows them
        show_startup()
    clock = PhaseClock()
    clock.note(f"imports done; {device_note(get_accelerator().device_name())}")
    if rank0 and "LOCAL_RANK" in os.environ:  # under a launcher
        print(LAUNCHER_NOTE, flush=True)
    torch.manual_seed(args.seed)
    model, weights = build_model(args)
    clock.done("model built" + (" on the meta device (weights read per stage later)" if weights else ""))
    dataset = build_dataset(args, model)
    clock.done("dataset ready")
    config = args.deepspeed_config
    if args.data_workers is not None:  # the one key this option sets; the rest of the config as given
        from ds_hetero.config import read_ds_config

        config = read_ds_config(config)  # a syntax error named with its file, line and column
        config.setdefault("hetero_parallel", {})["data_workers"] = args.data_workers
    engine = ds_hetero.initialize(model, config, training_data=dataset, weights=weights,
                                  seed=args.seed)  # the data order too, as the Trainer recipe does
    clock.done("ds_hetero.initialize done, in all" + (" (the length index of --data included)" if args.data else ""))
    if args.load:
        engine.load_checkpoint(args.load)
        clock.done(f"checkpoint {args.load} loaded")
    engine.timeline.trace_window = args.trace_window
    engine.timeline.synchronize = bool(args.trace)  # a trace times device work, at the cost of overlap
    header = _header(engine, model, dataset, args.data)
    if engine.rank == 0:
        skipped = dataset.skipped_summary() if hasattr(dataset, "skipped_summary") else ""
        if skipped:
            print(f"data: {skipped}", flush=True)
        print(header, flush=True)
    history, wall = train(engine, args.steps, clock)
    if args.save:
        engine.save_checkpoint(args.save)
    summary = summarize(engine, history, wall, args.trace, layout=header.splitlines()[0])
    if engine.rank == 0:
        print("\n" + "\n".join(summary_lines(summary, args.summary_json)), flush=True)
        if args.summary_json:
            with open(args.summary_json, "w") as f:
                json.dump(summary, f, indent=2)
    return 0


if __name__ == "__main__":
    from ds_hetero.launch_errors import exit_code_of

    sys.exit(exit_code_of(main))  # a config error printed once, by rank 0, not a traceback per rank
