"""The pass bar of the model-family parity tests (tests/helpers/family_parity.py results), shared by
the family test modules."""

RTOL, ATOL, CLIP = 1e-5, 1e-6, 0.3


def check_family_parity(results, weight_rtol=RTOL, weight_atol=ATOL):
    for rank, per_rank in enumerate(results):
        for name, r in per_rank.items():
            assert len(r["losses"]) == len(r["ref_losses"]) == 5, (rank, name)
            for got, want in zip(r["losses"], r["ref_losses"]):
                assert abs(got - want) <= RTOL * abs(want), (rank, name, r["losses"], r["ref_losses"])
            for got, want in zip(r["norms"], r["ref_norms"]):
                assert abs(got - want) <= 1e-4 * abs(want), (rank, name, r["norms"], r["ref_norms"])
            assert min(r["ref_norms"]) > CLIP, r["ref_norms"]  # clipping was active
            err, where, abs_err, compared = r["weight_err"]
            assert compared > 0, (rank, name)
            assert err <= weight_rtol and abs_err <= weight_atol, (rank, name, err, where, abs_err)
            for total, bound in r["boundary"]:
                assert total == bound and bound % r["row_bytes"] == 0, (rank, name, total, bound, r["row_bytes"])
            if "wrong_weights" in r:
                rel, _, abs_, compared = r["wrong_weights"]
                assert compared > 0 and rel > 100 * RTOL and abs_ > 100 * ATOL, (rank, name, r["wrong_weights"])
