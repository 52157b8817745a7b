"""`ds-hetero checkpoint info DIR` and `ds-hetero checkpoint convert DIR --to-hf OUT`.

Both read files only (no process group, no DeepSpeed engine): `info` the manifest, `convert` the
stages' DeepSpeed files merged to full tensors (full_state.py, the same reader a layout change
uses) written by the Hugging Face writer (hf_export.py).
"""

from __future__ import annotations

import argparse
import json
import sys

from .manifest import CheckpointError, format_manifest, read_manifest


def _info(args: argparse.Namespace) -> int:
    try:
        manifest = read_manifest(args.dir, args.tag)
    except CheckpointError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(manifest, indent=1))
    else:
        print(format_manifest(manifest))
    return 0


def _convert(args: argparse.Namespace) -> int:
    from .hf_convert import convert_to_hf

    try:
        out = convert_to_hf(args.dir, args.to_hf, tag=args.tag)
    except CheckpointError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"wrote a Hugging Face checkpoint to {out}")
    return 0


def add_parser(sub) -> None:
    """Add `checkpoint {info, convert}` to the `ds-hetero` command's subparsers."""
    parser = sub.add_parser("checkpoint", help="inspect or convert a ds_hetero checkpoint")
    commands = parser.add_subparsers(dest="checkpoint_command", required=True)
    info = commands.add_parser("info", help="print a checkpoint's manifest (layouts, step, data position, versions)")
    info.add_argument("dir", help="the folder passed to engine.save_checkpoint")
    info.add_argument("--tag", default=None, help="a checkpoint other than the one 'latest' names")
    info.add_argument("--json", action="store_true", help="the raw manifest.json")
    info.set_defaults(func=_info)
    convert = commands.add_parser("convert", help="write a consolidated Hugging Face checkpoint")
    convert.add_argument("dir", help="the folder passed to engine.save_checkpoint")
    convert.add_argument("--to-hf", required=True, metavar="OUT", help="output folder (from_pretrained loads it)")
    convert.add_argument("--tag", default=None, help="a checkpoint other than the one 'latest' names")
    convert.set_defaults(func=_convert)
