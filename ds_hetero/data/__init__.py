"""The runtime data path: global batches read per rank (loader.py), the sample forms train_batch and the
Trainer accept (samples.py), and one verdict on each global batch (agreement.py). The synthetic datasets of the
demos and tests live in ds_hetero/toy/."""

from .samples import as_sample_list, split_collated

__all__ = ["as_sample_list", "split_collated"]
