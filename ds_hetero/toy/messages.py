"""The shapes captions as a TRL user holds them: a `datasets.Dataset` of `messages` + PIL `images`.

    rows = messages_dataset(64, seed=0)     # {"messages": [user: (image +) question, assistant: caption],
                                            #  "images": [PIL image] or [] (text-only rows)}

The rows go through a processor (TRL's collator applies the chat template and the image processor);
`image_sizes` (height, width) cycle by index, so a dynamic-resolution processor (Qwen2-VL) gives
different image-token counts. Needs the `datasets` package (the test extra).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .shapes import ShapesCaptionDataset


def messages_dataset(size: int, seed: int = 0, text_only_every: int = 4,
                     image_sizes: Sequence[tuple[int, int]] = ((40, 40),)):
    import datasets
    from PIL import Image

    raw = ShapesCaptionDataset(size, seed=seed, image_sizes=image_sizes)
    rows: dict[str, list] = {"messages": [], "images": []}
    for i in range(size):
        item = raw[i]
        caption = raw.vocab.decode(item["input_ids"])
        text_only = text_only_every and i % text_only_every == text_only_every - 1
        user = [{"type": "text", "text": "what is here ?"}]
        if not text_only:
            user = [{"type": "image"}, *user]
        rows["messages"].append([{"role": "user", "content": user},
                                 {"role": "assistant", "content": [{"type": "text", "text": caption}]}])
        pixels = (item["image"].clamp(0, 1).permute(1, 2, 0).numpy() * 255).astype(np.uint8)
        rows["images"].append([] if text_only else [Image.fromarray(pixels)])
    return datasets.Dataset.from_dict(rows)
