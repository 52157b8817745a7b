"""When the colocated encoders' work may leave the phased order (schedule/pipeline_fill.py), pure.

fill_drain.py places only the boundary exchanges as collectives; an encoder whose own forward or
backward is a collective with other pipeline stages (a tp group across them, ZeRO 2's
reduce-scatter in every backward, ZeRO 3's gathers in every forward) would deadlock or mismatch
at different 1F1B steps on different ranks (ZeRO 3 pp2 dp2 with vision dp4 hung in step 0), so
those run phased.
"""

from types import SimpleNamespace

import pytest

from ds_hetero.schedule.pipeline_fill import encoder_work_is_local
from ds_hetero.layout import StageLayout

LANGUAGE = StageLayout("language", 1, 1, 2, (0, 1, 2, 3), pp=2)  # pipeline stages {0, 1}, {2, 3}


def _stages(encoder: StageLayout, zero: int, trains: bool = True):
    config = SimpleNamespace(zero_stage_of=lambda name: zero)
    return SimpleNamespace(language=SimpleNamespace(layout=LANGUAGE), config=config,
                           encoders=[SimpleNamespace(name=encoder.name, layout=encoder, trains=trains)])


@pytest.mark.parametrize("tp, dp, zero, trains, local", [
    (1, 4, 0, True, True),
    (1, 4, 1, True, True),
    (2, 2, 1, True, True),    # tp groups (0, 1), (2, 3): inside one pipeline stage each
    (4, 1, 1, True, False),   # tp group (0, 1, 2, 3) spans both pipeline stages
    (1, 4, 2, True, False),   # ZeRO 2 reduce-scatters in every backward
    (1, 4, 3, True, False),   # ZeRO 3 gathers in every forward
    (1, 4, 3, False, True),   # a frozen encoder's engine runs without ZeRO
])
def test_encoder_work_is_local(tp, dp, zero, trains, local):
    vision = StageLayout("vision", tp, 1, dp, (0, 1, 2, 3))
    assert encoder_work_is_local(_stages(vision, zero, trains)) is local


def test_tp_group_across_pipeline_stages_with_another_rank_order():
    # tp groups (0, 2) and (1, 3) would each join both pipeline stages
    vision = StageLayout("vision", 2, 1, 2, (0, 2, 1, 3))
    assert encoder_work_is_local(_stages(vision, 1)) is False
