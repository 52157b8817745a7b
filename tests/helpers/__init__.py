"""Helpers shared by the test modules (references, simulators, pass bars, drivers); test modules import
these, never each other. What the benchmarks and recipes also use lives in ds_hetero/testing/."""
