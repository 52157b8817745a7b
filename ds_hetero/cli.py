"""`ds-hetero` command line: validate a config and show its rank map; plan the layouts.

    ds-hetero validate ds_configs/llava_colocated.json --world-size 4 [--model tiny-llava]
    ds-hetero validate trainer_auto.json --world-size 4 --per-device-train-batch-size 4   ("auto" JSON)
    ds-hetero validate zero3.json --world-size 4 --hetero-parallel hetero.yaml            (inline section)
    ds-hetero checkpoint info CKPT_DIR          (checkpoint/commands.py)
    ds-hetero checkpoint convert CKPT_DIR --to-hf OUT
    ds-hetero plan --model tiny-llava --world-size 4 --seq-len 512 --image-tokens 256 --global-batch 16

validate: exit code 0 with the rank map when the config is valid for that world size, 1 with the
validation error otherwise. `validate` runs the checks `initialize` runs before its first
collective (ds_hetero/validation.py); with `--model` (a Hugging Face checkpoint directory or
config.json, or a built-in tiny model) also the model's own (heads, kv heads, vocabulary against
tp), on a model built on the meta device: no weights are read. An `"auto"` section is checked for
its keys (initialize plans it). plan: the ranked table of every valid configuration
(ds_hetero/planner), optionally written as a DeepSpeed JSON with --write.
"""

from __future__ import annotations

import argparse
import sys

from .config import ENCODER_STAGES, HeteroConfig, load_config
from .errors import HeteroConfigError
from .validation import check_all

# `validate` of a JSON file imports no torch, DeepSpeed or transformers (a fraction of a second, not
# 10 s): the model families, the planner and the checkpoint tools are imported where a command needs them.


def rank_map(cfg: HeteroConfig) -> str:
    """A table: one row per global rank, one column per stage with the rank's (tp, cp, dp)."""
    lines = [
        f"placement {cfg.placement}, world size {cfg.world_size}, global batch {cfg.global_batch_size}, "
        f"micro_batches {cfg.micro_batches}, encoder balance {cfg.balance}",
        "",
    ]
    header = ["stage", "layout", "ranks", "seq-parallel", "micro-batches", "samples/micro-batch/dp-rank", "ZeRO",
              "memory options"]
    rows = [
        [name, f"tp{l.tp} cp{l.cp} dp{l.dp}" + (f" pp{l.pp}" if l.pp > 1 else ""), _ranges(l.ranks), "yes" if l.sequence_parallel else "no",
         str(cfg.micro_batches_of(name)),
         str(cfg.micro_batch_size(name)) + (" (items by cost)" if name != "language" and cfg.balance_of(name) == "tokens"
                                            else " (packed by tokens)" if name == "language" and cfg.packed else ""),
         str(0 if cfg.options_of(name).frozen else cfg.zero_stage_of(name)), _options(cfg.options_of(name))]
        for name, l in cfg.stages.items()
    ]
    lines += _table(header, rows)
    lines.append("")
    # a pipelined stage shows each rank's pipeline stage as a fourth coordinate
    header = ["rank"] + [f"{name} (tp,cp,dp{',pp' if l.pp > 1 else ''})" for name, l in cfg.stages.items()]
    rows = []
    for rank in range(cfg.world_size):
        row = [str(rank)]
        for layout in cfg.stages.values():
            coord = tuple(layout.coord(rank))[: 4 if layout.pp > 1 else 3] if layout.contains(rank) else None
            row.append(",".join(map(str, coord)) if coord else "-")
        rows.append(row)
    lines += _table(header, rows)
    return "\n".join(lines)


def _options(options) -> str:
    """recompute and freeze of a stage (its ZeRO stage has its own column)."""
    parts = [p for p in options.describe().split(", ") if not p.startswith("ZeRO")]
    return ", ".join(p for p in parts if p != "-") or "-"


