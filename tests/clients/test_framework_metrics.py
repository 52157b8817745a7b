"""Where TRL's and ms-swift's token metrics and the Trainer's flops go under ds_hetero (pure; the launched
runs are tests/clients/test_clients.py for TRL and tests/clients/test_swift.py for ms-swift)."""

from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from ds_hetero.integrations.trainer import framework_metrics as fm


class _Tokens:
    def __init__(self, values):
        self.values = values

    def reduce(self):
        return dict(self.values)


def _swift(strategy="token"):
    return SimpleNamespace(custom_metrics={"train": {}, "eval": {}}, args=SimpleNamespace(acc_strategy=strategy))


def _trl():
    return SimpleNamespace(_metrics={"train": defaultdict(list)}, _total_train_tokens=42, args=SimpleNamespace())


def test_frameworks_are_told_apart():
    assert fm.framework(_trl()) == "trl"
    assert fm.framework(_swift()) == "swift"
    assert fm.framework(SimpleNamespace(args=SimpleNamespace())) is None


def test_swift_token_acc_goes_into_the_logs():
    logs = {"loss": 1.0}
    fm.publish(_swift(), _Tokens({"mean_token_accuracy": 0.25, "entropy": 3.0}), logs)
    assert logs == {"loss": 1.0, "token_acc": 0.25}


def test_swift_seq_strategy_is_not_given_the_token_accuracy():
    """Negative control: "seq" is whole-sequence accuracy; the token count must not stand in for it."""
    logs = {}
    fm.publish(_swift("seq"), _Tokens({"mean_token_accuracy": 0.25}), logs)
    assert logs == {}


def test_trl_metrics_go_into_its_lists():
    trainer, logs = _trl(), {}
    fm.publish(trainer, _Tokens({"mean_token_accuracy": 0.5, "entropy": 2.0}), logs)
    assert logs == {} and dict(trainer._metrics["train"]) == {"mean_token_accuracy": [0.5], "entropy": [2.0],
                                                              "num_tokens": [42]}


def test_flops_are_the_trainers_formula_on_the_global_batch():
    from ds_hetero.toy import tiny_llava

    model = tiny_llava(seed=0)
    per_token = fm.flops_per_token(model)
    assert per_token == 6 * model.num_parameters(exclude_embeddings=True)
    samples = [{"input_ids": torch.zeros(n, dtype=torch.long)} for n in (7, 9, 12)]
    shares = [fm.flops_share(per_token, samples, 4) for _ in range(4)]  # every rank adds its share
    stock = 6 * model.num_parameters(exclude_embeddings=True) * 28  # Trainer.floating_point_ops, unpadded
    assert sum(shares) == pytest.approx(stock, rel=1e-12)
    assert fm.flops_per_token(torch.nn.Linear(2, 2)) == 0.0  # not a PreTrainedModel: stock counts 0 too

