"""Several checks in one launch: a worker that runs named cases in order on the same ranks.

    from ds_hetero.testing.cases import run_cases
    results = run_distributed(run_cases, world_size=4, cases={"a": (check_a, {}), "b": (check_b, {"x": 1})})
    results[rank]["a"]  # what check_a(rank, world_size) returned on that rank

Each launch costs a process group, the children's first DeepSpeed and model imports and the
first engine build's warm-up; tests that share a world size share one launch this way (a
module-scoped fixture launches once, one test per case reads its entry), so a failure still
names its case. Every case runs on every rank in the same order, so their collectives pair up.
A case that raises stops the launch (the other ranks may be waiting in its collectives) with
its name in the error.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping


def run_cases(rank: int, world_size: int, cases: Mapping[str, tuple[Callable[..., Any], dict]]) -> dict[str, Any]:
    """{name: fn(rank, world_size, **kwargs)} for every (fn, kwargs) in `cases`, in order."""
    out = {}
    for name, (fn, kwargs) in cases.items():
        try:
            out[name] = fn(rank, world_size, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - name the case, keep the original traceback
            raise RuntimeError(f"case {name!r} ({fn.__name__}) failed on rank {rank}") from exc
    return out


def launch_cases(cases: Mapping[str, tuple[Callable[..., Any], dict]], world_size: int, timeout: float
                 ) -> dict[str, list[Any]]:
    """`cases` in one launch of `world_size` ranks: {case: [its result on each rank]}."""
    from .launch import run_distributed

    results = run_distributed(run_cases, world_size=world_size, timeout=timeout, cases=cases)
    return {name: [r[name] for r in results] for name in cases}
