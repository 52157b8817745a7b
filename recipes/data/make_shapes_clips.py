"""Writes the shipped real-data video example: four moving-shape MP4 clips and a messages file mixing them with images.

    .venv/bin/python recipes/data/make_shapes_clips.py     # rewrites recipes/data/{clips/, shapes_videos.jsonl}

Each clip shows one shape in one cell of a 2x2 grid for its first half and in another for its second half
(toy/shape_clips.py's scenes), captioned in time order ("a red circle at the top left and at the bottom
right"); 8-16 frames of 56x56 to 112x84 at 4-8 fps, MPEG-4 in MP4 written with PyAV (a few KB each).
shapes_videos.jsonl: 24 rows, each clip asked about three times (a `<video>` marker, a `{"type": "video"}`
part, and beside an image or a second clip in one row), between 12 image rows of shapes_messages.jsonl, so
that a global batch of 16 mixes clips and images. Train on it with a Qwen-VL family:

    .venv/bin/deepspeed --num_gpus 4 recipes/train_llava.py --model-family qwen2-vl --data recipes/data/shapes_videos.jsonl
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np

# (frames, height, width, fps) of each clip
CLIPS = ((8, 56, 56, 4), (12, 84, 112, 8), (16, 64, 64, 8), (10, 56, 112, 5))


def write_clip(path: str, frames: list[np.ndarray], fps: int) -> None:
    import av

    height, width = frames[0].shape[:2]
    with av.open(path, "w") as out:
        stream = out.add_stream("mpeg4", rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for frame in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)


def clip_frames(index: int, frames: int, height: int, width: int, seed: int) -> tuple[list[np.ndarray], str]:
    """(uint8 RGB frames, caption) of clip `index`: the shape in its first cell, then in its second."""
    import torch

    from ds_hetero.toy.shape_clips import clip_caption
    from ds_hetero.toy.shapes import PIXEL_MEAN, PIXEL_STD, Shape, draw_scene, item_seed, render

    gen = torch.Generator().manual_seed(item_seed(seed, index))
    first = draw_scene(gen, 2, 1)[0]
    cell = (first.row * 2 + first.col + 1 + int(torch.randint(3, (1,), generator=gen))) % 4  # it moves
    last = Shape(first.colour, first.kind, cell // 2, cell % 2)
    mean, std = torch.tensor(PIXEL_MEAN).view(3, 1, 1), torch.tensor(PIXEL_STD).view(3, 1, 1)
    out = []
    for k in range(frames):
        image = render([first if k < frames // 2 else last], 2, height, width, gen, noise=0.0) * std + mean
        out.append((image.clamp(0, 1).permute(1, 2, 0).numpy() * 255).astype(np.uint8))
    return out, clip_caption(first, last)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)))
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    os.makedirs(os.path.join(args.out, "clips"), exist_ok=True)
    with open(os.path.join(args.out, "shapes_messages.jsonl")) as f:
        images = [json.loads(line) for line in f][:12]  # one image each
    names, captions = [], []
    for k, (frames, height, width, fps) in enumerate(CLIPS):
        pixels, caption = clip_frames(k, frames, height, width, args.seed)
        names.append(f"clips/{k:03d}.mp4")
        captions.append(caption)
        write_clip(os.path.join(args.out, names[-1]), pixels, fps)

    def row(content, answer, videos, pictures=()):
        out = {"messages": [{"role": "user", "content": content}, {"role": "assistant", "content": answer}],
               "videos": list(videos)}
        return {**out, "images": list(pictures)} if pictures else out

    rows = []
    for k, (name, caption) in enumerate(zip(names, captions)):
        rows.append(row("<video>\nwhat is here ?", caption, [name]))
        rows.append(row([{"type": "video"}, {"type": "text", "text": "what is here ?"}], caption, [name]))
        if k % 2:  # two clips in one row
            other = (k + 1) % len(names)
            rows.append(row("<video> and <video> what is here ?", f"{caption} and {captions[other]}",
                            [name, names[other]]))
        else:  # an image and a clip in one row
            image = images[k]
            answer = f"{image['messages'][1]['content']} and {caption}"
            rows.append(row("<image> and <video> what is here ?", answer, [name], image["images"]))
    mixed = [r for pair in zip(rows, images) for r in pair]
    with open(os.path.join(args.out, "shapes_videos.jsonl"), "w") as f:
        f.writelines(json.dumps(m) + "\n" for m in mixed)
    size = sum(os.path.getsize(os.path.join(args.out, "clips", n)) for n in os.listdir(os.path.join(args.out, "clips")))
    print(f"{len(mixed)} rows, {len(CLIPS)} clips ({size} bytes) in {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
