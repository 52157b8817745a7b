"""What a run prints (ds_hetero/reporting/): the layout line, the summary's labels, the progress log
without a terminal, the startup lines. Pure text: no process group, no model."""

import io
import logging

from ds_hetero import load_config
from ds_hetero.reporting import DataSource, data_source, layout_line
from ds_hetero.reporting.progress import Progress, step_text
from ds_hetero.reporting import startup
from ds_hetero.reporting.startup import LOGGER, PhaseClock, first_line, hide_cpu_accelerator_message, show_startup
from ds_hetero.reporting.summary_text import JSON_ONLY, summary_lines
from ds_hetero.result import StepResult


def _cfg(language, vision=None, batch=16, **section):
    return load_config({"train_batch_size": batch, "zero_optimization": {"stage": 1},
                        "hetero_parallel": {"micro_batches": 2, **section,
                                            "stages": {"vision": vision or {"dp": 4}, "language": language}}}, 4)


def test_layout_line_names_every_axis_ep_and_packed_batching():
    cfg = _cfg({"tp": 2, "dp": 2, "ep": 2, "recompute": True}, vision={"dp": 4, "freeze": ["tower"], "zero_stage": 2},
               language_batching="packed", max_tokens_per_micro_batch=512)
    line = layout_line(cfg, DataSource("rows.jsonl", rows_used=46, rows_skipped=2))
    assert line == ("layout: colocated"
                    " | vision tp1 cp1 dp4 pp1 ep1 ZeRO 2 freeze tower recompute no"
                    " | language tp2 cp1 dp2 pp1 ep2 ZeRO 1 freeze no recompute all"
                    " | batch 16 in 2 micro-batches, packed (max 512 tokens per row)"
                    " | data rows.jsonl, 48 rows read, 2 skipped"), line


def test_layout_line_synthetic_data_disaggregated_ranks_and_sequence_parallel():
    cfg = _cfg({"tp": 2, "dp": 1, "sequence_parallel": True, "ranks": [2, 3]},
               vision={"dp": 2, "ranks": [0, 1], "freeze": True}, placement="disaggregated")
    line = layout_line(cfg, data_source(list(range(64))))
    assert " | vision tp1 cp1 dp2 pp1 ep1 ranks 0-1 ZeRO 0 freeze all recompute no" in line, line
    assert " | language tp2 cp1 dp1 pp1 ep1 sp ranks 2-3 ZeRO 1" in line, line
    assert line.startswith("layout: disaggregated") and line.endswith(
        "batch 16 in 2 micro-batches, samples | data synthetic, 64 samples"), line
    assert "| data" not in layout_line(cfg)  # validate: no dataset


class _Rows(list):
    skipped = ["bad row"]


def test_data_source_counts_skipped_rows_of_a_file():
    assert data_source(_Rows(range(10)), "f.json").describe() == "f.json, 11 rows read, 1 skipped"
    assert data_source(iter(()), None).describe() == "synthetic"  # no length: none claimed


SUMMARY = {
    "layout": "layout: colocated | vision ...", "steps": 20, "first_loss": 5.5462, "last_loss": 2.3202,
    "final_loss": 2.61, "last_grad_norm": 1.5, "losses": [5.5] * 20, "grad_norms": [1.0] * 20,
    "tokens_per_s": 40.0, "language_tokens_per_s_real": 600.0, "language_tokens_per_s_computed": 640.0,
    "samples_per_s": 5.3, "median_step_s": 2.75, "wall_s": 55.0, "stage_time_s_per_step": {"vision.forward": 0.2},
    "boundary_forward_bytes_per_step": 65536.0, "boundary_forward_lower_bound_per_step": 65536.0,
    "boundary_backward_bytes_per_step": 0.0, "peak_memory_mb_per_rank": [446.1, 445.5, 445.5, 445.4],
    "bubble_fraction_per_rank": [0.11, 0.059, 0.173, 0.189], "data_wait_s_per_step_per_rank": [0.008] * 4,
    "stages_per_rank": [("vision", "language")] * 4, "language_real_token_fraction": 0.94,
    "language_max_mean_load": 1.0,
}


def test_summary_labels_units_and_no_per_step_lists():
    text = "\n".join(summary_lines(SUMMARY, "out.json"))
    for label in ("loss, first step             5.5462", "loss, last step              2.3202",
                  "loss, mean of last 10 steps  2.6100  (steps 11-20)", "600 real, 640 computed",
                  "40 label tokens/s", "step time", "2.750 s median", "data wait per step", "0.0080 0.0080 0.0080 0.0080 s per rank",
                  "forward 64.0 KiB per step, lower bound 64.0 KiB (at the lower bound)",
                  "backward 0.0 KiB per step", "lower bound", "peak memory", "446 446 446 445 MB per rank",
                  "bubble", "11.0 5.9 17.3 18.9 % per rank: step time outside forward, backward and optimizer",
                  "per-step losses and grad norms, per-phase times: in out.json"):
        assert label in text, (label, text)
    assert "[5.5" not in text and "vision.forward" not in text  # the lists: --summary-json only
    assert set(JSON_ONLY) <= set(SUMMARY) | {"pipeline_last_step_per_rank"}
    assert max(len(line) for line in text.splitlines()) < 240


