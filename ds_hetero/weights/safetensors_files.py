"""A Hugging Face safetensors checkpoint read tensor by tensor, slice by slice.

    ckpt = SafetensorsCheckpoint(model, "path/to/dir")     # headers only: names, shapes, dtypes
    ckpt.check(model)                                     # every tensor present, full shapes equal
    out = torch.empty(512, 64)
    ckpt.read_into("model.language_model.layers.0.mlp.down_proj.weight", out, runs=[(0, 64)], dim=1)

A directory holds `model.safetensors.index.json` (sharded) or one `model.safetensors`. Names
are the model's own (its `state_dict` keys). transformers 5 writes some families in an older
layout (`save_pretrained` reverts its load-time renamings: LLaVA's `language_model.model.*`,
Qwen2-VL's `model.layers.*`); the checkpoint's names are mapped onto the model's with
transformers' own conversion table (`get_model_conversion_mapping` + `rename_source_key`), the
same one `from_pretrained` applies. Renamings, and two operations that commute with reading a
slice of the experts: a transpose inside each expert (Qwen3-VL-MoE) and experts stored one tensor
per expert (Qwen3.5-MoE: merged_experts.py). Any other operation (fusing qkv, ...) needs whole tensors
and is refused by name.

Reads go through safetensors' `safe_open(...).get_slice(...)` on its memory map, so only the pages
of the requested slice are touched. The file is opened for each tensor and closed right after
it is copied: mapped file pages count in the process's resident memory while the map is open,
so one map held over a whole multi-GB shard would add the pages of every slice read from it to
the peak. (safetensors' `pread` backend is no better: it reads the whole tensor, then slices.)
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from typing import Iterator

import torch
from torch import nn

from .merged_experts import MergedExperts, converter_of, is_merge

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


class WeightsError(ValueError):
    """The weights directory does not fit the model; the message names the tensor and the fix."""


def _open(path: str):
    from safetensors import safe_open

    return safe_open(path, framework="pt", device="cpu")


def _files(directory: str) -> dict[str, str]:
    """checkpoint tensor name -> file path."""
    if not os.path.isdir(directory):
        raise WeightsError(f"weights={directory!r}: not a directory; pass a Hugging Face checkpoint directory "
                           f"(holding {INDEX} or {SINGLE})")
    index = os.path.join(directory, INDEX)
    if os.path.exists(index):
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
        return {name: os.path.join(directory, file) for name, file in weight_map.items()}
    single = os.path.join(directory, SINGLE)
    if os.path.exists(single):
        with _open(single) as f:
            return {name: single for name in f.keys()}
    raise WeightsError(f"weights={directory!r}: neither {INDEX} nor {SINGLE} found; only safetensors checkpoints "
                       f"(as save_pretrained writes them) are read")


def _swaps(model: nn.Module, checkpoint_names) -> dict[str, tuple[int, int]]:
    """checkpoint name -> the dims of its per-slice transpose (`_swap_of`), for those that have one."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightConverter, rename_source_key

    transforms = get_model_conversion_mapping(model)
    renamings = [t for t in transforms if not isinstance(t, WeightConverter)]
    converters = [t for t in transforms if isinstance(t, WeightConverter)]
    state = dict.fromkeys(model.state_dict())
    prefix = getattr(model, "base_model_prefix", None)
    out = {}
    for name in checkpoint_names:
        _, converter = rename_source_key(name, renamings, converters, prefix, state)
        swap = None if converter is None else _swap_of(converters, converter)
        if swap is not None:
            out[name] = swap
    return out


