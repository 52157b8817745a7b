"""A padding collator as TRL's / transformers' build it, shared by the client tests and their driver."""

import torch


def _collate(samples, side="right", pad_id=0):
    """A padding collator as TRL's / transformers' build it: [B, S] ids, mask, labels -100 on padding;
    LLaVA pixel_values [N, 3, H, W]; Qwen2-VL patches [P, D] and image_grid_thw [N, 3]; Qwen-VL clips'
    pixel_values_videos [P, D], video_grid_thw [N, 3] (and Qwen2.5-VL's second_per_grid_ts [N])."""
    n = max(len(s["input_ids"]) for s in samples)
    ids = torch.full((len(samples), n), pad_id)
    labels = torch.full((len(samples), n), -100)
    mask = torch.zeros((len(samples), n), dtype=torch.long)
    for i, s in enumerate(samples):
        k = len(s["input_ids"])
        sl = slice(0, k) if side == "right" else slice(n - k, n)
        ids[i, sl], labels[i, sl], mask[i, sl] = s["input_ids"], s["labels"], 1
    out = {"input_ids": ids, "attention_mask": mask, "labels": labels}
    with_images = [s for s in samples if s.get("pixel_values") is not None]
    if with_images:
        out["pixel_values"] = torch.cat([s["pixel_values"] for s in with_images])
        if "image_grid_thw" in with_images[0]:
            out["image_grid_thw"] = torch.cat([s["image_grid_thw"].reshape(-1, 3) for s in with_images])
    with_videos = [s for s in samples if s.get("pixel_values_videos") is not None]
    if with_videos:  # the Qwen-VL processors' video fields, clips in sample order
        out["pixel_values_videos"] = torch.cat([s["pixel_values_videos"] for s in with_videos])
        out["video_grid_thw"] = torch.cat([s["video_grid_thw"].reshape(-1, 3) for s in with_videos])
        if "second_per_grid_ts" in with_videos[0]:
            out["second_per_grid_ts"] = torch.cat([s["second_per_grid_ts"].reshape(-1) for s in with_videos])
    return out
