"""The synthetic shapes-captioning data: determinism, formats the adapters accept, visible content,
Qwen2-VL patch order, and that a tiny LLaVA learns it quickly (single process, no downloads)."""

import ast
import inspect
import math
import time

import pytest
import torch

from ds_hetero.toy import COLOURS, SHAPES, ShapesCaptionDataset, Vocabulary
from ds_hetero.toy.shapes import PIXEL_MEAN, PIXEL_STD, item_seed, shape_mask
from ds_hetero.families.llava.adapter import LlavaAdapter
from ds_hetero.families.qwen2_vl.adapter import Qwen2VLAdapter
from ds_hetero.toy import tiny_llava, tiny_qwen2_vl

IGNORE = -100


@pytest.fixture(scope="module")
def qwen():
    return tiny_qwen2_vl()


def unnormalise(image):
    return image * torch.tensor(PIXEL_STD).view(3, 1, 1) + torch.tensor(PIXEL_MEAN).view(3, 1, 1)


def test_vocabulary_layout_and_round_trip():
    v = Vocabulary(256, 255)
    assert (v.pad_id, v.bos_id, v.eos_id, v.image_token_id) == (0, 1, 2, 255)
    assert len(v.words) < 250 and len(set(v.words)) == len(v.words)
    text = "a red circle at the top left and a blue square at the bottom right"
    ids = v.encode(text)
    assert min(ids) >= 3 and max(ids) < 255
    assert v.decode([1, 255, 255, *ids, 2, 0, IGNORE]) == text
    assert v.decode(torch.tensor(ids)) == v.decode(ids)
    with pytest.raises(ValueError, match="purple"):
        v.encode("a purple circle")
    with pytest.raises(ValueError, match="below the image token"):
        Vocabulary(16, 15)  # the words would run into the placeholder id
    with pytest.raises(ValueError, match="reserved"):
        Vocabulary(300, 299, reserved_ids=(10,))


def test_deterministic_per_index_and_leaves_global_rng_alone():
    state = torch.get_rng_state()
    a = ShapesCaptionDataset(20, seed=3, max_shapes=2, grid=3)
    b = ShapesCaptionDataset(20, seed=3, max_shapes=2, grid=3)
    later = a[7]
    for i in reversed(range(20)):  # order of access does not matter
        x, y = a[i], b[i]
        assert torch.equal(x["image"], y["image"]) and torch.equal(x["input_ids"], y["input_ids"])
    assert torch.equal(a[7]["image"], later["image"])
    assert torch.equal(torch.get_rng_state(), state)
    other = ShapesCaptionDataset(20, seed=4, max_shapes=2, grid=3)
    assert not torch.equal(other[0]["image"], a[0]["image"])
    assert len({a.caption(i) for i in range(20)}) > 10  # captions vary
    with pytest.raises(IndexError):
        a[20]
    # torch's CPU generator keeps 32 seed bits: every item of a dataset still gets its own stream.
    assert len({item_seed(3, i) for i in range(100_000)}) == 100_000
    assert all(0 <= item_seed(s, i) < 2**32 for s in (0, 1, 2**40) for i in (0, 2**31))


def test_raw_item_shapes_dtypes_and_normalisation():
    d = ShapesCaptionDataset(256, image_size=32, seed=0, max_shapes=2)
    items = [d[i] for i in range(len(d))]
    images = torch.stack([it["image"] for it in items])
    assert images.shape == (256, 3, 32, 32) and images.dtype == torch.float32
    assert abs(images.mean().item()) < 0.25 and 0.7 < images.std().item() < 1.3
    for i, it in enumerate(items[:20]):
        assert it["input_ids"].dtype == torch.long and it["input_ids"].dim() == 1
        assert it["input_ids"][0] == d.vocab.bos_id and it["input_ids"][-1] == d.vocab.eos_id
        assert it["labels"][0] == IGNORE and torch.equal(it["labels"][1:], it["input_ids"][1:])
        assert d.vocab.decode(it["input_ids"]) == d.caption(i)
        assert torch.equal(d.input_ids(i), it["input_ids"])


