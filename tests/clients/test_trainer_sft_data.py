"""HeteroTrainer on an SFTDataset (recipes/data/shapes_llava.json, the tiny Qwen2-VL and its processor) reads as
the launcher does: the length index's ids for the plan, real rows only at this rank's positions, no gather.

One 4-rank launch (launch_cases), ds_configs/trainer_colocated_packed.json (vision dp4, language tp2 dp2,
2 micro-batches, packed language rows: the positions a rank reads come from the plan), 2 steps each:
    workers0   dataloader_num_workers 0: losses; every `__getitem__` of each rank is one of its positions
               (needed by position, or given by the step's plan), each once; `hetero/data_wait_s` logged
    workers2   dataloader_num_workers 2, prefetch_factor 2: the same losses bit for bit, every row read in
               the workers (none in the rank's own process), as many as with 0 workers
    gather     the same rows through a plain Dataset (no index): rank_batch.py's all_gather path. Losses
               equal bit for bit; it reads more rows on some rank (negative control: it collates every
               language rank's by-position share to learn the ids, then the plan's)
    bad_row    a row that fails when read in a worker at step 0: every rank raises the same ValueError naming
               the row and the first rank that read it, before the step's collectives; none trains a step
"""

import multiprocessing
import os

import pytest

from ds_hetero.testing.cases import launch_cases

pytestmark = pytest.mark.distributed

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "recipes", "data")
CONFIG = os.path.join(ROOT, "ds_configs", "trainer_colocated_packed.json")
STEPS, BATCH = 2, 16


class _Plain:
    """A prepared SFTDataset behind a Dataset with no length index: the Trainer takes the collator path."""

    def __init__(self, data):
        self.data, self.reads = data, data.reads

    def __len__(self):
        return len(self.data)

    def __getitem__(self, index):
        return self.data[index]


def _dataset(processor, bad_index=None, plain=False):
    """shapes_llava.json as an SFTDataset counting its reads in this process (the class at module level)."""
    from tests.clients.test_trainer_sft_data_rows import CountingSFT

    data = CountingSFT.from_file(os.path.join(DATA, "shapes_llava.json"), processor, image_folder=DATA,
                                 index_dir=None)
    data.reads, data.bad_index = [], bad_index
    if not plain:
        return data
    data.prepare()  # here every rank alone: the plain view has no prepare() for the Trainer to call
    return _Plain(data)


def _train(rank, world_size, workers=0, plain=False, bad_index=None):
    import torch
    from accelerate.state import AcceleratorState
    from transformers import TrainingArguments

    import ds_hetero
    from ds_hetero.data.loader import GlobalBatchLoader
    from ds_hetero.families.meta import builtin_model
    from ds_hetero.toy.processors import tiny_processor

    # The launch helper's ranks are daemonic forkserver children: multiprocessing forbids them children, and
    # their default start method (forkserver) would pickle the dataset, whose tiny processor is a local class.
    # A rank the deepspeed launcher starts is neither, and forks its DataLoader workers (Linux) as these do.
    multiprocessing.current_process()._config["daemon"] = False
    multiprocessing.set_start_method("fork", force=True)
    AcceleratorState._reset_state(reset_partial_state=False)  # one Trainer per case, in one process
    model = builtin_model("tiny-qwen2-vl", seed=0)
    data = _dataset(tiny_processor(model), bad_index=bad_index, plain=plain)
    extra = dict(dataloader_num_workers=workers, dataloader_prefetch_factor=2) if workers else {}
    args = TrainingArguments(
        output_dir=f"/tmp/ds_hetero_trainer_sft_{os.getpid()}", max_steps=STEPS, per_device_train_batch_size=BATCH // 4,
        learning_rate=2e-3, adam_beta2=0.99, weight_decay=0.0, max_grad_norm=1.0, lr_scheduler_type="constant",
        logging_steps=1, save_strategy="no", report_to="none", disable_tqdm=True, use_cpu=True, seed=0,
        deepspeed=CONFIG, **extra)
    trainer = ds_hetero.HeteroTrainer(model=model, args=args, train_dataset=data)
    try:
        trainer.train()
    except ValueError as exc:
        return {"error": str(exc), "steps": trainer.hetero_engine.global_steps}
    logs = [h for h in trainer.state.log_history if "loss" in h]
    # what this rank should have read: its positions of each step, from the light batch and its plan
    path, index = trainer.hetero_engine.data_path, data if not plain else None
    expected = []
    if index is not None:
        order = GlobalBatchLoader(data, BATCH, seed=0)
        for step in range(STEPS):
            indices = order.indices(step)
            plan = path.plan_of([data.light(i) for i in indices])
            expected += sorted(indices[p] for p in path.needed_positions() | path.balanced_positions(plan))
    return {"losses": [h["loss"] for h in logs], "data_wait": [h.get("hetero/data_wait_s") for h in logs],
            "reads": list(data.reads), "expected": expected, "rows_prepared": trainer.rows_prepared,
            "grad_norms": [h["grad_norm"] for h in logs], "torch_threads": torch.get_num_threads()}


