"""Packed Gemma 3 and Gemma 4 against the single-process Hugging Face model on the UNPACKED batch.

`train_packed_gemma(rank, world_size, family, layout, ...)`: Gemma 3 through tests/helpers/family_parity.py
`train_family`, Gemma 4 through tests/helpers/gemma4_parity.py `train_gemma4`, with `language_batching`
"packed"; the reference is the model's own `model(**batch).loss` on the padded batch with its
`token_type_ids` / `mm_token_type_ids` (each image's tokens attend to each other both ways, every sample
alone in its row). It also reports what the packed run did, seen by a hook on the first attention module
of the language stage: the most samples one row held (packing happened) and whether each call carried
the samples' own masks (`packed_masks`).

`control` runs a deliberately wrong packed attention (negative controls), everything else packed right:

    "whole-row causal mask"            each row one segment: causal attention and the sliding windows
                                       run across the row's samples (no per-sample boundary)
    "no bidirectional image blocks"    each sample causal inside its windows, without the image blocks
                                       (the family's own per-sample masks withheld)
"""

from contextlib import contextmanager, nullcontext

CONTROLS = ("whole-row causal mask", "no bidirectional image blocks")


@contextmanager
def wrong_packed_attention(control):
    """Packed runs in this process attend as `control` says (LanguageStage.packed_keywords replaced;
    every pipeline chunk binds the same method)."""
    from ds_hetero.models.language_stage import LanguageStage

    own = LanguageStage.packed_keywords
    if control == "whole-row causal mask":
        def wrong(self, ids, hidden, mask, segments):
            out = own(self, ids, hidden, mask, segments)
            return out if segments is None else {"packed_segments": tuple((sum(row),) for row in segments)}
    else:
        def wrong(self, ids, hidden, mask, segments):
            out = own(self, ids, hidden, mask, segments)
            return out if segments is None else {**out, "packed_masks": None}
    LanguageStage.packed_keywords = wrong
    try:
        yield
    finally:  # later cases in the same launch pack right
        LanguageStage.packed_keywords = own


def _observe(engine):
    """{"most_in_a_row": [per call], "own_masks": [per call]}: filled by a hook while the engine trains."""
    language = engine.stages.language
    first = next((m for m in language.module.modules() if type(m).__name__.endswith("Attention")), None) \
        if language.held else None
    seen = {"most_in_a_row": [], "own_masks": []}

    def record(_, args, kwargs):
        segments = kwargs.get("packed_segments")
        if segments is not None:
            seen["most_in_a_row"].append(max(sum(1 for n in row if n) for row in segments))
            seen["own_masks"].append(kwargs.get("packed_masks") is not None)

    if first is not None:
        first.register_forward_pre_hook(record, with_kwargs=True)
    return seen


def train_packed_gemma(rank, world_size, family, layout, control=None, **kw):
    from tests.helpers.family_parity import train_family
    from tests.helpers.gemma4_parity import train_gemma4

    hetero = {"language_batching": "packed", **kw.pop("hetero", {})}
    with wrong_packed_attention(control) if control else nullcontext():
        if family == "gemma4":
            return train_gemma4(rank, world_size, layout, hetero=hetero, inspect=_observe, **kw)
        return train_family(rank, world_size, family, layout, hetero=hetero, inspect=_observe, **kw)