def test_caption_follows_the_drawn_scene_in_reading_order():
    d = ShapesCaptionDataset(50, seed=1, max_shapes=3, grid=3)
    rows, cols = ("top", "middle", "bottom"), ("left", "center", "right")
    for i in range(50):
        scene = sorted(d.scene(i), key=lambda s: (s.row, s.col))
        assert len({(s.row, s.col) for s in scene}) == len(scene)  # one shape per cell
        expected = " and ".join(f"a {s.colour} {s.kind} at the {rows[s.row]} {cols[s.col]}" for s in scene)
        assert d.caption(i) == expected


@pytest.mark.parametrize("grid,max_shapes,hw", [(2, 1, (32, 32)), (3, 2, (32, 32)), (2, 2, (32, 16))])
def test_colours_and_positions_are_visible(grid, max_shapes, hw):
    """The bright pixels of each cell are the captioned colour; cells without a shape stay dark."""
    d = ShapesCaptionDataset(40, seed=2, grid=grid, max_shapes=max_shapes, image_sizes=[hw])
    palette = torch.tensor(list(COLOURS.values()))
    names = list(COLOURS)
    for i in range(len(d)):
        image = unnormalise(d[i]["image"])
        by_cell = {(s.row, s.col): s for s in d.scene(i)}
        for r in range(grid):
            for c in range(grid):
                cell = image[:, cell_of(hw[0], grid) == r][:, :, cell_of(hw[1], grid) == c]
                bright = cell.amax(0) > 0.5
                if (r, c) not in by_cell:
                    assert bright.sum() == 0, (i, r, c)
                    continue
                assert bright.sum() >= 4, (i, r, c)  # even an 8 px cell shows a few pixels of its shape
                mean = cell[:, bright].mean(1)
                assert names[int(((palette - mean) ** 2).sum(1).argmin())] == by_cell[(r, c)].colour, (i, r, c)


def cell_of(n, grid):
    """Grid cell of each pixel along a side of n pixels, by its centre (as the renderer places shapes)."""
    return ((torch.arange(n) + 0.5) * grid / n).floor().long()


def test_shape_kinds_have_distinct_masks():
    y = torch.arange(40, dtype=torch.float32).view(-1, 1) - 19.5
    x = torch.arange(40, dtype=torch.float32).view(1, -1) - 19.5
    areas = {k: shape_mask(k, y, x, 15.0).float().sum().item() for k in SHAPES}
    r2 = 15.0**2
    assert areas["square"] == pytest.approx(4 * r2, rel=0.1)
    assert areas["circle"] == pytest.approx(math.pi * r2, rel=0.1)
    assert areas["triangle"] == pytest.approx(2 * r2, rel=0.1)
    assert areas["cross"] == pytest.approx(4 * r2 * 5 / 9, rel=0.15)  # two 2r x 2r/3 bars, centre counted once


@pytest.mark.parametrize("vision", ["clip", "siglip"])
def test_llava_samples_pass_check_sample(vision):
    model = tiny_llava(vision)
    adapter = LlavaAdapter(model)
    d = ShapesCaptionDataset.for_llava(model.config, 12, seed=0, max_shapes=2, text_only_every=4)
    t = adapter.tokens_per_image
    for i in range(len(d)):
        s = d[i]
        adapter.check_sample(s, i)
        ids, labels = s["input_ids"], s["labels"]
        assert torch.equal(d.input_ids(i), ids)
        n_img = int((ids == model.config.image_token_id).sum())
        if i % 4 == 3:
            assert "pixel_values" not in s and n_img == 0
        else:
            assert s["pixel_values"].shape == (1, 3, 32, 32) and n_img == t
            assert torch.equal(ids[1:1 + t], torch.full((t,), model.config.image_token_id))
        prefix = 1 + n_img
        assert ids[0] == 1 and ids[-1] == 2
        assert (labels[:prefix] == IGNORE).all() and torch.equal(labels[prefix:], ids[prefix:])
        assert d.vocab.decode(labels) == d.caption(i)
    with pytest.raises(ValueError, match="LLaVA's tower takes 32x32"):
        ShapesCaptionDataset.for_llava(model.config, 4, image_sizes=[(16, 16)])


