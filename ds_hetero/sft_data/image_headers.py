"""An image's size from its header, and the cheap checks that it will decode, without decoding its pixels.

    height, width = image_size(path)      # a file, or an EmbeddedImage (bytes held in the data itself)
                                          # ValueError saying what is wrong with the image

PIL reads only the header on `Image.open` (pixels are decoded by `load()`). Truncation, the common
way an image is broken (an interrupted copy or download), is caught here too, so that the length
index names it before any step and `skip_bad_rows` can leave its row out:
- PNG: `verify()` walks every chunk and checks its CRC (no inflating);
- JPEG: the data must end with the end-of-image marker FF D9 (allowing trailing padding);
- other formats: their header only (a damaged body is found when the image is decoded, in its step).

A Hugging Face `datasets.Image()` column stores an image as {"bytes", "path"}; read undecoded
(sources.py), its bytes become an `EmbeddedImage`, opened by PIL from memory exactly as a file is.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass
from typing import IO, Union


@dataclass(frozen=True, eq=False, repr=False)
class EmbeddedImage:
    """An image's encoded bytes (PNG, JPEG, ...) held in a row, and the name errors give it."""

    data: bytes
    name: str  # e.g. "images[0] (cat.png, 5120 bytes in the dataset)"

    def __str__(self) -> str:
        return self.name

    __repr__ = __str__  # a Row's repr must not print the bytes


Image = Union[str, EmbeddedImage]


def open_target(image: Image) -> "str | IO[bytes]":
    """What `PIL.Image.open` takes for this image: the path, or the bytes as a file."""
    return io.BytesIO(image.data) if isinstance(image, EmbeddedImage) else image


def _tail(image: Image, n: int = 64) -> bytes:
    if isinstance(image, EmbeddedImage):
        return image.data[-n:]
    with open(image, "rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - n))
        return f.read()


def _jpeg_complete(image: Image) -> bool:
    return _tail(image).rstrip(b"\x00\r\n ").endswith(b"\xff\xd9")


def image_size(image: Image) -> tuple[int, int]:
    """(height, width) of the image (a file path or an EmbeddedImage)."""
    from PIL import Image as PILImage

    try:
        with PILImage.open(open_target(image)) as im:
            fmt, (width, height) = im.format, im.size
            if fmt == "PNG":
                im.verify()
    except (OSError, SyntaxError, ValueError) as exc:  # PIL raises SyntaxError for a broken PNG chunk
        raise ValueError(f"image {image} cannot be read ({exc})") from exc
    if fmt == "JPEG" and not _jpeg_complete(image):
        raise ValueError(f"image {image} is truncated (no JPEG end-of-image marker)")
    if width <= 0 or height <= 0:
        raise ValueError(f"image {image} has size {width}x{height}")
    return height, width