def _model_names(model: nn.Module, checkpoint_names) -> tuple[dict[str, str], dict[str, MergedExperts]]:
    """(model state key -> checkpoint name, by transformers' own load-time renamings; model state key ->
    its experts' checkpoint tensors, for those stored one per expert: named after themselves in the first)."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightConverter, rename_source_key

    transforms = get_model_conversion_mapping(model)
    renamings = [t for t in transforms if not isinstance(t, WeightConverter)]
    converters = [t for t in transforms if isinstance(t, WeightConverter)]
    state = dict.fromkeys(model.state_dict())  # names only: the values may be on the meta device
    prefix = getattr(model, "base_model_prefix", None)
    mapping, merged = {}, {}
    for name in checkpoint_names:
        renamed, converter = rename_source_key(name, renamings, converters, prefix, state)
        if converter is not None and _swap_of(converters, converter) is not None:
            mapping.setdefault(renamed, name)  # a per-slice transpose: SafetensorsCheckpoint applies it
            continue
        merge = None if converter is None else converter_of(converters, converter)
        if merge is not None and is_merge(merge):  # one tensor per expert: SafetensorsCheckpoint stacks them
            merged.setdefault(renamed, MergedExperts(tuple(merge.source_patterns), {})).add(name, converter)
            mapping[renamed] = renamed
            continue
        if converter is not None:
            raise WeightsError(
                f"checkpoint tensor {name!r} needs transformers' conversion {converter!r} (an operation on whole "
                f"tensors), which per-shard loading does not apply; load this model fully built "
                f"(from_pretrained) and pass it without weights=")
        mapping.setdefault(renamed, name)
    return mapping, merged


def _swap_of(converters, pattern) -> tuple[int, int] | None:
    """(d0, d1) when the converter of `pattern` is one transpose of two dims other than 0, from a
    name to itself (Qwen3-VL-MoE's experts, stored [E, H, 2I] on the Hub, [E, 2I, H] in the model):
    it commutes with reading a slice of dim 0 (the experts an ep rank holds), so per-shard
    loading transposes each slice; None for any other conversion."""
    from transformers.core_model_loading import Transpose

    for c in converters:
        sources = getattr(c, "source_patterns", ())
        if pattern in sources and list(sources) == list(getattr(c, "target_patterns", ())):
            ops = list(getattr(c, "operations", ()))
            if len(ops) == 1 and isinstance(ops[0], Transpose) and 0 not in (ops[0].dim0, ops[0].dim1):
                return ops[0].dim0, ops[0].dim1
    return None


def _swapped(shape, swap) -> tuple[int, ...]:
    shape = list(shape)
    shape[swap[0]], shape[swap[1]] = shape[swap[1]], shape[swap[0]]
    return tuple(shape)


class SafetensorsCheckpoint:
    """Names, shapes and dtypes of a checkpoint's tensors (from the headers), keyed by model name."""

    def __init__(self, model: nn.Module, directory: str | os.PathLike):
        self.directory = os.fspath(directory)
        self.file_of = _files(self.directory)  # checkpoint name -> file
        # model name -> checkpoint name (a fused expert tensor stored per expert: its own name, in `merged`)
        self.name_of, self.merged = _model_names(model, self.file_of)
        self.swap_of = _swaps(model, self.file_of)  # checkpoint name -> dims a per-slice transpose may swap
        self.transposed: dict[str, tuple[int, int]] = {}  # those stored transposed (found by check)
        self.shape_of: dict[str, tuple[int, ...]] = {}
        self.dtype_of: dict[str, str] = {}
        by_file = defaultdict(list)
        for name, file in self.file_of.items():
            by_file[file].append(name)
        for file, names in by_file.items():
            if not os.path.exists(file):
                raise WeightsError(f"weights={self.directory!r}: the index names {os.path.basename(file)}, "
                                   f"which is missing")
            with _open(file) as f:
                for name in names:
                    sl = f.get_slice(name)
                    self.shape_of[name], self.dtype_of[name] = tuple(sl.get_shape()), sl.get_dtype()
        for name, experts in self.merged.items():
            missing = experts.complete()
            if missing:
                raise WeightsError(f"weights={self.directory!r}: {name!r} is stored one tensor per expert, but {missing}")
            self.shape_of[name], self.dtype_of[name] = experts.shape(self.shape_of), self.dtype_of[experts.pieces(0)[0]]

    def check(self, model: nn.Module) -> None:
        """Every parameter and persistent buffer is in the checkpoint with its full (unsharded) shape.

        Tied parameters (one tensor under several names) need one of their names. Pure: reads only
        the model's metadata and the headers, so every rank raises the same error before any
        collective.
        """
        names_of = defaultdict(list)  # one entry per tensor, all its names
        for name, t in tensors_by_name(model):
            names_of[id(t)].append((name, t))
        for entries in names_of.values():
            present = [(n, t) for n, t in entries if n in self.name_of]
            if not present:
                raise WeightsError(
                    f"weights={self.directory!r} has no tensor for {entries[0][0]!r} (nor any name transformers "
                    f"maps onto it); is this the checkpoint of this model ({type(model).__name__})?")
            name, t = present[0]
            key = self.name_of[name]
            want, got = tuple(t.shape), self.shape_of[key]
            swap = self.swap_of.get(key)
            if want != got and swap is not None and _swapped(got, swap) == want:
                self.transposed[key] = swap
                continue
            if want != got:
                raise WeightsError(
                    f"weights={self.directory!r}: {self.name_of[name]!r} has shape {list(got)} but the model's "
                    f"{name!r} is {list(want)}; the model's config does not match the checkpoint's")

    def key(self, model_name: str) -> str | None:
        return self.name_of.get(model_name)

    def read_into(self, model_name: str, out: torch.Tensor, runs=None, dim: int = 0) -> int:
        """Copy the tensor (or its rows [start, stop) along `dim`, run after run) into `out`."""
        name = self.name_of[model_name]
        if name in self.merged:
            return self._read_experts(self.merged[name], out, runs, dim)
        swap = self.transposed.get(name)
        if swap is None:
            return read_into(self.file_of[name], name, out, runs, dim)
        if dim in swap:
            raise WeightsError(f"{name!r} is stored transposed on dims {swap}; a slice along dim {dim} cannot be read")
        stored = torch.empty(_swapped(out.shape, swap), dtype=out.dtype, device=out.device)
        numel = read_into(self.file_of[name], name, stored, runs, dim)
        out.copy_(stored.transpose(*swap))
        return numel

    def _read_experts(self, experts: MergedExperts, out: torch.Tensor, runs, dim: int) -> int:
        """Experts (all, or those of each run along dim 0) from their own tensors, concatenated inside each."""
        if runs is not None and dim != 0:
            raise WeightsError(f"{experts.patterns[0]!r} is stored one tensor per expert; only whole experts "
                               f"(a slice along dim 0) can be read, not dim {dim}")
        wanted = [e for a, b in (runs or [(0, experts.experts())]) for e in range(a, b)]
        numel = 0
        for k, e in enumerate(wanted):
            offset = 0
            for piece in experts.pieces(e):
                rows = self.shape_of[piece][0]
                numel += read_into(self.file_of[piece], piece, out[k].narrow(0, offset, rows))
                offset += rows
        return numel

    def itemsize(self, name: str) -> int:
        """Bytes per element of checkpoint tensor `name` as stored."""
        return _ITEMSIZE[self.dtype_of[name]]


_ITEMSIZE = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2, "U16": 2,
             "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


def _copy(out: torch.Tensor, t: torch.Tensor, name: str) -> int:
    if tuple(t.shape) != tuple(out.shape):  # copy_ would broadcast silently
        raise WeightsError(f"{name!r}: read {list(t.shape)} for a destination of {list(out.shape)}")
    out.copy_(t)
    return t.numel()


def read_into(path: str, name: str, out: torch.Tensor, runs=None, dim: int = 0) -> int:
    """Copy tensor `name` of the file, whole (`runs` None) or the rows of each (start, stop) run
    along `dim` one after the other, into the front of `out` (cast to its dtype and device);
    returns the elements read. The file is mapped only during the call."""
    with _open(path) as f:
        if runs is None:
            return _copy(out, f.get_tensor(name), name)
        sl, offset, numel = f.get_slice(name), 0, 0
        for start, stop in runs:
            numel += _copy(out.narrow(dim, offset, stop - start), sl[(slice(None),) * dim + (slice(start, stop),)], name)
            offset += stop - start
        return numel


def tensors_by_name(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """Every (state key, tensor) of the model: parameters (tied ones under each name), persistent buffers."""
    yield from model.named_parameters(remove_duplicate=False)
    state = set(model.state_dict(keep_vars=True))
    for name, buf in model.named_buffers(remove_duplicate=False):
        if name in state:
            yield name, buf
