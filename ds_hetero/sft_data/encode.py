"""A checked row -> one training sample, through the model's own processor and chat template.

    sample = encode_row(row, processor)   # input_ids, labels, and the processor's image and video fields

The conversation is rendered with `processor.apply_chat_template` and tokenized by the processor
with the row's images and video clips (which expands each placeholder into its token count), without
adding special tokens again (the template has them, as TRL's collator does). Labels are the token
ids on assistant turns and -100 elsewhere: assistant turn k covers the tokens between the rendering
of turns < k with the generation prompt (so the "assistant:" header is not learned) and the
rendering of turns <= k (its end-of-turn token is). Those prefixes are found on the unexpanded
text and carried onto the expanded ids by aligning the two token sequences; a template that does not
render a conversation prefix by prefix is refused with the row named.

A row's videos (clips.py) are decoded with PyAV, their frames sampled, resized and patchified by the family's
video rule (families/qwen2_vl/video_frames.py), and handed to the processor through a FramesVideoProcessor in
place of its own: the processor itself writes each clip's placeholders (Qwen3-VL's timestamps included) and
Qwen2.5-VL's `second_per_grid_ts`.
"""

from __future__ import annotations

from difflib import SequenceMatcher
from typing import Any

import torch

from .clips import load_clips, with_clips
from .image_headers import open_target
from .rows import Row

# what a sample keeps of the processor's output (the engine rebuilds masks and positions per stage)
IMAGE_FIELDS = ("pixel_values", "image_grid_thw", "image_sizes")
VIDEO_FIELDS = ("pixel_values_videos", "video_grid_thw", "second_per_grid_ts")


def _render(processor, messages, generation_prompt: bool = False) -> str:
    if not messages:
        return ""
    return processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)


def _ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def assistant_mask(row: Row, processor) -> tuple[str, list[int], list[bool]]:
    """(rendered text, its unexpanded token ids, True on assistant-turn tokens)."""
    messages = row.messages()
    text = _render(processor, messages)
    ids = _ids(processor.tokenizer, text)
    mask = [False] * len(ids)
    for k, turn in enumerate(row.turns):
        if turn.role != "assistant":
            continue
        before, upto = _render(processor, messages[:k], True), _render(processor, messages[:k + 1])
        if not (upto.startswith(before) and text.startswith(upto)):
            raise row.error("the processor's chat template does not render this conversation prefix by prefix "
                            f"(turn {k}), so its assistant turns cannot be located for the labels")
        start, end_ids = len(_ids(processor.tokenizer, before)), _ids(processor.tokenizer, upto)
        if end_ids != ids[:len(end_ids)]:
            raise row.error(f"turn {k}: the tokenizer splits the conversation differently at the end of this "
                            f"turn than inside the whole conversation, so the labels cannot be aligned")
        mask[start:len(end_ids)] = [True] * (len(end_ids) - start)
    return text, ids, mask


def expand_labels(unexpanded: list[int], mask: list[bool], expanded: list[int], row: Row) -> list[int]:
    """Labels over the processor's expanded ids: the tokens matched to masked unexpanded ones, -100 elsewhere
    (an image's inserted placeholders and markers match nothing, so they never carry a label)."""
    labels = [-100] * len(expanded)
    blocks = SequenceMatcher(None, unexpanded, expanded, autojunk=False).get_matching_blocks()
    for a, b, n in blocks:
        for j in range(n):
            if mask[a + j]:
                labels[b + j] = expanded[b + j]
    if sum(lab != -100 for lab in labels) != sum(mask):
        raise row.error("the processor's expansion of the image placeholders changed tokens of an assistant turn, "
                        "so the labels cannot be aligned")
    return labels


def load_images(row: Row) -> list[Any]:
    from PIL import Image

    images = []
    for path in row.images:  # a file, or an EmbeddedImage (a datasets Image column's bytes)
        try:
            with Image.open(open_target(path)) as im:
                images.append(im.convert("RGB"))
        except OSError as exc:
            raise row.error(f"image {path} cannot be read ({exc})") from exc
    return images


def encode_row(row: Row, processor) -> dict[str, torch.Tensor]:
    """The row as the engine takes a sample: input_ids and labels (1-D) and the processor's image and video fields."""
    text, unexpanded, mask = assistant_mask(row, processor)
    images = load_images(row)
    videos = None
    if row.videos:
        videos, settings, metadata = load_clips(row, processor)
        processor = with_clips(processor, settings, metadata)
    out = processor(text=[text], images=images or None, videos=videos, add_special_tokens=False, return_tensors="pt")
    ids = out["input_ids"][0]
    labels = expand_labels(unexpanded, mask, ids.tolist(), row)
    sample = {"input_ids": ids, "labels": torch.tensor(labels, dtype=torch.long)}
    if images:
        sample.update({k: out[k] for k in IMAGE_FIELDS if k in out})
    if videos:
        sample.update({k: torch.as_tensor(out[k]) for k in VIDEO_FIELDS if k in out})
    return sample
