import os


# Tests run on CPU ranks with gloo. On a GPU machine leave the accelerator to DeepSpeed.
try:
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
except ImportError:  # pragma: no cover
    pass


def pytest_configure(config):
    config.addinivalue_line("markers", "distributed: launches several processes (gloo)")
