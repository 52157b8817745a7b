"""What `train_batch` and the Trainer's data path accept as samples, and a collated batch cut back into them.

The engine works on a list of per-sample dicts (`input_ids` 1-D, `labels` 1-D, the model's image
fields): it pads each stage's share itself, in each stage's layout. Clients hand over other shapes:

    a list of dicts whose values are Python lists or numpy arrays   converted to tensors
    a collated batch (one dict of [B, S] tensors, as a data_collator  split per sample by
    returns it: padding, LLaVA pixel_values [N, 3, H, W] for all the    `split_collated`
    batch's images, Qwen2-VL patches [P, D] + image_grid_thw [N, 3],
    its videos' pixel_values_videos + video_grid_thw, the Omni
    thinker's clips [N, mel, frames] + feature_attention_mask)
    a dict where a list is expected, raw dataset rows                 a ValueError saying what to do
    (messages, images, text) that no collator turned into tokens

Splitting by the attention mask keeps exactly the tokens the collator marked real, wherever the
padding sits (right, left, or between a left-padded prompt and its completion), so a sample cut
out of any batch is the sample the collator would have made alone. Images go to samples in order:
sample i owns the next `images_per_sample(input_ids_i)` images (from its placeholder runs), and
its video clips likewise from its video placeholder runs.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import torch

# Per-token fields of a collated batch the engine rebuilds itself (it pads, masks and, for
# Qwen2-VL, computes the M-RoPE position ids per stage share): dropped after the split.
REBUILT_PER_TOKEN = ("attention_mask", "position_ids", "token_type_ids", "mm_token_type_ids", "cache_position")
# Fields with no effect on the model's loss that collators add for the Trainer's own bookkeeping.
IGNORED = ("use_cache", "num_items_in_batch", "return_loss")
RAW_ROW_KEYS = ("messages", "images", "image", "text", "prompt", "completion", "conversations")


def _tensor(value: Any, key: str, index: int) -> Any:
    if value is None or torch.is_tensor(value):
        return value
    if isinstance(value, (list, tuple)) and value and not isinstance(value[0], (int, float, bool, list, tuple)) \
            and not hasattr(value[0], "__array__"):
        raise ValueError(f"sample {index}: '{key}' holds {type(value[0]).__name__} items, not numbers: "
                         f"{raw_rows_hint([key])}")
    try:
        t = torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise ValueError(f"sample {index}: '{key}' ({type(value).__name__}) is not a tensor, list of numbers or "
                         f"numpy array ({exc})") from exc
    return t.long() if key in ("input_ids", "labels", "image_grid_thw") else t


def raw_rows_hint(keys: Sequence[str]) -> str:
    return (f"rows have keys {', '.join(sorted(keys))}: these are raw dataset rows, not token ids. Pass the "
            f"collator that turns them into input_ids / labels / image fields (TRL's SFTTrainer builds one from "
            f"its processing_class: write `ds_hetero.hetero(SFTTrainer)(...)` in place of `SFTTrainer(...)`), or "
            f"map the dataset through the processor first")


def as_sample(item: Any, index: int) -> dict[str, Any]:
    """One per-sample dict with tensor values (lists and numpy arrays converted)."""
    if not isinstance(item, Mapping):
        raise ValueError(f"sample {index} is a {type(item).__name__}, not a dict of input_ids / labels / image fields")
    if "input_ids" not in item:
        raw = [k for k in item if k in RAW_ROW_KEYS]
        if raw:
            raise ValueError(f"sample {index}: {raw_rows_hint(list(item))}")
        return dict(item)  # the adapter's check names the missing field
    return {k: _tensor(v, k, index) if k not in ("light",) else v for k, v in item.items() if k not in IGNORED}


def as_sample_list(samples: Any) -> list[dict[str, Any]]:
    """The global batch as a list of per-sample dicts; a collated dict is refused by name."""
    if isinstance(samples, Mapping):
        keys = ", ".join(list(samples)[:6])
        raise ValueError(
            f"train_batch takes a list of per-sample dicts, got one dict (keys {keys}): a collated batch? "
            f"Split it with ds_hetero.data.split_collated(batch, engine.adapter), or pass the samples before "
            f"collation")
    return [as_sample(s, i) for i, s in enumerate(samples)]


def split_collated(batch: Mapping[str, Any], adapter) -> list[dict[str, Any]]:
    """A collated batch -> per-sample dicts with padding stripped and image fields cut per sample.

    `adapter` (the engine's `engine.adapter`) counts one sample's images from its token ids
    (`image_rows`); a callable `input_ids -> number of images` does too.
    """
    video_id = getattr(adapter, "video_token_id", None)
    if video_id is not None:  # an image tower that takes clips too: its items are of two kinds, counted apart
        def images_per_sample(ids: torch.Tensor) -> int:
            return runs_of(ids, adapter.image_token_id)
    else:
        images_per_sample: Callable[[torch.Tensor], int] = (
            (lambda ids: len(adapter.image_rows({"input_ids": ids}))) if hasattr(adapter, "image_rows") else adapter)
    if not isinstance(batch, Mapping):
        return as_sample_list(batch)  # a collator that already returns per-sample dicts
    if "input_ids" not in batch:
        raise ValueError(f"the collated batch has no 'input_ids' (keys {', '.join(batch)}): "
                         f"{raw_rows_hint(list(batch)) if any(k in RAW_ROW_KEYS for k in batch) else ''}".rstrip(": "))
    fields = {k: _tensor(v, k, 0) for k, v in batch.items() if k not in IGNORED}
    ids = fields["input_ids"]
    if ids.dim() != 2:
        raise ValueError(f"collated input_ids has shape {tuple(ids.shape)}, expected [batch, sequence]")
    if "labels" not in fields:
        raise ValueError("the collated batch has no 'labels': the data_collator must give labels (-100 where no loss "
                         "is taken)")
    b, s = ids.shape
    mask = fields.get("attention_mask")
    keep = torch.ones_like(ids, dtype=torch.bool) if mask is None else mask.reshape(b, s).bool()
    samples: list[dict[str, Any]] = [{"input_ids": ids[i][keep[i]], "labels": fields["labels"][i][keep[i]]}
                                     for i in range(b)]
    counts = [images_per_sample(sample["input_ids"]) for sample in samples]
    _split_images(fields, samples, counts)
    known = {"input_ids", "labels", "pixel_values", "image_grid_thw", *REBUILT_PER_TOKEN}
    if video_id is not None:
        # a clip is one placeholder run, or one run per temporal patch (Qwen3-VL, Qwen3.5: FRAME_RUNS)
        _split_videos(fields, samples, [runs_of(sample["input_ids"], video_id) for sample in samples],
                      getattr(adapter, "FRAME_RUNS", False))
        known.update(VIDEO_FIELDS)
    if hasattr(adapter, "audio_rows"):  # an audio encoder (the Qwen2.5-Omni thinker): clips in order too
        _split_audio(fields, samples, [len(adapter.audio_rows(sample)) for sample in samples])
        known.update(AUDIO_FIELDS)
    unknown = [k for k in fields if k not in known]
    if unknown:
        raise ValueError(
            f"the collated batch has field(s) {', '.join(unknown)} that ds_hetero does not know how to split per "
            f"sample (it splits input_ids, labels, the image, video and audio fields, and rebuilds "
            f"{', '.join(REBUILT_PER_TOKEN)}); drop them in the collator")
    return samples


AUDIO_FIELDS = ("input_features", "feature_attention_mask", "audio_feature_lengths")
# a batch's clips: patches of all clips, one grid row per clip, and per clip its seconds per temporal
# patch (Qwen2.5-VL's processor field, the Qwen2.5-Omni processor's)
VIDEO_FIELDS = ("pixel_values_videos", "video_grid_thw", "second_per_grid_ts", "video_second_per_grid")


def runs_of(ids: torch.Tensor, token_id: int) -> int:
    """How many runs of `token_id` the 1-D `ids` hold (one per image, clip or frame)."""
    hit = (ids.reshape(-1) == token_id).int()
    return int((torch.diff(hit, prepend=hit.new_zeros(1)) == 1).sum())


def _split_videos(fields: dict[str, Any], samples: list[dict[str, Any]], runs: list[int], frame_runs: bool) -> None:
    """Clips to samples in order: sample i owns the next clips whose placeholder runs (one per clip,
    or with `frame_runs` one per temporal patch) add up to `runs[i]`; their patches and seconds with them."""
    pixels, grid = fields.get("pixel_values_videos"), fields.get("video_grid_thw")
    if pixels is None or grid is None:
        if sum(runs) or pixels is not None or grid is not None:
            raise ValueError(f"the collated batch has {sum(runs)} video placeholder run(s) in its input_ids; it needs "
                             "both pixel_values_videos and video_grid_thw")
        return
    grid = grid.reshape(-1, 3).long()
    clip_runs = grid[:, 0].tolist() if frame_runs else [1] * grid.shape[0]
    patches = grid.prod(-1).tolist()
    if sum(patches) != pixels.shape[0]:
        raise ValueError(f"pixel_values_videos has {pixels.shape[0]} patches, video_grid_thw needs {sum(patches)}")
    if sum(clip_runs) != sum(runs):
        raise ValueError(f"video_grid_thw {grid.tolist()} gives {sum(clip_runs)} video placeholder run(s), but the "
                         f"input_ids hold {sum(runs)}")
    seconds = {k: fields[k].reshape(-1) for k in VIDEO_FIELDS[2:] if fields.get(k) is not None}
    clip, patch = 0, 0
    for sample, want in zip(samples, runs):
        first = clip
        while want > 0:
            want -= clip_runs[clip]
            clip += 1
        if want < 0:
            raise ValueError(f"video_grid_thw row {clip - 1} ({grid[clip - 1].tolist()}) spans two samples' video "
                             "placeholders: each temporal patch of a clip needs its own run")
        if clip > first:
            p = sum(patches[first:clip])
            sample["pixel_values_videos"], sample["video_grid_thw"] = pixels[patch:patch + p], grid[first:clip]
            for key, values in seconds.items():
                sample[key] = values[first:clip]
            patch += p


def _split_audio(fields: dict[str, Any], samples: list[dict[str, Any]], counts: list[int]) -> None:
    """Clips to samples in order, each sample its `counts[i]` clips: padded [clips, mel, frames] rows with
    their feature_attention_mask rows (the processor's form), or flattened [mel, frames] cut by
    audio_feature_lengths."""
    features, mask, lengths = (fields.get(k) for k in AUDIO_FIELDS)
    total = sum(counts)
    if features is None:
        if total:
            raise ValueError(f"the collated batch has {total} audio clip(s) in its input_ids but no input_features")
        return
    if mask is not None:
        if features.dim() != 3 or mask.shape[0] != features.shape[0] or features.shape[0] != total:
            raise ValueError(f"input_features {tuple(features.shape)} / feature_attention_mask "
                             f"{tuple(mask.shape)}: expected one [mel, frames] row and one mask row per clip, "
                             f"{total} clips in the input_ids")
        clip = 0
        for sample, n in zip(samples, counts):
            if n:
                sample["input_features"] = features[clip:clip + n]
                sample["feature_attention_mask"] = mask[clip:clip + n]
                clip += n
        return
    if lengths is None or lengths.reshape(-1).shape[0] != total or features.dim() != 2:
        raise ValueError(f"input_features {tuple(features.shape)} needs feature_attention_mask (one row per clip) "
                         f"or audio_feature_lengths (one entry per clip, {total} clips in the input_ids)")
    lengths = lengths.reshape(-1)
    clip, frame = 0, 0
    for sample, n in zip(samples, counts):
        if n:
            f = int(lengths[clip:clip + n].sum())
            sample["input_features"] = features[:, frame:frame + f]
            sample["audio_feature_lengths"] = lengths[clip:clip + n]
            clip, frame = clip + n, frame + f


def _split_images(fields: dict[str, Any], samples: list[dict[str, Any]], counts: list[int]) -> None:
    pixels, grid = fields.get("pixel_values"), fields.get("image_grid_thw")
    total = sum(counts)
    if pixels is None:
        if total:
            raise ValueError(f"the collated batch has {total} image(s) in its input_ids but no pixel_values")
        return
    if grid is not None:  # Qwen2-VL style: patches of all images in one [P, D] tensor, one grid row per image
        grid = grid.reshape(-1, 3)
        if grid.shape[0] != total:
            raise ValueError(f"image_grid_thw has {grid.shape[0]} rows, but the input_ids hold {total} images")
        patches = grid.prod(-1).tolist()
        if sum(patches) != pixels.shape[0]:
            raise ValueError(f"pixel_values has {pixels.shape[0]} patches, image_grid_thw needs {sum(patches)}")
        image, patch = 0, 0
        for sample, n in zip(samples, counts):
            if n:
                p = sum(patches[image:image + n])
                sample["pixel_values"], sample["image_grid_thw"] = pixels[patch:patch + p], grid[image:image + n]
                image, patch = image + n, patch + p
        return
    if pixels.shape[0] != total:  # LLaVA style: one [C, H, W] entry per image
        raise ValueError(f"pixel_values holds {pixels.shape[0]} images, but the input_ids hold {total}")
    image = 0
    for sample, n in zip(samples, counts):
        if n:
            sample["pixel_values"] = pixels[image:image + n]
            image += n
