"""Test utilities shipped with the package (as torch.testing or accelerate.test_utils are).

    launch    run a function on N local processes joined by a process group (tests and benchmarks)
    parity    train with ds_hetero and with one unmodified Hugging Face process on the same data
    samples   small LLaVA / Qwen2-VL samples for the parity reference
    uneven    batches with an uneven number of images per sample (balancing)

Nothing here is imported by the training code; these modules import the package, never its root.
"""