def _bad_index():
    """A row of step 0's batch (position 0: some language rank reads it)."""
    from ds_hetero.data.loader import GlobalBatchLoader

    class Sized:
        def __len__(self):
            return 48  # shapes_llava.json's rows, all usable

    return GlobalBatchLoader(Sized(), BATCH, seed=0).indices(0)[0]


@pytest.fixture(scope="module")
def runs():
    cases = {
        "workers0": (_train, {}),
        "workers2": (_train, {"workers": 2}),
        "gather": (_train, {"plain": True}),
        "bad_row": (_train, {"workers": 2, "bad_index": _bad_index()}),
    }
    return launch_cases(cases, world_size=4, timeout=1500)


def test_reads_only_its_positions(runs):
    for rank, r in enumerate(runs["workers0"]):
        assert len(r["losses"]) == STEPS and r["losses"][0] > 0, r
        assert sorted(r["reads"]) == sorted(r["expected"]), (rank, r["reads"], r["expected"])
        assert r["rows_prepared"] == len(r["expected"]) < STEPS * BATCH, rank
        assert all(w is not None and w >= 0 for w in r["data_wait"]), r["data_wait"]
    assert len({tuple(r["losses"]) for r in runs["workers0"]}) == 1


def test_workers_change_no_loss(runs):
    zero, two = runs["workers0"], runs["workers2"]
    for rank in range(4):
        assert two[rank]["losses"] == zero[rank]["losses"], (two[rank]["losses"], zero[rank]["losses"])
        assert two[rank]["grad_norms"] == zero[rank]["grad_norms"]
        assert two[rank]["reads"] == [], "rows were read in the rank's own process, not its workers"
        assert two[rank]["rows_prepared"] == zero[rank]["rows_prepared"]


def test_same_losses_as_the_gather_path_which_reads_more(runs):
    zero, gather = runs["workers0"], runs["gather"]
    assert gather[0]["losses"] == zero[0]["losses"], (gather[0]["losses"], zero[0]["losses"])
    reads_new = [len(r["reads"]) for r in zero]
    reads_old = [len(r["reads"]) for r in gather]
    assert all(o >= n for o, n in zip(reads_old, reads_new)) and sum(reads_old) > sum(reads_new), \
        (reads_old, reads_new)


def test_a_bad_row_in_a_worker_stops_every_rank_alike(runs):
    results = runs["bad_row"]
    assert all("error" in r and r["steps"] == 0 for r in results), results
    assert len({r["error"] for r in results}) == 1, results
    error = results[0]["error"]
    assert f"row {_bad_index()}: a test row broken past its header" in error, error
    assert "found an invalid sample in the global batch" in error, error  # the batch agreement refused it
