"""Writes the shipped real-data example: generated shape images (PNG) and the same conversations in both formats.

    .venv/bin/python recipes/data/make_shapes_sft.py            # rewrites recipes/data/{images/, shapes_llava.json,
                                                      #   shapes_messages.jsonl}, seeded: the same bytes every run

48 rows: most one image and one question, every 6th two images, every 5th two question/answer turns,
every 8th text only (no image). The words are those of the shapes captions, which the tiny models'
processors (ds_hetero/toy/processors.py) tokenize; a real checkpoint's processor takes them too.
shapes_llava.json is the LLaVA format (a JSON list, `image` a path or a list of paths, `<image>` in
the human turn); shapes_messages.jsonl the messages format (LLaMA-Factory's: `<image>` in the
user's content, `images` a list), row for row the same conversations.
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np

ROWS = 48
SIZES = ((32, 32), (32, 48), (48, 32), (40, 40))  # (height, width): multiples of 8 (Qwen2-VL's patch x merge)
QUESTION = "what is here ?"


def conversation(i: int, scene) -> list[tuple[str, str]]:
    """[(role, text)] of row i; scene(with_image) gives the next scene's caption (and writes its image if asked)."""
    if i % 8 == 7:
        return [("user", QUESTION), ("assistant", scene(False))]
    if i % 6 == 5:
        first, second = scene(True), scene(True)
        return [("user", f"<image> and <image> {QUESTION}"), ("assistant", f"{first} and {second}")]
    caption = scene(True)
    turns = [("user", f"<image>\n{QUESTION}"), ("assistant", caption)]
    if i % 5 == 4:
        turns += [("user", QUESTION), ("assistant", caption)]
    return turns


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)))
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    from PIL import Image

    from ds_hetero.toy.shapes import ShapesCaptionDataset

    raw = ShapesCaptionDataset(2 * ROWS, seed=args.seed, max_shapes=2, image_sizes=SIZES)
    os.makedirs(os.path.join(args.out, "images"), exist_ok=True)
    written: list[str] = []

    def scene(with_image: bool) -> str:
        k = len(written) + scene.text_only
        if with_image:
            name = f"images/{k:03d}.png"
            pixels = (raw.image(k).clamp(0, 1).permute(1, 2, 0).numpy() * 255).astype(np.uint8)
            Image.fromarray(pixels).save(os.path.join(args.out, name), optimize=True)
            written.append(name)
        else:
            scene.text_only += 1
        return raw.caption(k)

    scene.text_only = 0
    llava, messages = [], []
    for i in range(ROWS):
        start = len(written)
        turns = conversation(i, scene)
        images = written[start:]
        row = {"id": f"shapes-{i:03d}", "conversations": [
            {"from": "human" if r == "user" else "gpt", "value": t} for r, t in turns]}
        if images:
            row["image"] = images[0] if len(images) == 1 else images
        llava.append(row)
        messages.append({"messages": [{"role": r, "content": t} for r, t in turns], "images": images})
    with open(os.path.join(args.out, "shapes_llava.json"), "w") as f:
        json.dump(llava, f, indent=1)
        f.write("\n")
    with open(os.path.join(args.out, "shapes_messages.jsonl"), "w") as f:
        f.writelines(json.dumps(m) + "\n" for m in messages)
    print(f"{ROWS} rows, {len(written)} images in {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
