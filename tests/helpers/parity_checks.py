"""The pass bar of the engine parity tests (ds_hetero.testing.parity.train_both results), shared
by every test module that trains against the single-process reference."""

RTOL = 1e-5  # relative, per weight tensor: max|diff| / max|w|
ATOL = 1e-6  # absolute, on every entry
CLIP = 0.3


def check_parity(results):
    """Every rank's train_both results against the reference: losses, norms, weights, boundary bytes,
    and the negative controls (when run) far from the run."""
    for rank, per_rank in enumerate(results):
        for name, r in per_rank.items():
            assert len(r["losses"]) == len(r["ref_losses"]) == len(r["hf_losses"]) > 0, (rank, name)
            for got, want, hf in zip(r["losses"], r["ref_losses"], r["hf_losses"]):
                assert abs(got - want) <= RTOL * abs(want), (rank, name, r["losses"], r["ref_losses"])
                # the reference's loss is the unmodified Hugging Face model's own loss
                assert abs(want - hf) <= RTOL * abs(hf), (rank, name, r["ref_losses"], r["hf_losses"])
                assert abs(got - hf) <= RTOL * abs(hf), (rank, name, r["losses"], r["hf_losses"])
            for got, want in zip(r["norms"], r["ref_norms"]):
                assert abs(got - want) <= 1e-4 * abs(want), (rank, name, r["norms"], r["ref_norms"])
            # clipping was active: the norm exceeded the clip on every step
            assert min(r["ref_norms"]) > CLIP, r["ref_norms"]
            err, where, abs_err, compared = r["weight_err"]
            assert compared > 0, (rank, name, "no weight tensor was compared")
            assert err <= RTOL and abs_err <= ATOL, (rank, name, err, where, abs_err)
            for total, bound in r["boundary"]:
                assert total == bound, (name, total, bound)
            for control in ("per_stage_clip", "per_micro_batch_mean"):
                if control in r:
                    rel, _, abs_, compared = r[control]
                    assert compared > 0, (name, control)
                    assert rel > 100 * RTOL and abs_ > 100 * ATOL, (name, control, r[control])
