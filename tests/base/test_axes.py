"""The parallelism axes are listed once (layout.AXES) and everything that enumerates axes reads that list:
a rank's coordinate, a stage's size and checks, the config keys of a stage. An axis added there (and its
folder, as tensor_parallel/ is one) is known to all of them."""

import pytest

from ds_hetero.config.schema import STAGE_KEYS
from ds_hetero.layout import AXES, Coord, StageLayout


def test_the_axes_in_rank_order_are_the_coordinate():
    assert AXES == Coord._fields == ("tp", "cp", "dp", "pp")


def test_every_axis_is_a_stage_key():
    assert set(AXES) <= set(STAGE_KEYS)


@pytest.mark.parametrize("axis", AXES)
def test_every_axis_is_checked_and_multiplies_the_stage_size(axis):
    sizes = {a: 1 for a in AXES}
    sizes[axis] = 2
    layout = StageLayout("language", ranks=(0, 1), **sizes)
    assert layout.size == 2
    with pytest.raises(ValueError, match=f"{axis} must be a positive int"):
        StageLayout("language", ranks=(0,), **{**sizes, axis: 0})
    with pytest.raises(ValueError, match="ranks were given"):
        StageLayout("language", ranks=(0,), **sizes)
