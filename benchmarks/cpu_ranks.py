"""The benchmarks' launcher: the tests' own (ds_hetero.testing.launch.run_distributed) on 4 CPU ranks.

Each call forks fresh processes from a forkserver that has imported torch, DeepSpeed and
transformers once, joins them with gloo and returns one result per rank; a rank that fails makes
the call raise with its traceback.
"""

from __future__ import annotations

from ds_hetero.testing.launch import run_distributed

WORLD = 4  # ranks of a launch; validate_planner sets 2 for its one-rank-per-core rows


def _in_world(rank, world, fn, *args):
    # A forked rank re-imports this module: give it the parent's WORLD (the plain rows read it).
    global WORLD
    WORLD = world
    return fn(rank, world, *args)


def launch(fn, *args, timeout=1200.0):
    """fn(rank, WORLD, *args) on WORLD fresh gloo processes; per-rank results."""
    return run_distributed(_in_world, WORLD, timeout=timeout, backend="gloo", pg_timeout_s=600, args=(fn, *args),
                           env={"DS_ACCELERATOR": "cpu"})
