"""Qwen2-VL's image-token count from an image's size, without its pixels: the image processor's `smart_resize`.

Height and width are rounded to multiples of patch x merge and clamped between the processor's minimum
and maximum pixels (`get_number_of_image_patches`, the rule the processor resizes by); every merge x merge
patches become one token. Qwen2.5-VL and Qwen3-VL resize by the same rule (their homes list their
processors with this function). The length index (sft_data/length_index.py) reads it per image header."""

from __future__ import annotations


def image_tokens(processor, height: int, width: int) -> int:
    images = processor.image_processor
    return int(images.get_number_of_image_patches(height, width, {})) // images.merge_size ** 2


MEDIA_TOKENS = {"Qwen2VLProcessor": image_tokens}
