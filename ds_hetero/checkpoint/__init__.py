"""Checkpoint formats ds_hetero writes besides DeepSpeed's own (see hf_export for Hugging Face's)."""
