"""Gemma 4 samples and the fused model's own loss on them (tests/families/test_families_gemma4.py).

A sample is text, then its images (each <boi> + soft tokens + <eoi>), more text, then its audio clips (each
<boa> + soft tokens + <eoa>), then text: the fields as Gemma4Processor emits them (families/gemma4/media.py),
images patchified and padded to 16 patches (4 soft tokens at most), clips padded to the sample's longest.
"""

import torch

from ds_hetero.families.gemma4.media import audio_tokens, patchify
from ds_hetero.loss import IGNORE_INDEX as IGNORE

# (images as (height, width), clips as real frame counts) per sample: variable resolution, several of
# each, either, both, neither
SPECS = [([(16, 16)], [9]), ([], []), ([(8, 16), (16, 16)], []), ([], [13, 5]), ([(16, 8)], [16]),
         ([(16, 16)], []), ([], [7]), ([(8, 8)], [])]


def gemma4_samples(model, specs, text_len=5, seed=0, max_patches=16, words=40):
    cfg = model.config
    v, n_mel = cfg.vision_config, cfg.audio_config.subsampling_conv_channels[0]
    gen = torch.Generator().manual_seed(seed)
    samples = []
    for images, clips in specs:
        text = torch.randint(3, 3 + words, (text_len + 1,), generator=gen)
        ids, labels = [text[:2]], [text[:2]]
        pixels, positions = [], []
        for hw in images:
            p, q = patchify(torch.rand(3, *hw, generator=gen), v.patch_size, max_patches)
            pixels.append(p)
            positions.append(q)
            n = int((q[0] != -1).all(-1).sum()) // v.pooling_kernel_size**2
            ids.append(torch.tensor([cfg.boi_token_id] + [cfg.image_token_id] * n + [cfg.eoi_token_id]))
            labels.append(torch.full((n + 2,), IGNORE))
        ids.append(text[2:4])
        labels.append(text[2:4])
        for frames in clips:
            n = audio_tokens(frames)
            ids.append(torch.tensor([cfg.boa_token_id] + [cfg.audio_token_id] * n + [cfg.eoa_token_index]))
            labels.append(torch.full((n + 2,), IGNORE))
        ids.append(text[4:])
        labels.append(text[4:])
        sample = {"input_ids": torch.cat(ids), "labels": torch.cat(labels)}
        if images:
            sample["pixel_values"], sample["image_position_ids"] = torch.cat(pixels), torch.cat(positions)
        if clips:
            longest = max(clips)
            sample["input_features"] = torch.randn(len(clips), longest, n_mel, generator=gen)
            sample["input_features_mask"] = torch.arange(longest).unsqueeze(0) < torch.tensor(clips).unsqueeze(1)
        samples.append(sample)
    return samples


def gemma4_reference_loss(model, adapter, samples, wrong=False):
    """`model(**batch).loss` on the padded batch, as the processor's batch feeds it (mm_token_type_ids 1 at
    the image placeholders). `wrong`: without mm_token_type_ids Gemma4Model builds plain causal masks
    (no bidirectional image blocks)."""
    batch = adapter.language_inputs(samples)
    vision, audio = adapter.vision_inputs(samples), adapter.audio_inputs(samples)
    ids = batch["input_ids"]
    has_image, has_audio = vision["pixel_values"].shape[0] > 0, audio["input_features"].shape[0] > 0
    return model(input_ids=ids, attention_mask=batch["attention_mask"], labels=batch["labels"],
                 mm_token_type_ids=None if wrong else (ids == model.config.image_token_id).long(),
                 pixel_values=vision["pixel_values"] if has_image else None,
                 image_position_ids=vision["image_position_ids"] if has_image else None,
                 input_features=audio["input_features"] if has_audio else None,
                 input_features_mask=audio["input_features_mask"] if has_audio else None).loss
