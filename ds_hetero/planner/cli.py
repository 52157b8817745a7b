"""`ds-hetero plan`: rank every valid configuration of a model and optionally write the best."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace

from ..errors import HeteroConfigError
from .workload import ATTENTION_KERNELS


# Without --machine the step times come from a nominal CPU core, not this machine's: they rank the rows, but a
# measured step can differ from them by orders of magnitude (700x on a loaded 2-core machine).
NOMINAL_NOTE = ("note: no --machine given: step times and tokens/s are the nominal cpu profile's (a laptop-class core, "
                "not this machine): they rank the rows, but measured figures can differ by orders of magnitude; "
                "--machine calibrate measures this machine once (cached; --recalibrate to measure again), "
                "--machine h100 / h200 / a100 prices those GPUs")


def add_plan_parser(sub, launch=None) -> None:
    """`launch`: how `--trial` measures one candidate (planner/trials.py `Launch`), handed in by the runtime
    (ds_hetero/cli.py: trial_runner.launch_one); None: `--trial` is refused."""
    p = sub.add_parser("plan", help="rank every valid layout and placement of a model by predicted step time")
    p.add_argument("--model", required=True,
                   help="an HF config.json, a checkpoint directory, or tiny-llava / tiny-qwen2-vl")
    p.add_argument("--world-size", type=int, required=True)
    p.add_argument("--seq-len", type=int, required=True, help="language tokens per sample, image tokens included")
    p.add_argument("--image-tokens", type=int, help="image tokens per sample the language model receives")
    p.add_argument("--encoder-tokens", type=int,
                   help="instead of --image-tokens: tokens per sample the encoder sees (before its spatial merge)")
    p.add_argument("--rows", action="append", default=[], metavar="STAGE=N",
                   help="a model with several encoders: boundary rows per sample of encoder STAGE (repeat per "
                        "encoder; --image-tokens gives the vision stage's)")
    p.add_argument("--global-batch", type=int, help="samples per optimizer step (required unless --price)")
    p.add_argument("--lengths", metavar="FILE|sft[:SEED[:SCALE]]",
                   help="a length mix: language tokens per sample of the batch (a file of integers, or the seeded "
                        "SFT-shaped mix of toy/length_mix.py), priced as --config's language_batching cuts it")
    p.add_argument("--attention", choices=ATTENTION_KERNELS, default="model",
                   help="how packed rows are priced with --lengths: as the runtime attends in them for the model's "
                        "attn_implementation and --config's packed_attention (model, the default; sdpa and eager "
                        "per sample unless \"row_mask\"), as a varlen kernel (varlen: one row per rank, each "
                        "sample's own attention), or dense (each row scored whole)")
    p.add_argument("--machine", default=None,
                   help="h100, h200, a100, cpu or calibrate (measure this machine); default cpu, a nominal profile")
    p.add_argument("--recalibrate", action="store_true", help="with --machine calibrate: measure again")
    p.add_argument("--memory-gb", type=float, help="memory per device (default: the machine's)")
    p.add_argument("--config", help="a DeepSpeed JSON whose other settings (ZeRO, optimizer, bf16, each "
                        "stage's freeze) every candidate keeps")
    p.add_argument("--zero", type=int, choices=(0, 1, 2, 3), help="ZeRO stage (default: --config's, else 1)")
    p.add_argument("--placement", choices=("colocated", "disaggregated", "mixed"),
                   help="only this placement (mixed: models with several encoders)")
    p.add_argument("--micro-batches", type=int, nargs="+", help="only these micro-batch counts")
    p.add_argument("--pp", type=int,
                   help="only layouts whose language stage has this many pipeline stages (the table, the pick and "
                        "--write; the baselines too)")
    p.add_argument("--max-tp", type=int, help="largest tp to consider (default: devices per node)")
    p.add_argument("--top", type=int, default=10)
    p.add_argument("--breakdown", type=int, default=3, help="rows of the per-stage breakdown")
    p.add_argument("--no-modelled", action="store_true",
                   help="search only layouts without a language pipeline, first_stage, recompute or per-stage "
                        "ZeRO (faster; no Megatron baseline)")
    p.add_argument("--batch-slack", type=float, default=0.0,
                   help="a disaggregated split may round the global batch down by this fraction (e.g. 0.1)")
    p.add_argument("--trial", type=int, default=0, metavar="K",
                   help="run the top K runnable candidates for a few steps with the deepspeed launcher on this "
                        "machine and re-rank them by measured step time (tiny-* models or a checkpoint)")
    p.add_argument("--trial-steps", type=int, default=3, help="steps per trial (the first is not timed)")
    p.add_argument("--write", help="write the top pick as a DeepSpeed JSON here")
    p.add_argument("--price", metavar="CONFIG.json",
                   help="no search: price exactly the layout of this DeepSpeed JSON's hetero_parallel section (checked "
                        "as `ds-hetero validate CONFIG --model M`; the global batch is its train_batch_size, "
                        "--global-batch must agree when given): step time, TFLOP/s per GPU (whole model and "
                        "language only), tokens/s per GPU, memory per rank, the breakdown")
    p.add_argument("--json", action="store_true", help="with --price: print the figures as one JSON object")
    p.set_defaults(func=run_plan, launch=launch)


def read_lengths(source: str | None, global_batch: int) -> list[int] | None:
    """`--lengths`: "sft", "sft:SEED" or "sft:SEED:SCALE" (the seeded SFT-shaped mix, one length per
    sample of the batch), or a file of integers (whitespace, commas or a JSON list), at least one per sample."""
    if source is None:
        return None
    if source == "sft" or source.startswith("sft:"):
        from ..toy.length_mix import sft_lengths

        parts = [int(x) for x in source.split(":")[1:]]
        seed, scale = (parts[0] if parts else 0), (parts[1] if len(parts) > 1 else 1)
        return sft_lengths(global_batch, scale=scale, seed=seed)
    try:
        with open(source) as f:
            text = f.read()
        return [int(x) for x in text.replace("[", " ").replace("]", " ").replace(",", " ").split()]
    except (OSError, ValueError) as exc:
        raise ValueError(f"--lengths {source}: {exc} (give a file of integer sample lengths, or sft[:SEED])") from exc


def run_price(args: argparse.Namespace) -> int:
    """`--price CONFIG.json`: one layout's figures, as text or JSON (planner/price.py)."""
    import json

    from ..config import read_ds_config
    from .calibrate import machine_profile
    from .price import price, priced_text

    try:
        ds = read_ds_config(args.price)
        batch = ds.get("train_batch_size")
        if args.global_batch is not None and batch != args.global_batch:
            raise ValueError(f"--global-batch {args.global_batch} but {args.price} has train_batch_size {batch!r}")
        machine = machine_profile(args.machine or "cpu", refresh=args.recalibrate,
                                  log=lambda m: print(m, file=sys.stderr))
        lengths = read_lengths(args.lengths, batch) if isinstance(batch, int) else None
        priced = price(args.model, ds, args.world_size, args.seq_len, machine, args.image_tokens, args.encoder_tokens,
                       parse_rows(args.rows), lengths, args.attention, args.memory_gb)
    except (HeteroConfigError, ValueError) as exc:
        print(f"plan: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({**priced.as_dict(), "machine": machine.name}, indent=1))
        return 0
    if args.machine is None:
        print(NOMINAL_NOTE)
    print(priced_text(priced))
    return 0


def run_plan(args: argparse.Namespace) -> int:
    from ..config import read_ds_config
    from .calibrate import machine_profile
    from .report import breakdown_table, ranked_table
    from .search import base_config, plan, write_config

    if args.price:
        return run_price(args)
    if args.global_batch is None:
        print("plan: --global-batch is required (unless --price CONFIG.json, whose train_batch_size is used)",
              file=sys.stderr)
        return 1
    try:
        base = read_ds_config(args.config) if args.config else None
        if base is not None:  # the checks `ds-hetero validate` runs, before any of it is dropped
            from .base_check import check_base
            from .search import DEFAULT_OPTIMIZER

            check_base(base, args.world_size, args.global_batch, DEFAULT_OPTIMIZER)
        machine = machine_profile(args.machine or "cpu", refresh=args.recalibrate,
                                  log=lambda m: print(m, file=sys.stderr))
        if base is None:
            base = base_config(None, args.global_batch, args.zero, machine.dtype_bytes == 2)
        elif args.zero is not None:
            base = base_config(base, args.global_batch, args.zero, False)
        result = plan(args.model, args.world_size, args.seq_len, args.image_tokens, args.global_batch, machine,
                      base=base, memory_gb=args.memory_gb, max_tp=args.max_tp,
                      placements=(args.placement,) if args.placement else None,
                      micro_batches=tuple(args.micro_batches) if args.micro_batches else None,
                      modelled=not args.no_modelled, batch_slack=args.batch_slack,
                      encoder_tokens=args.encoder_tokens, rows=parse_rows(args.rows),
                      lengths=read_lengths(args.lengths, args.global_batch), attention=args.attention)
    except (HeteroConfigError, ValueError) as exc:
        print(f"plan: {exc}", file=sys.stderr)
        return 1
    if args.pp:  # a view of the ranking: the search itself is the same
        result = replace(result, predictions=[p for p in result.predictions if p.candidate.language.pp == args.pp])
    if not result.predictions:
        print(f"plan: no valid configuration{f' with language pp {args.pp}' if args.pp else ''} "
              f"({result.stats['reasons']})", file=sys.stderr)
        return 1
    if args.machine is None:
        print(NOMINAL_NOTE)
    print(ranked_table(result, args.top))
    print()
    print(breakdown_table(result, args.breakdown))
    if not result.runnable:
        print("plan: no configuration the engine runs today (the rows above are modelled only)", file=sys.stderr)
        return 1 if (args.trial or args.write) else 0
    chosen = result.best
    if args.trial and len(result.spec.encoders) > 1:
        print("plan: --trial does not run models with several encoders yet", file=sys.stderr)
        return 1
    if args.trial and getattr(args, "launch", None) is None:
        print("plan: --trial needs a trial launcher (run it as ds-hetero plan)", file=sys.stderr)
        return 1
    if args.trial:
        from .trials import launch_trials, trial_table

        try:
            trials = launch_trials(args.model, result, args.trial, args.world_size, args.launch, steps=args.trial_steps,
                                   log=lambda m: print(m, file=sys.stderr, flush=True))
        except (HeteroConfigError, ValueError, RuntimeError) as exc:
            print(f"plan: trials failed: {exc}", file=sys.stderr)
            return 1
        print()
        print(trial_table(trials))
        chosen = trials[0].prediction
    if args.write:
        write_config(args.write, result.ds_config(chosen))
        print(f"\nwrote {args.write}: {chosen.candidate.label()} "
              f"(check: ds-hetero validate {args.write} --world-size {args.world_size})")
    return 0


def parse_rows(items) -> dict[str, int]:
    """`--rows STAGE=N` (repeated) as {stage: rows}."""
    rows = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not value.strip().isdigit():
            raise ValueError(f"--rows {item!r}: give STAGE=N, e.g. --rows audio=50")
        rows[name.strip()] = int(value)
    return rows