def test_qwen2_vl_samples_pass_check_sample_and_run(qwen):
    cfg = qwen.config
    adapter = Qwen2VLAdapter(qwen)
    sizes = [(16, 16), (32, 16), (16, 32), (32, 32)]
    d = ShapesCaptionDataset.for_qwen2_vl(cfg, 10, seed=0, image_sizes=sizes, max_shapes=2, text_only_every=5)
    samples = [d[i] for i in range(len(d))]
    counts = []
    for i, s in enumerate(samples):
        adapter.check_sample(s, i)
        ids, labels = s["input_ids"], s["labels"]
        assert torch.equal(d.input_ids(i), ids)
        n = int((ids == cfg.image_token_id).sum())
        counts.append(n)
        if i % 5 == 4:
            assert "pixel_values" not in s and "image_grid_thw" not in s and n == 0
            prefix = 1
        else:
            h, w = sizes[i % 4]
            assert s["image_grid_thw"].tolist() == [[1, h // 4, w // 4]]
            assert s["pixel_values"].shape == (h * w // 16, 3 * 2 * 4 * 4) and s["pixel_values"].dtype == torch.float32
            assert n == h * w // 16 // 4
            assert ids[1] == cfg.vision_start_token_id and ids[2 + n] == cfg.vision_end_token_id
            prefix = 3 + n
        assert ids[0] == 1 and ids[-1] == 2
        assert (labels[:prefix] == IGNORE).all() and torch.equal(labels[prefix:], ids[prefix:])
    assert counts == [4, 8, 8, 16, 0, 8, 8, 16, 4, 0]
    # The adapter's M-RoPE positions and the two stages accept a mixed batch.
    stages = adapter.split()
    batch = adapter.language_inputs(samples)
    with torch.no_grad():
        rows = stages["vision"](**adapter.vision_inputs(samples))
        logits = stages["language"](batch["input_ids"], rows, batch["attention_mask"], batch["position_ids"])
    assert rows.shape[0] == sum(counts) and logits.shape[:2] == batch["input_ids"].shape
    with pytest.raises(ValueError, match="multiple of patch_size"):
        ShapesCaptionDataset.for_qwen2_vl(cfg, 4, image_sizes=[(12, 16)])


def test_qwen2_vl_patch_rows_follow_the_vision_towers_positions(qwen):
    """Row k holds the pixels of the patch the tower places at (h, w) = its k-th vision position,
    repeated over the temporal_patch_size frames, laid out as PatchEmbed's view(C, T, p, p)."""
    from transformers.vision_utils import get_vision_position_ids

    d = ShapesCaptionDataset.for_qwen2_vl(qwen.config, 2, image_sizes=[(32, 16)], grid=3, max_shapes=2)
    picture = d.image(0)
    patches = d.format.patches(picture)
    grid_thw = torch.tensor([[1, 8, 4]])
    positions = get_vision_position_ids(grid_thw, 2)
    assert positions.shape == (32, 2)
    as_conv_input = patches.view(-1, 3, 2, 4, 4)
    for k, (h, w) in enumerate(positions.tolist()):
        crop = picture[:, h * 4:(h + 1) * 4, w * 4:(w + 1) * 4]
        assert torch.equal(as_conv_input[k, :, 0], crop) and torch.equal(as_conv_input[k, :, 1], crop)
    assert torch.equal(d[0]["pixel_values"], patches)


def transformers_patchify():
    """transformers' own Qwen2VLImageProcessor.patchify, taken from the installed source.

    Its patchify is plain torch; compiling it from the installed file checks our order against
    the exact code the processor runs (the processor itself is tested below, with pillow).
    """
    import transformers.models.qwen2_vl as package

    path = inspect.getfile(package).replace("__init__.py", "image_processing_qwen2_vl.py")
    tree = ast.parse(open(path).read())
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Qwen2VLImageProcessor"):
        for fn in (n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "patchify"):
            fn.decorator_list = []
            namespace = {"torch": torch}
            exec(compile(ast.Module(body=[fn], type_ignores=[]), path, "exec"), namespace)
            return namespace["patchify"]
    pytest.fail(f"no Qwen2VLImageProcessor.patchify in {path}: transformers changed; update this test")


def test_qwen2_vl_patches_match_transformers_patchify(qwen):
    d = ShapesCaptionDataset.for_qwen2_vl(qwen.config, 4, image_sizes=[(16, 32), (32, 16)], max_shapes=2)
    patchify = transformers_patchify()
    for i in range(len(d)):
        s = d[i]
        h, w = s["image_grid_thw"][0, 1:].tolist()
        theirs, gh, gw = patchify(None, d.image(i).unsqueeze(0), patch_size=4, merge_size=2, temporal_patch_size=2)
        assert (gh, gw) == (h, w)
        assert torch.equal(theirs[0], s["pixel_values"])


def test_qwen2_vl_patches_match_the_image_processor(qwen):
    # needs pillow (the `test` extra); no skip: a missing backend or any other error fails the test
    from transformers import Qwen2VLImageProcessor

    processor = Qwen2VLImageProcessor(patch_size=4, merge_size=2, temporal_patch_size=2, do_resize=False,
                                      do_rescale=False, do_normalize=False, do_convert_rgb=False)
    d = ShapesCaptionDataset.for_qwen2_vl(qwen.config, 2, image_sizes=[(16, 32)])
    out = processor(images=[d.image(0)], return_tensors="pt")
    assert out["image_grid_thw"].tolist() == d[0]["image_grid_thw"].tolist()
    torch.testing.assert_close(out["pixel_values"], d[0]["pixel_values"])


def test_tiny_llava_learns_the_captions():
    """300 AdamW steps (batch 16) take the mean token loss from ~ln(vocab) to a fraction of it, and
    the colour words' loss far below ln(6): the model reads the colour from the image."""
    torch.manual_seed(0)
    model = tiny_llava("clip", seed=1)
    adapter = LlavaAdapter(model)
    steps, batch = 300, 16
    d = ShapesCaptionDataset.for_llava(model.config, steps * batch, seed=1)
    colour_ids = torch.tensor(d.vocab.encode(" ".join(COLOURS)))
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    losses, colour_losses = [], []
    start = time.perf_counter()
    for step in range(steps):
        samples = [d[step * batch + j] for j in range(batch)]
        b = adapter.language_inputs(samples)
        images = adapter.vision_inputs(samples)
        logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], **images).logits
        labels = b["labels"][:, 1:]
        tok = torch.nn.functional.cross_entropy(
            logits[:, :-1].transpose(1, 2), labels, ignore_index=IGNORE, reduction="none"
        )
        loss = tok[labels != IGNORE].mean()
        colour_losses.append(tok[torch.isin(labels, colour_ids)].mean().item())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    elapsed = time.perf_counter() - start
    first, last = sum(losses[:10]) / 10, sum(losses[-50:]) / 50
    last_colour = sum(colour_losses[-50:]) / 50
    print(f"loss {losses[0]:.3f} (first 10 steps {first:.3f}) -> {last:.3f} (last 50), colour-word loss "
          f"{colour_losses[0]:.3f} -> {last_colour:.3f}, {steps} steps in {elapsed:.1f}s")
    assert losses[0] > 5.0  # starts near ln(256) = 5.5
    assert last < 0.25 * first
    assert last_colour < 0.6 * math.log(len(COLOURS))