def _ranges(ranks: tuple[int, ...]) -> str:
    """(0, 1, 2, 5) -> '0-2,5', keeping the stage's own order."""
    parts, start, prev = [], ranks[0], ranks[0]
    for r in ranks[1:] + (None,):
        if r is not None and r == prev + 1:
            prev = r
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if r is not None:
            start = prev = r
    return ",".join(parts)


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(x) for x in col) for col in zip(header, *rows)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return [fmt.format(*header).rstrip(), fmt.format(*("-" * w for w in widths))] + [fmt.format(*r).rstrip() for r in rows]


def _validate(args: argparse.Namespace) -> int:
    from .config import SECTION, read_ds_config
    from .integrations.ds_config import fill_trainer_auto
    from .integrations.inline import ENV, with_inline_section

    try:
        ds = read_ds_config(args.config)
        if args.hetero_parallel:  # the section given inline (DS_HETERO_PARALLEL), merged as initialize merges it
            ds = with_inline_section(ds, {ENV: args.hetero_parallel})
        ds = fill_trainer_auto(ds, args.world_size, args.per_device_train_batch_size, max_grad_norm=args.max_grad_norm)
        section = ds.get(SECTION)
        maybe_auto = section == "auto" or (isinstance(section, dict) and "auto" in section)
        if maybe_auto and _planner_auto().is_auto(section):  # initialize plans it; check what can be checked now
            _planner_auto().auto_options(section)
            print(f"{args.config}: hetero_parallel is auto; initialize plans it on rank 0 "
                  f"(see the choice with: ds-hetero plan --model ... --world-size {args.world_size})")
            return 0
        cfg = load_config(ds, args.world_size, ENCODER_STAGES)
        model = None
        if args.model:
            from .families.meta import meta_model

            model = meta_model(args.model)
        check_all(cfg, model, has_client_optimizer=args.client_optimizer)
    except HeteroConfigError as exc:
        print(f"invalid: {exc}", file=sys.stderr)
        return 1
    print(f"{args.config}: valid for {args.world_size} ranks\n")
    print(rank_map(cfg))
    from .reporting.layout_line import layout_line  # pure text: no torch on validate's path

    print("\n" + layout_line(cfg))  # the line the run's header and summary print
    return 0


def _planner_auto():
    from .planner import auto  # the planner package imports torch: only for an "auto" section

    return auto


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; given the command (the first argument), only that command's subparser is built, so that
    `validate` never imports what `plan` and `checkpoint` need (torch, DeepSpeed)."""
    parser = argparse.ArgumentParser(prog="ds-hetero", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    validate = sub.add_parser("validate", help="validate a DeepSpeed config's hetero_parallel section, print the rank map")
    validate.add_argument("config", help="DeepSpeed JSON or YAML with a hetero_parallel section")
    validate.add_argument("--world-size", type=int, required=True, help="number of ranks the job will run on")
    validate.add_argument("--model", default=None, metavar="NAME_OR_PATH",
                          help="also check the model's shapes against the layouts: a Hugging Face checkpoint "
                          "directory or config.json, or a built-in tiny model, tiny-<family> as `--model-family` names them "
                          "(tiny-llava, tiny-qwen3-vl-moe, ...), built on the meta device")
    validate.add_argument("--client-optimizer", action="store_true",
                          help="the job passes initialize(..., optimizer=callable): no \"optimizer\" section needed")
    validate.add_argument("--per-device-train-batch-size", type=int, default=None, metavar="N",
                          help='for a Trainer-style JSON with "train_batch_size": "auto": the '
                          "TrainingArguments value (global batch = N x world size)")
    validate.add_argument("--max-grad-norm", type=float, default=1.0,
                          help='for "gradient_clipping": "auto": the TrainingArguments value (default 1.0)')
    validate.add_argument("--hetero-parallel", default=None, metavar="FILE",
                          help="the hetero_parallel section from this JSON/YAML file (what DS_HETERO_PARALLEL "
                          "names), for DeepSpeed configs without it")
    validate.set_defaults(func=_validate)
    if command == "validate":
        return parser
    from .checkpoint.commands import add_parser as add_checkpoint_parser

    add_checkpoint_parser(sub)
    from .planner.cli import add_plan_parser
    from .trial_runner import launch_one

    add_plan_parser(sub, launch=launch_one)  # the planner measures trials through the runtime's launcher
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(argv[0] if argv else None).parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
