"""A language micro-batch of packed rows: several samples end to end, each with its own positions.

`packed_language_inputs(adapter, rows)` lays each row's samples end to end (step/packing.py says
which samples share a row) and right-pads every row to the longest, rounded up to `multiple`.
What keeps the samples apart is what transformers 5 does for packed sequences, not a kernel of
ours: with no `attention_mask` and `position_ids` that restart at 0 at every sample,
`masking_utils.find_packed_sequence_indices` finds the samples and `create_causal_mask` builds a
block-diagonal causal mask for sdpa and eager (flash-attention varlen takes the same positions).
Under sequence shards the language stage passes the full mask itself (context_parallel/
sequence.py `packed_attention_mask`, from `sequence_ids`).

Per sample, exactly what the adapter gives that sample alone (`language_inputs([sample])`):
its ids, its labels, its positions. mRoPE families (Qwen2-VL, 2.5-VL, 3-VL, Omni) thus compute
their 3-D positions per sample with the model's own `get_rope_index`; the rows carry them as
`[4, R, L]`, the first plane the text positions (0..n-1 per sample) from which the decoder
derives the packed mask (the convention of transformers' Qwen2-VL family).

The loss never crosses a sample: the first label of every sample is set to -100. Position t
predicts the label at t+1, so that label was only ever the target of the previous sample's last
token; inside its own sample no position predicts a sample's first token.

Padding is one more segment (positions 0.. again, pad ids, labels -100): it attends to itself
only and takes no loss. `packed_segments` lists every row's segment lengths (padding last) for the
per-sample attention (models/per_sample_attention.py), which needs them on the host.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from ..loss import IGNORE_INDEX


def _sample_parts(adapter, sample: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(ids [n], labels [n], positions: None, [n] or [k, n]) of one sample on its own."""
    one = adapter.language_inputs([sample])
    positions = one["position_ids"]
    if positions is not None:
        positions = positions[..., 0, :] if positions.dim() == 3 else positions[0]
    return one["input_ids"][0], one["labels"][0], positions


def packed_language_inputs(adapter, rows: Sequence[Sequence[dict[str, Any]]], multiple: int = 1
                           ) -> dict[str, Any]:
    """`input_ids`, `labels`, `position_ids` ([R, L], or [4, R, L] for mRoPE), `sequence_ids`
    (the sample index of every token inside its row, padding its own), `attention_mask` None and
    `packed_segments`: each row's segment lengths on the host, its samples' and then its padding's
    (what models/per_sample_attention.py attends over)."""
    parts = [[_sample_parts(adapter, s) for s in row] for row in rows]
    longest = max(sum(int(ids.numel()) for ids, _, _ in row) for row in parts)
    length = max(1, -(-longest // multiple)) * multiple  # rows of empty samples only: one padding position
    planes = {p.shape[0] for row in parts for _, _, p in row if p is not None and p.dim() == 2}
    if len(planes) > 1:
        raise ValueError(f"samples of one micro-batch give position planes {sorted(planes)}")
    k = planes.pop() if planes else 0  # mRoPE planes (0: plain 1-D positions)
    shape = (len(rows), length)
    ids = torch.full(shape, adapter.pad_token_id, dtype=torch.long)
    labels = torch.full(shape, IGNORE_INDEX, dtype=torch.long)
    text = torch.zeros(shape, dtype=torch.long)
    rope = torch.zeros((k, *shape), dtype=torch.long) if k else None
    segments = torch.zeros(shape, dtype=torch.long)
    lengths: list[tuple[int, ...]] = []
    for r, row in enumerate(parts):
        offset = 0
        for i, (sample_ids, sample_labels, positions) in enumerate(row):
            n = int(sample_ids.numel())
            span = slice(offset, offset + n)
            ids[r, span], labels[r, span] = sample_ids, sample_labels
            if n:  # an empty sample holds no token (and no segment to attend: per_sample_attention skips it)
                labels[r, offset] = IGNORE_INDEX  # the previous sample's last token predicts nothing
            text[r, span] = torch.arange(n)
            if rope is not None:
                rope[:, r, span] = positions if positions is not None and positions.dim() == 2 else torch.arange(n)
            segments[r, span] = i
            offset += n
        pad = length - offset
        lengths.append(tuple(int(ids.numel()) for ids, _, _ in row) + ((pad,) if pad else ()))
        text[r, offset:] = torch.arange(pad)
        if rope is not None:
            rope[:, r, offset:] = torch.arange(pad)
        segments[r, offset:] = len(row)
    position_ids = torch.cat([text[None], rope]) if rope is not None else text
    return {"input_ids": ids, "attention_mask": None, "labels": labels, "position_ids": position_ids,
            "sequence_ids": segments, "packed_segments": tuple(lengths)}
