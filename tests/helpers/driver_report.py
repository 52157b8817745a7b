"""The ending every launcher-run driver shares: each rank writes its report to OUT/rank<RANK>.json and exits
non-zero after a crash; the output folder is the script's one argument besides the launcher's --local_rank."""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Callable


def write_report(out: str, report: dict[str, Any]) -> int:
    """This rank's report to OUT/rank<RANK>.json; the exit code (1 after a crash, recorded under "crash")."""
    with open(os.path.join(out, f"rank{os.environ['RANK']}.json"), "w") as f:
        json.dump(report, f)
    return 1 if "crash" in report else 0


def run_driver(main: Callable[[str], int]) -> None:
    """`main(out)` with the output folder the launcher passed (its --local_rank dropped); exit with its code."""
    sys.exit(main([a for a in sys.argv[1:] if not a.startswith("--local_rank")][0]))


def load_recipe(root: str, name: str):
    """recipes/<name>.py as a module (registered in sys.modules: dataclasses look their module up there)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, os.path.join(root, "recipes", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def fresh_accelerate_state() -> None:
    """Forget the last Trainer's Accelerator: AcceleratorState is a process-wide singleton that would keep
    the first run's DeepSpeed plugin. A script runs one Trainer or Accelerator; a driver runs several."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=False)


def free_port() -> str:
    """A free TCP port on the loopback, for a launcher's --master_port."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def launch_driver(root: str, driver: str, out, timeout: float, world: int = 4) -> list[dict[str, Any]]:
    """Run tests/helpers/<driver> under the `deepspeed` launcher on `world` CPU ranks, writing to `out`; every
    rank's report, after asserting each rank wrote one, none crashed and the launcher exited 0."""
    import subprocess

    bin_dir = os.path.dirname(sys.executable)
    env = {**os.environ, "PYTHONPATH": root, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([f"{bin_dir}/deepspeed", "--num_gpus", str(world), "--master_port", free_port(),
                           f"tests/helpers/{driver}", str(out)], cwd=root, env=env, capture_output=True, text=True,
                          timeout=timeout)
    ranks = []
    for r in range(world):
        path = os.path.join(str(out), f"rank{r}.json")
        assert os.path.exists(path), proc.stdout[-3000:] + proc.stderr[-6000:]
        with open(path) as f:
            ranks.append(json.load(f))
    assert not any("crash" in r for r in ranks), [r.get("crash") for r in ranks]
    assert proc.returncode == 0, proc.stderr[-6000:]
    return ranks
