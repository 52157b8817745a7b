"""An Accelerate training script on the shapes-captioning task; ds_hetero builds and steps the engines.

    .venv/bin/accelerate launch --config_file ds_configs/accelerate_colocated.yaml recipes/accelerate_llava.py
    .venv/bin/accelerate launch --config_file ds_configs/accelerate_disaggregated.yaml recipes/accelerate_llava.py \
        --steps 200 --save-state-every 100 --state-dir out/acc
    .venv/bin/accelerate launch --config_file ds_configs/accelerate_colocated.yaml recipes/accelerate_llava.py \
        --resume-from out/acc/step100 --steps 200

The YAML names the DeepSpeed JSON (with `hetero_parallel`); `ds_hetero.accelerate.prepare` returns
the HeteroEngine, `accelerator.save_state` / `load_state` save and restore it, and
`ds_hetero.accelerate.log_step` sends loss, grad norm and the per-stage metrics (reduced over
ranks) to the accelerator's trackers (`--log-jsonl` adds a small JSON-lines tracker, defined here
as an example of a custom one). Same model, data order and optimizer as recipes/train_llava.py.
`--data FILE` trains on conversations (sft_data's SFTDataset, recipes/data/shapes_llava.json) read as the
launcher reads them: the length index prepared by every rank together, each rank reading only its
stages' rows (ahead of the step with `hetero_parallel.data_workers`), since `prepare` hands the dataset
to the same engine loader as `ds_hetero.initialize`.
The main process reports as the main job does: its startup phases with their times, the layout line,
a progress bar on a terminal (a line every few steps otherwise) and the summary (ds_hetero/reporting/).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings

if __name__ == "__main__":
    from ds_hetero.reporting.startup import first_line, hide_cpu_accelerator_message  # light: no torch

    # the main process's first line, before the imports that take seconds on every process; DeepSpeed's
    # per-process "Setting accelerator to CPU" left out, the main process says it once (device_note)
    first_line(__file__, "torch, Accelerate, DeepSpeed and transformers", unit="process(es)")
    hide_cpu_accelerator_message()

os.environ.setdefault("HF_HUB_OFFLINE", "1")
warnings.filterwarnings("ignore", category=FutureWarning, message=".*torch.distributed.*is deprecated")

import torch  # noqa: E402
from accelerate import Accelerator, PartialState  # noqa: E402
from accelerate.tracking import GeneralTracker  # noqa: E402

import ds_hetero  # noqa: E402
from ds_hetero.toy import ShapesCaptionDataset  # noqa: E402
from ds_hetero.toy import tiny_llava  # noqa: E402


class JsonlTracker(GeneralTracker):
    """One JSON line per `accelerator.log` call (main process only, as every Accelerate tracker)."""

    name, requires_logging_directory, main_process_only = "jsonl", False, True

    def __init__(self, path: str):
        super().__init__()
        self.path = path

    @property
    def tracker(self):
        return self.path

    def store_init_configuration(self, values):
        self.log({"config": values})

    def log(self, values, step=None, **kwargs):
        with open(self.path, "a") as f:
            f.write(json.dumps({"step": step, **values}) + "\n")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=100, help="optimizer steps (in all, counting resumed ones)")
    p.add_argument("--samples", type=int, default=4096, help="size of the synthetic dataset")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--vision", default="clip", choices=["clip", "siglip"])
    p.add_argument("--model", default=None, metavar="PATH",
                   help="a LlavaForConditionalGeneration safetensors checkpoint directory: built on the meta device, "
                        "every rank reads only its stages' tp shards (ds_hetero.meta_model + weights=)")
    p.add_argument("--data", default=None, metavar="FILE",
                   help="conversations (JSON list, JSONL, or a folder of JSONL shards) in place of the synthetic set")
    p.add_argument("--image-folder", default=None, help="where --data's image paths are relative to")
    p.add_argument("--save-state-every", type=int, default=0, help="accelerator.save_state every N steps")
    p.add_argument("--state-dir", default="out/accelerate_llava", help="save_state writes <state-dir>/step<N>")
    p.add_argument("--resume-from", default=None, help="accelerator.load_state from this directory first")
    p.add_argument("--log-jsonl", default=None, help="also log to this JSON-lines file")
    p.add_argument("--summary-json", default=None, help="the main process writes the step losses here")
    return p.parse_args(argv)


def conversations(args, model):
    """--data as an SFTDataset, encoded by the checkpoint's processor or the tiny model's (built locally)."""
    from ds_hetero.sft_data import SFTDataset
    from ds_hetero.toy.processors import processor_for

    return SFTDataset.from_file(args.data, processor_for(args.model, model), image_folder=args.image_folder)


def main(argv=None) -> int:
    # imported here, inside exit_code_of: it checks the accelerate YAML against the JSON on import, and a
    # config error is printed once (launch_errors.py)
    import ds_hetero.accelerate
    from deepspeed.accelerator import get_accelerator
    from ds_hetero.reporting import data_source, layout_line
    from ds_hetero.reporting.progress import Progress
    from ds_hetero.reporting.run_figures import step_figures
    from ds_hetero.reporting.startup import LAUNCHER_NOTE, PhaseClock, device_note, show_startup
    from ds_hetero.reporting.summary_text import summary_lines

    args = parse_args(argv)
    if os.environ.get("RANK", "0") == "0":  # the library logs its startup phases on every process; one shows them
        show_startup()
        if "LOCAL_RANK" in os.environ:
            print(LAUNCHER_NOTE, flush=True)
    clock = PhaseClock()
    clock.note(f"imports done; {device_note(get_accelerator().device_name())}")
    if not torch.cuda.is_available():
        PartialState(backend="gloo")  # on CPU: without it Accelerate sees a single process
    accelerator = Accelerator(log_with=[JsonlTracker(args.log_jsonl)] if args.log_jsonl else None)
    accelerator.init_trackers("accelerate_llava", config={"steps": args.steps, "seed": args.seed})

    if args.model:
        model, weights = ds_hetero.meta_model(args.model, dtype=torch.float32), args.model
    else:
        model, weights = tiny_llava(args.vision, seed=args.seed), None
    data = conversations(args, model) if args.data else \
        ShapesCaptionDataset.for_llava(model.config, size=args.samples, seed=args.seed)
    clock.done("model and dataset built")
    engine = ds_hetero.accelerate.prepare(accelerator, model, training_data=data, weights=weights)
    clock.done("ds_hetero.accelerate.prepare done, in all")
    if args.resume_from:
        accelerator.load_state(args.resume_from)
        clock.done(f"state {args.resume_from} loaded")
    if accelerator.is_main_process:
        print(layout_line(engine.config, data_source(data, args.data)), flush=True)

    losses, history = {}, []
    progress = Progress(args.steps, enabled=accelerator.is_main_process, first_step=engine.global_steps)
    for step in range(engine.global_steps, args.steps):
        result = engine.train_batch()
        if not history:
            clock.done("first step done")
        losses[step] = result.loss
        history.append(result)
        progress.update(result)
        ds_hetero.accelerate.log_step(accelerator, engine, result, step)
        if args.save_state_every and (step + 1) % args.save_state_every == 0:
            accelerator.save_state(os.path.join(args.state_dir, f"step{step + 1}"))
    progress.close()
    if accelerator.is_main_process:
        if history:  # this process's steps (from the resumed step on): losses are global, times rank 0's
            summary = {"layout": layout_line(engine.config, data_source(data, args.data)), **step_figures(history)}
            print("\n" + "\n".join(summary_lines(summary, args.summary_json)), flush=True)
        if args.summary_json:
            with open(args.summary_json, "w") as f:
                json.dump({"losses": losses, "num_processes": accelerator.num_processes,
                           "distributed_type": str(accelerator.distributed_type)}, f)
    accelerator.end_training()
    return 0


if __name__ == "__main__":
    from ds_hetero.launch_errors import exit_code_of

    sys.exit(exit_code_of(main))  # a config error printed once, by the main process, not a traceback per process
