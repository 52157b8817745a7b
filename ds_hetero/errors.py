"""Errors raised by ds_hetero."""


class HeteroConfigError(ValueError):
    """An invalid heterogeneous-parallel configuration or input.

    Raised before any collective and identically on every rank (it depends only on the
    configuration, the world size and the data every rank sees), so no rank is left waiting.
    The message names the field, the bad value and what would be valid.
    """

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(f"hetero_parallel config error at '{field}': {message}")
