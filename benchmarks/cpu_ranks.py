"""The benchmarks' launcher: the tests' own (ds_hetero.testing.launch.run_distributed) on CPU ranks.

Each call forks fresh processes from a forkserver that has imported torch, DeepSpeed and
transformers once, joins them with gloo and returns one result per rank; a rank that fails makes
the call raise with its traceback. The world size is an argument (4 by default;
validate_planner's one-rank-per-core rows pass 2); the rows read it from their arguments too.
"""

from __future__ import annotations

from ds_hetero.testing.launch import run_distributed

DEFAULT_WORLD = 4


def launch(fn, *args, world=DEFAULT_WORLD, timeout=1200.0):
    """fn(rank, world, *args) on `world` fresh gloo processes; per-rank results."""
    return run_distributed(fn, world, timeout=timeout, backend="gloo", pg_timeout_s=600, args=args,
                           env={"DS_ACCELERATOR": "cpu"})
