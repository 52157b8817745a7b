"""Every integer field of the `hetero_parallel` section refuses floats and bools (pure, no processes).

`1.0 == 1` and `True == 1` in Python, so a check by value (`value in (0, 1, 2, 3)`) accepts
`"zero_stage": 1.0` and `"zero_stage": true`; each field below is given an integral float and a
bool, both refused with a HeteroConfigError naming that field, as `pp: 2.0` always was. Each
row's control: the same config with the int is accepted.
"""

import copy

import pytest

from ds_hetero.config import parse_config
from ds_hetero.errors import HeteroConfigError
from ds_hetero.planner.auto import auto_options

S = "hetero_parallel"
BASE = {"train_batch_size": 8, S: {"micro_batches": 2, "stages": {
    "vision": {"tp": 1, "dp": 4}, "language": {"tp": 2, "dp": 2}}}}
PIPE = {"train_batch_size": 8, S: {"micro_batches": 2, "stages": {
    "vision": {"dp": 4}, "language": {"dp": 2, "pp": 2, "pp_layers": [1, 1]}}}}
DISAGG = {"train_batch_size": 8, S: {"placement": "disaggregated", "micro_batches": 2, "stages": {
    "vision": {"dp": 2, "ranks": [0, 1]}, "language": {"tp": 2, "dp": 1, "ranks": [2, 3]}}}}
CP = {"train_batch_size": 8, S: {"micro_batches": 2, "stages": {
    "vision": {"dp": 4}, "language": {"cp": 2, "dp": 2}}}}

# (base config, path of keys to the int, index inside a list or None, the field the error names)
FIELDS = [
    (BASE, ("train_batch_size",), None, "train_batch_size"),
    (BASE, (S, "micro_batches"), None, f"{S}.micro_batches"),
    (BASE, (S, "stages", "vision", "tp"), None, f"{S}.stages.vision.tp"),
    (BASE, (S, "stages", "vision", "dp"), None, f"{S}.stages.vision.dp"),
    (BASE, (S, "stages", "language", "tp"), None, f"{S}.stages.language.tp"),
    (CP, (S, "stages", "language", "cp"), None, f"{S}.stages.language.cp"),
    (PIPE, (S, "stages", "language", "pp"), None, f"{S}.stages.language.pp"),
    (PIPE, (S, "stages", "language", "pp_layers"), 0, f"{S}.stages.language.pp_layers"),
    (DISAGG, (S, "stages", "vision", "ranks"), 1, f"{S}.stages.vision.ranks"),
    (BASE, (S, "stages", "vision", "micro_batches"), None, f"{S}.stages.vision.micro_batches"),
    (BASE, (S, "stages", "vision", "zero_stage"), None, f"{S}.stages.vision.zero_stage"),
    (BASE, (S, "stages", "language", "zero_stage"), None, f"{S}.stages.language.zero_stage"),
    (BASE, (S, "stages", "language", "recompute"), None, f"{S}.stages.language.recompute"),
]
GOOD = {"zero_stage": 1, "recompute": 1, "micro_batches": 2, "ranks": 1, "pp_layers": 1}


def _with(base, path, index, value):
    ds = copy.deepcopy(base)
    parent = ds
    for key in path[:-1]:
        parent = parent[key]
    if index is None:
        parent[path[-1]] = value
    else:
        parent[path[-1]][index] = value
    return ds


def _int_of(base, path, index):
    node = base
    for key in path:
        node = node.get(key) if isinstance(node, dict) else None
        if node is None:
            return GOOD[path[-1]]
    return node[index] if index is not None else node


@pytest.mark.parametrize("base,path,index,field", FIELDS, ids=[f[3] for f in FIELDS])
def test_integer_fields_refuse_floats_and_bools(base, path, index, field):
    good = _int_of(base, path, index)
    parse_config(_with(base, path, index, good), 4)  # the control: the int is accepted
    for bad in (float(good), True):
        if bad is True and field.endswith("recompute"):
            continue  # recompute: true is documented (every layer); its float is still refused
        with pytest.raises(HeteroConfigError) as err:
            parse_config(_with(base, path, index, bad), 4)
        assert err.value.field == field, (bad, err.value)


AUTO_FIELDS = [("seq_len", 512), ("image_tokens", 16), ("max_tp", 2), ("trial", 2), ("trial_steps", 3),
               ("micro_batches", 2), ("micro_batches", [1, 2]), ("rows", {"audio": 50})]


@pytest.mark.parametrize("key,good", AUTO_FIELDS, ids=[f"{k}={v}" for k, v in AUTO_FIELDS])
def test_auto_integer_fields_refuse_floats_and_bools(key, good):
    auto_options({"auto": True, key: good})  # the control
    if isinstance(good, list):
        bads = [[1, 2.0], [True, 2]]
    elif isinstance(good, dict):
        bads = [{"audio": 50.0}, {"audio": True}]
    else:
        bads = [float(good), True]
    for bad in bads:
        with pytest.raises(HeteroConfigError) as err:
            auto_options({"auto": True, key: bad})
        assert err.value.field == f"{S}.{key}", (bad, err.value)


def test_auto_memory_gb_is_a_positive_number():
    auto_options({"auto": True, "memory_gb": 16.5})  # a number: fractions allowed
    for bad in (True, 0, "16"):
        with pytest.raises(HeteroConfigError, match="memory_gb"):
            auto_options({"auto": True, "memory_gb": bad})
