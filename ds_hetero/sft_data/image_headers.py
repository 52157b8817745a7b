"""An image's size from its header, and the cheap checks that it will decode, without decoding its pixels.

    height, width = image_size(path)      # ValueError saying what is wrong with the file

PIL reads only the header on `Image.open` (pixels are decoded by `load()`). Truncation, the common
way an image file is broken (an interrupted copy or download), is caught here too, so that the length
index names it before any step and `skip_bad_rows` can leave its row out:
- PNG: `verify()` walks every chunk and checks its CRC (no inflating);
- JPEG: the file must end with the end-of-image marker FF D9 (allowing trailing padding);
- other formats: their header only (a damaged body is found when the image is decoded, in its step).
"""

from __future__ import annotations

import os


def _jpeg_complete(path: str) -> bool:
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(0, size - 64))
        tail = f.read().rstrip(b"\x00\r\n ")
    return tail.endswith(b"\xff\xd9")


def image_size(path: str) -> tuple[int, int]:
    """(height, width) of the image file at `path`."""
    from PIL import Image

    try:
        with Image.open(path) as im:
            fmt, (width, height) = im.format, im.size
            if fmt == "PNG":
                im.verify()
    except (OSError, SyntaxError, ValueError) as exc:  # PIL raises SyntaxError for a broken PNG chunk
        raise ValueError(f"image {path} cannot be read ({exc})") from exc
    if fmt == "JPEG" and not _jpeg_complete(path):
        raise ValueError(f"image {path} is truncated (no JPEG end-of-image marker)")
    if width <= 0 or height <= 0:
        raise ValueError(f"image {path} has size {width}x{height}")
    return height, width
