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


class ConfigFileError(HeteroConfigError):
    """A config file that cannot be read or parsed. Its message names the file (and, for a syntax
    error, the line and column) rather than a field: no field has been read yet."""

    def __init__(self, path: str, message: str):
        self.field = "config"
        self.path = path
        ValueError.__init__(self, f"config file {path}: {message}")
