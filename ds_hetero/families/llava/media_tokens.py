"""LLaVA's image-token count from an image's size, without its pixels: fixed by the processor's crop.

The processor's own rule (`LlavaProcessor._get_num_multimodal_tokens`): every image is resized and cropped
to the tower's input, so its count is (crop / patch)^2, plus the CLS token under the "full" strategy.
The length index (sft_data/length_index.py) reads it per image header."""

from __future__ import annotations


def image_tokens(processor, height: int, width: int) -> int:
    return int(processor._get_num_multimodal_tokens(image_sizes=[(height, width)])["num_image_tokens"][0])


MEDIA_TOKENS = {"LlavaProcessor": image_tokens}
