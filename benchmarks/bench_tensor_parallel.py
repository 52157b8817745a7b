"""Vision stage at tp 1, 2 and 4 on 4 CPU ranks: step time and bytes all-reduced per step.

    .venv/bin/python benchmarks/bench_tensor_parallel.py [--steps 6]

One run, three layouts of the same 4 ranks (tp x dp = 1x4, 2x2, 4x1), the same global batch of
images. A step is forward + backward of a CLIP vision tower and the LLaVA projector on this
rank's dp share of the batch, then the gradient all-reduce over dp (what a data-parallel engine
would do). Bytes are counted per rank by wrapping torch.distributed.all_reduce in this process
only: tp = the activation all-reduces of the sharded blocks (forward exits, backward entries),
dp = the gradient all-reduce. Not a timed test: a 2-core machine running 4 ranks is
oversubscribed, so read the times for their trend, the bytes exactly.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist

WORLD = 4
GLOBAL_IMAGES = 16
VISION = dict(hidden_size=256, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=8,
              image_size=64, patch_size=8)  # 64 patches + CLS per image
TEXT_HIDDEN = 512


def build():
    from transformers import CLIPVisionConfig, CLIPVisionModel, LlamaConfig, LlavaConfig
    from transformers.models.llava.modeling_llava import LlavaMultiModalProjector

    torch.manual_seed(0)
    tower = CLIPVisionModel(CLIPVisionConfig(**VISION))
    cfg = LlavaConfig(vision_config=CLIPVisionConfig(**VISION), text_config=LlamaConfig(hidden_size=TEXT_HIDDEN))
    return tower, LlavaMultiModalProjector(cfg)


class AllReduceCounter:
    """Wraps dist.all_reduce for the duration; sums payload bytes per tagged phase."""

    def __init__(self):
        self.bytes, self.phase, self._orig = {}, "tp", None

    def __enter__(self):
        self._orig = dist.all_reduce

        def counted(tensor, *args, **kwargs):
            self.bytes[self.phase] = self.bytes.get(self.phase, 0) + tensor.numel() * tensor.element_size()
            return self._orig(tensor, *args, **kwargs)

        dist.all_reduce = counted
        return self

    def __exit__(self, *exc):
        dist.all_reduce = self._orig


def run_layout(rank, tp, groups, steps):
    from ds_hetero.tensor_parallel import shard_projector, shard_vision_tower
    from ds_hetero.families import tp_plans

    stage = groups.stages[f"tp{tp}"]
    tower, proj = build()
    shard_vision_tower(tower, stage.tp, plans=tp_plans())
    shard_projector(proj, stage.tp, plans=tp_plans())
    # the pooler's layernorm gets no gradient from last_hidden_state: leave it out
    params = [p for m in (tower, proj) for n, p in m.named_parameters() if "post_layernorm" not in n]
    dp, dp_rank = stage.layout.dp, stage.coord.dp
    per_dp = GLOBAL_IMAGES // dp
    gen = torch.Generator().manual_seed(dp_rank)  # tp ranks of one dp group see the same images
    images = torch.randn(per_dp, 3, VISION["image_size"], VISION["image_size"], generator=gen)

    times, counts = [], []
    for step in range(steps + 2):  # two warm-up steps
        for p in params:
            p.grad = None
        dist.barrier()
        start = time.perf_counter()
        with AllReduceCounter() as counter:
            out = proj(tower(pixel_values=images).last_hidden_state)
            out.float().pow(2).mean().backward()
            counter.phase = "dp"
            if dp > 1:  # one flat gradient all-reduce over dp, as a data-parallel engine does
                flat = torch.cat([p.grad.flatten() for p in params])
                dist.all_reduce(flat, group=stage.dp)
        dist.barrier()
        if step >= 2:
            times.append(time.perf_counter() - start)
            counts.append(counter.bytes)
    local_params = sum(p.numel() for p in params)
    return dict(tp=tp, dp=dp, images=per_dp, ms=1e3 * statistics.median(times), params=local_params,
                tp_bytes=counts[-1].get("tp", 0), dp_bytes=counts[-1].get("dp", 0))


def worker(rank, world, steps):
    from ds_hetero.topology.groups import build_groups
    from ds_hetero.layout import StageLayout

    ranks = tuple(range(WORLD))
    groups = build_groups({f"tp{t}": StageLayout(f"tp{t}", t, 1, WORLD // t, ranks) for t in (1, 2, 4)}, rank)
    rows = [run_layout(rank, tp, groups, steps) for tp in (1, 2, 4)]
    dist.barrier()
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    from ds_hetero.testing.launch import run_distributed

    rows = run_distributed(worker, WORLD, timeout=1800, backend="gloo", pg_timeout_s=600, args=(args.steps,),
                           env={"DS_ACCELERATOR": "cpu"})[0]
    print(f"vision stage: CLIP tower {VISION} + LLaVA projector -> {TEXT_HIDDEN}; "
          f"{GLOBAL_IMAGES} images per step on {WORLD} CPU ranks (gloo), median of {args.steps} steps")
    print(f"{'tp':>3} {'dp':>3} {'img/rank':>8} {'params/rank':>11} {'step ms':>8} "
          f"{'tp all-reduce MB':>16} {'dp all-reduce MB':>16} {'total MB':>9}")
    for r in rows:
        mb = lambda b: b / 2**20  # noqa: E731
        print(f"{r['tp']:>3} {r['dp']:>3} {r['images']:>8} {r['params']:>11,} {r['ms']:>8.1f} "
              f"{mb(r['tp_bytes']):>16.2f} {mb(r['dp_bytes']):>16.2f} {mb(r['tp_bytes'] + r['dp_bytes']):>9.2f}")
    print("bytes: payload per rank per step (all ranks alike); all-reduce over n ranks moves ~2(n-1)/n of it")


if __name__ == "__main__":
    main()
