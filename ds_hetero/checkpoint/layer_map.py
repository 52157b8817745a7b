"""The layer cut of a pipelined stage in a checkpoint: where each chunk's files are, and how a
chunk's parameters map to the model's own (Hugging Face) names.

A pipelined language stage (pp > 1) is saved by each pipeline chunk's engine into its own folder,

    DIR/<tag>/language/pp_00/params.json, DIR/<tag>/language/pp_00/<tag>/...   chunk 0
    DIR/<tag>/language/pp_01/...                                             chunk 1 ...

(a stage without a pipeline keeps its files in DIR/<tag>/<stage>/ itself). A chunk's engine names
its parameters locally (`decoder.layers.0...` is global layer `start + 0`); params.json records,
for every parameter, that local name and the model's name (`model.language_model.layers.2...`),
and the chunk's layer range. The model's names are the key on which chunks of any cut meet: the
full state of a stage (full_state.py) is keyed by them, and a rank of any layout reads its
chunk's parameters out of it by them. Embeddings travel with chunk 0's files and the final norm
and head with the last chunk's, as they are held.

`check_layer_map` verifies the recorded map against the manifest's cut before anything is
loaded: each chunk's layers are exactly its range of the cut, every local layer index plus the
chunk's start is the model's layer index, and no parameter is saved by two chunks.

Tied input/output embeddings with pp > 1: the first chunk's embedding and the last chunk's head
are two copies of one model parameter (stages/tied_embeddings.py), recorded under the model's one
name; the head's is marked `shared_copy` and left out of the full state (`saved_entries`), which
keeps the first chunk's. Loading into any layout restores every copy, and its optimizer state,
from that one tensor, as the model names of both copies are the same.
"""

from __future__ import annotations

import os
import re
from typing import Any

from ..pipeline_parallel.cut import layer_cut

CHUNK = "pp_{:02d}"
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.(.+)$")


def chunk_folder(index: int) -> str:
    return CHUNK.format(index)


def saved_pp(manifest: dict[str, Any], stage: str) -> int:
    """The pipeline stages the checkpoint's stage was saved with (1 in manifests without a pipeline)."""
    return int(manifest["stages"][stage].get("pp", 1))


def part_dirs(ckpt_dir: str, stage: str, pp: int) -> list[str]:
    """The folders holding a saved stage's files: the stage's own, or one per pipeline chunk."""
    base = os.path.join(ckpt_dir, stage)
    return [base] if pp == 1 else [os.path.join(base, chunk_folder(k)) for k in range(pp)]


def stage_dir(root: str, stage) -> str:
    """Where this rank's engine of `stage` (a live Stage) writes: its chunk's folder with a pipeline."""
    base = os.path.join(root, stage.name)
    return os.path.join(base, chunk_folder(stage.coord.pp)) if stage.pipeline else base


def current_counts(stages, name: str) -> list[int] | None:
    """Layers per pipeline chunk of the running stage `name` (None without a pipeline)."""
    cfg = stages.config
    layout = cfg.stages[name]
    if layout.pp == 1:
        return None
    if cfg.pp_layers is not None:
        return list(cfg.pp_layers)
    module = stages[name].module
    decoder = getattr(module, "decoder", None)  # a PipelineChunk keeps the decoder's own config
    n = decoder.config.num_hidden_layers if decoder is not None else len(module.language_model.layers)
    return [len(r) for r in layer_cut(n, layout.pp, None)]


def chunk_record(stage) -> dict[str, Any] | None:
    """params.json's record of this rank's chunk: its index and layer range [start, stop)."""
    if not stage.pipeline:
        return None
    layers = stage.engine.module.layers
    return {"index": stage.coord.pp, "layers": [layers.start, layers.stop]}


def check_layer_map(metas: list[dict[str, Any]], counts: list[int] | None, where: str) -> str | None:
    """Why the chunks' params.json do not agree with the cut `counts` (None if they do)."""
    if counts is None:
        return None
    cut = [(r.start, r.stop) for r in layer_cut(sum(counts), len(counts), tuple(counts))]
    owner: dict[str, int] = {}
    shared: list[tuple[int, str, str]] = []
    for k, (meta, (start, stop)) in enumerate(zip(metas, cut, strict=True)):
        recorded = (meta.get("chunk") or {}).get("layers")
        if recorded is not None and tuple(recorded) != (start, stop):
            return (f"{where}: chunk {k} holds layers {recorded[0]}..{recorded[1] - 1}, but the manifest's cut "
                    f"{counts} gives it {start}..{stop - 1} (a wrong layer map)")
        seen = set()
        for local, info in meta["params"].items():
            hf = info["hf_name"]
            if info.get("shared_copy"):  # a tied weight's second copy: its first chunk's entry is the saved one
                shared.append((k, local, hf))
                continue
            if hf in owner:
                return f"{where}: {hf} is saved by chunks {owner[hf]} and {k} (a wrong layer map)"
            owner[hf] = k
            m_local, m_hf = _LAYER.search(local), _LAYER.search(hf)
            if m_local is None:
                continue  # embeddings, final norm, head: no layer index
            if m_hf is None or m_hf.group(2) != m_local.group(2) or int(m_hf.group(1)) != start + int(m_local.group(1)):
                return (f"{where}: chunk {k}'s {local} is recorded as {hf}, but the cut {counts} starts chunk {k} at "
                        f"layer {start} (a wrong layer map)")
            seen.add(int(m_hf.group(1)))
        if seen and seen != set(range(start, stop)):
            return (f"{where}: chunk {k} holds layers {sorted(seen)}, but the manifest's cut {counts} gives it "
                    f"{start}..{stop - 1} (a wrong layer map)")
    for k, local, hf in shared:  # the copy stands for a parameter another chunk saves (tied embeddings)
        if owner.get(hf, k) == k:
            return (f"{where}: chunk {k}'s {local} is marked as a shared copy of {hf}, but no other chunk saves "
                    f"{hf} (a wrong layer map)")
    return None


def saved_entries(meta: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A chunk's params.json entries whose tensors its files contribute to the full state: all but
    a tied weight's shared copy (the first chunk's copy is that parameter's one saved tensor; both
    copies hold the same weights and optimizer state, as they take identical steps)."""
    return {local: info for local, info in meta["params"].items() if not info.get("shared_copy")}


def hf_names(module, model) -> dict[str, str]:
    """The module's parameter names -> the model's own names (the module's name where the model has
    none for it)."""
    names = {id(p): n for n, p in model.named_parameters()}
    return {n: names.get(id(p), n) for n, p in module.named_parameters()}
