"""An SFTDataset that counts the rows read in this process and can fail one (tests/clients/test_trainer_sft_data.py),
at module level so that DataLoader workers receive it pickled; and its own check in one process."""

import os

from ds_hetero.sft_data import SFTDataset
from ds_hetero.sft_data.rows import BadRowError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "recipes", "data")


class CountingSFT(SFTDataset):
    reads: list = []
    bad_index = None

    def __getitem__(self, index):
        self.reads.append(int(index))
        if index == self.bad_index:
            raise BadRowError("shapes_llava.json", int(index), "a test row broken past its header")
        return super().__getitem__(index)


def test_counting_dataset_reads_and_fails_by_name():
    from ds_hetero.families.meta import builtin_model
    from ds_hetero.toy.processors import tiny_processor

    data = CountingSFT.from_file(os.path.join(DATA, "shapes_llava.json"), tiny_processor(builtin_model("tiny-qwen2-vl")),
                                 image_folder=DATA, index_dir=None)
    data.reads, data.bad_index = [], 5
    assert data[3]["input_ids"].tolist() == data.light(3)["input_ids"].tolist() and data.reads == [3]
    try:
        data[5]
    except BadRowError as exc:
        assert "row 5" in str(exc) and "broken past its header" in str(exc)
    else:
        raise AssertionError("row 5 should fail")