def test_summary_leaves_out_a_figure_the_run_lacks():
    lines = summary_lines({k: v for k, v in SUMMARY.items() if k != "peak_memory_mb_per_rank"})
    assert not any("peak memory" in line for line in lines)
    assert lines[-1].endswith("with --summary-json FILE")


def _result(loss):
    return StepResult(loss=loss, grad_norm=2.0, num_tokens=120, num_samples=16, step_time=3.0,
                      bubble_fraction=0.07, data_wait=0.005)


def test_progress_without_a_terminal_is_a_line_per_n_steps():
    out = io.StringIO()  # isatty() is False, as for a log file or a pipe
    progress = Progress(10, every=4, stream=out)
    for step in range(10):
        progress.update(_result(5.0 - step / 10))
    progress.close()
    lines = out.getvalue().splitlines()
    assert [line.split()[1] for line in lines] == ["1/10", "4/10", "8/10", "10/10"], lines
    assert "\r" not in out.getvalue()
    assert lines[-1] == step_text(10, 10, _result(4.1))
    assert lines[-1] == ("step 10/10  loss 4.1000  grad norm 2.00  step 3.00 s  40 tokens/s  data wait 0.005 s  "
                         "bubble 7.0 %")


def test_progress_prints_nothing_on_other_ranks():
    out = io.StringIO()
    progress = Progress(3, enabled=False, stream=out)
    for _ in range(3):
        progress.update(_result(1.0))
    assert out.getvalue() == ""


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_on_a_terminal_is_a_bar():
    out = _Terminal()
    progress = Progress(2, stream=out)
    progress.update(_result(1.0))
    progress.close()
    assert "\r" in out.getvalue() and "train" in out.getvalue()


def test_startup_lines_are_shown_once_where_asked():
    logger = logging.getLogger(LOGGER)
    saved = logger.handlers[:], logger.propagate, logger.level
    out = io.StringIO()
    try:
        logger.handlers = []
        show_startup(out, start=0.0)
        show_startup(out, start=0.0)  # a recipe's main() called twice: one handler
        PhaseClock().done("process groups of every stage built")
        lines = out.getvalue().splitlines()
        assert len(lines) == 1 and lines[0].startswith("ds_hetero startup")
        assert lines[0].endswith(" s  process groups of every stage built (0.0 s)"), lines
    finally:
        logger.handlers, logger.propagate, logger.level = saved


def test_trainer_log_line_prints_numbers_with_names():
    from ds_hetero.integrations.trainer.log_lines import log_line

    logs = {"loss": 4.65311, "grad_norm": 2.5111, "learning_rate": 0.002, "epoch": 0.02, "hetero/step_s": 1.097,
            "hetero/tokens_per_s": 114.2, "hetero/data_wait_s": 0.0041, "hetero/bubble_fraction": 0.129,
            "hetero/boundary_bytes": 65536.0, "hetero/boundary_lower_bound_bytes": 65536.0,
            "hetero/vision/forward_s": 0.18, "hetero/language/backward_s": 1.1, "hetero/language_max_mean": 1.0,
            "hetero/language_real_token_fraction": 1.0, "total_flos": 1e9, "mean_token_accuracy": 0.25}
    assert log_line(logs, 5) == ("step 5: loss 4.6531  grad norm 2.51  lr 0.002  epoch 0.02  step 1.10 s  "
                                 "114 tokens/s  data wait 0.004 s  bubble 12.9 %  boundary 64.0 KiB/step "
                                 "(lower bound 64.0 KiB)  mean_token_accuracy 0.25")


def test_validate_prints_the_layout_line_with_ep(capsys):
    import os

    from ds_hetero.cli import main

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert main(["validate", os.path.join(root, "ds_configs", "qwen3_vl_moe_ep.json"), "--world-size", "4"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("layout: colocated | vision tp1 cp1 dp4 pp1 ep1") and "language tp2 cp1 dp2 pp1 ep2" in last


def test_the_cpu_accelerator_message_is_hidden_and_nothing_else():
    """What the recipes call before importing DeepSpeed: its per-process CPU message goes, its others stay."""
    logger = logging.getLogger("DeepSpeed")
    seen = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = lambda record: seen.append(record.getMessage())
    saved = logger.filters[:], logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.filters = []  # as before any recipe ran in this process
    cpu = "Setting accelerator to CPU. If you have GPU or other accelerator, we were unable to detect it."
    try:
        logger.warning(cpu)  # negative control: before the filter it is shown
        hide_cpu_accelerator_message()
        hide_cpu_accelerator_message()  # main() or the module run twice in one process: one filter
        assert logger.filters.count(startup._not_the_cpu_accelerator_message) == 1
        logger.warning(cpu)
        logger.info("Setting ds_accelerator to cpu (override)")
    finally:
        logger.removeHandler(handler)
        logger.filters, logger.level = saved
    assert seen == [cpu, "Setting ds_accelerator to cpu (override)"]


def test_first_line_only_on_rank_zero(monkeypatch, capsys):
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "0")
    first_line("recipes/hf_trainer_llava.py", "torch, transformers and DeepSpeed")
    monkeypatch.setenv("RANK", "2")
    first_line("recipes/hf_trainer_llava.py", "torch, transformers and DeepSpeed")
    assert capsys.readouterr().out == ("ds_hetero: hf_trainer_llava.py starting on 4 rank(s), importing torch, "
                                       "transformers and DeepSpeed\n")
