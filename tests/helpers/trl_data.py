"""A TRL user's inputs for the tests: the locally built processors and the messages + images dataset."""

from ds_hetero.toy.messages import messages_dataset  # noqa: F401
from ds_hetero.toy.processors import tiny_llava_processor, tiny_qwen2_vl_processor  # noqa: F401
