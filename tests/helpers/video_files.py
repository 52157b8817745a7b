"""Tiny video files for the real-data video tests, written with PyAV (MPEG-4 Part 2 in MP4, a few KB each).

    write_clip(path, frames=12, height=84, width=112, fps=8)   # a bar sweeping left to right, its colour changing
    messages_rows(folder)                                      # a messages JSONL with clips, images and text rows

Every frame differs (the bar moves, the colour steps), so a frame taken out of order or from the wrong
index changes the pixels.
"""

from __future__ import annotations

import json
import os

import numpy as np


def write_clip(path: str, frames: int = 12, height: int = 84, width: int = 112, fps: int = 8, seed: int = 0,
               container: str | None = None) -> str:
    import av

    rng = np.random.default_rng(seed)
    base = rng.integers(20, 235, (3,))
    with av.open(path, "w", format=container) as out:
        stream = out.add_stream("mpeg4", rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for k in range(frames):
            image = np.zeros((height, width, 3), np.uint8)
            image[:] = (base + 17 * k) % 256
            x = (k * width) // frames
            image[:, x:x + max(2, width // 8)] = (250, 250 - 10 * k % 250, 30)
            image[: height // 3, : width // 4] = (40 * k % 256, 90, 200)
            for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return path


def write_image(path: str, height: int = 32, width: int = 48, seed: int = 0) -> str:
    from PIL import Image

    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(path)
    return path


# (clips as (frames, height, width, fps), images, the user's words): every row a question and an answer
VIDEO_ROWS = [
    ([(12, 84, 112, 8)], 0, "what is here ?"),
    ([(16, 56, 56, 4)], 1, "what is here ?"),
    ([], 0, "what is here ?"),
    ([(9, 64, 48, 6), (8, 56, 56, 8)], 0, "what is here ?"),
    ([(10, 48, 80, 5)], 1, "what is here ?"),
    ([], 1, "what is here ?"),
    ([(14, 72, 72, 7)], 0, "what is here ?"),
    ([(8, 56, 112, 8)], 0, "what is here ?"),
]
ANSWERS = ("a red circle at the top left", "a blue square at the bottom right", "a green cross",
           "a red circle and a blue square")


def messages_rows(folder: str, rows=VIDEO_ROWS, repeat: int = 1, parts: bool = False) -> str:
    """A messages JSONL in `folder` (clips and images beside it): row k's user turn holds its images and clips
    (`<image>` / `<video>` markers, or with `parts` TRL's typed parts), then its words; `repeat` copies."""
    os.makedirs(folder, exist_ok=True)
    lines = []
    for copy in range(repeat):
        for k, (clips, images, words) in enumerate(rows):
            n = copy * len(rows) + k
            videos = [os.path.basename(write_clip(os.path.join(folder, f"clip{k}_{c}.mp4"), *spec, seed=k + c))
                      for c, spec in enumerate(clips)] if copy == 0 else \
                [f"clip{k}_{c}.mp4" for c in range(len(clips))]
            pics = [os.path.basename(write_image(os.path.join(folder, f"image{k}_{i}.png"), seed=k + i))
                    for i in range(images)] if copy == 0 else [f"image{k}_{i}.png" for i in range(images)]
            if parts:
                content = [{"type": "image"}] * images + [{"type": "video"}] * len(clips) + \
                    [{"type": "text", "text": words}]
            else:
                content = "<image>" * images + "<video>" * len(clips) + " " + words
            row = {"messages": [{"role": "user", "content": content},
                                {"role": "assistant", "content": ANSWERS[n % len(ANSWERS)]}]}
            if pics:
                row["images"] = pics
            if videos:
                row["videos"] = videos
            lines.append(json.dumps(row))
    path = os.path.join(folder, "videos.jsonl")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path
