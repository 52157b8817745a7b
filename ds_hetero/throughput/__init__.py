"""What a step computed and how fast: FLOPs per stage from the model's shapes and the step's real
lengths (step_flops.py), the device's peak (peaks.py), and TFLOP/s per device and MFU per stage and
for the job, in two scopes (meter.py)."""
