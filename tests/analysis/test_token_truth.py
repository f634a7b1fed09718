"""Within-turn credit accuracy against the token truth (credit_accuracy(truth="mc-token")): numbers by
hand on small cases (credit equal to the truth scores 1, flat credit 0 by construction and says so, the
uncertain share, the sign agreement), both slopes on a constructed case with known values, the
withholding below the minimum reliability, chunks adding up, and the fast table equal to the reference
loop."""

import math

import numpy as np
import pandas as pd
import pytest

from mpo_viz.analysis import (
    FLAT_NOTE,
    MIN_RELIABILITY,
    NO_TURN_NOTE,
    credit_accuracy,
    finish_mc_token_accuracy,
    mc_token_accuracy,
    mc_token_accuracy_parts,
    mc_token_accuracy_reference,
    renamed_columns,
    token_truth_table,
)
from mpo_viz.data.trajectory import TrajectoryBatch

NAN = math.nan


def _batch(turns, *, rule="all", threshold=0.01, turn_truth=None):
    """One row per entry of ``turns``: a list of turns, each a list of tokens ``(Â, Â_a, Â_b, se,
    measured, control)`` (None for a token not measured); each turn followed by one observation token."""
    rows, fields = (
        [],
        {
            k: []
            for k in (
                "mc_tok_adv",
                "mc_tok_adv_a",
                "mc_tok_adv_b",
                "mc_tok_adv_se",
                "mc_tok_measured",
                "mc_tok_control",
            )
        },
    )
    for i, row in enumerate(turns):
        mask, vals = [], {k: [] for k in fields}
        for turn in row:
            for tok in turn:
                mask.append(1)
                if tok is None:
                    tok = (NAN, NAN, NAN, NAN, 0, 0)
                for k, v in zip(fields, tok):
                    vals[k].append(v)
            mask.append(0)
            for k in fields:
                vals[k].append(NAN if not k.endswith(("measured", "control")) else 0)
        rows.append(
            {
                "traj_id": f"t{i}",
                "group_id": "g",
                "prompt_ids": [1],
                "response_ids": [2] * len(mask),
                "loss_mask": mask,
                "reward": 0.0,
            }
        )
        for k in fields:
            fields[k].append(vals[k])
    b = TrajectoryBatch.from_rows(rows).with_token_fields(**fields)
    if turn_truth is not None:
        b = b.with_turn_fields(**turn_truth)
    return b.with_meta(mc_truth={"tokens": {"positions": rule, "threshold": threshold}})


def _pad(batch, per_token_rows):
    """Per-row lists of per-action-token credit -> a (B, L) array (observation tokens 0)."""
    L = int(batch.lengths.max())
    out = np.zeros((len(batch), L))
    masks = batch.field("loss_mask")
    for i, vals in enumerate(per_token_rows):
        act = np.flatnonzero(np.asarray(masks[i]) != 0)
        out[i, act] = vals
    return out


def _exact(a):
    return (a, a, a, 0.0, 1, 0)


def test_credit_equal_to_the_truth_scores_one_and_flat_credit_zero_by_construction():
    # two turns, every token measured, halves equal (reliability 1)
    A = [[0.4, -0.1, 0.0], [0.2, 0.3]]
    b = _batch([[[_exact(x) for x in turn] for turn in A]])
    flat = [np.mean(t) for t in A]  # each turn's mean spread over it: its within-turn part is 0
    adv = {"truth": _pad(b, [sum(A, [])]), "flat": _pad(b, [[flat[0]] * 3 + [flat[1]] * 2])}
    df = credit_accuracy(b, adv, truth="mc-token").set_index("estimator")
    t = df.loc["truth"]
    assert (
        t.tok_corr == pytest.approx(1.0) and t.within_corr == pytest.approx(1.0) and t.reliability == pytest.approx(1)
    )
    assert t.tok_corr_dis == pytest.approx(1.0) and t.within_corr_dis == pytest.approx(1.0) and t.within_note == ""
    assert t.slope_credit_on_truth == pytest.approx(1.0) and t.slope_truth_on_credit == pytest.approx(1.0)
    f = df.loc["flat"]
    assert f.within_corr == 0.0 and f.within_corr_dis == 0.0 and f.within_note == FLAT_NOTE
    assert math.isnan(f.within_corr_lo) and math.isnan(f.within_corr_hi)
    # by hand: the flat credit's token correlation is the correlation of (.1,.1,.1,.25,.25) with A
    assert f.tok_corr == pytest.approx(np.corrcoef([0.1, 0.1, 0.1, 0.25, 0.25], sum(A, []))[0, 1])
    assert (t.n_tokens, t.n_turns) == (5, 2)


def test_the_within_part_is_centred_by_the_turn_truth():
    """Â_k from the turn-level truth (mc_q − mc_value): the truth's within part is Â_t − Â_k/n_k."""
    toks = [[_exact(0.5), None, _exact(-0.2)]]  # token 1 not measured
    tt = {
        "mc_value": [[0.2]],
        "mc_value_se": [[0.0]],
        "mc_value_a": [[0.2]],
        "mc_value_b": [[0.2]],
        "mc_q": [[0.8]],
        "mc_q_se": [[0.0]],
    }  # Â_k = 0.6, n_k = 3 -> mean 0.2
    b = _batch([toks, toks], rule="uncertain", turn_truth={k: v * 2 for k, v in tt.items()})
    tab = token_truth_table(b, {"x": _pad(b, [[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]])})
    np.testing.assert_allclose(tab["truth_within"], [0.3, -0.4] * 2)
    np.testing.assert_allclose(tab["within_x"], [-1.0, 1.0] * 2)  # credit minus its turn mean 2
    assert tab["t"].tolist() == [0, 2] * 2 and tab["turn"].tolist() == [0, 0] * 2
    # without a turn truth, and not every token measured: the within part is not scored, and said so
    no = mc_token_accuracy(_batch([toks, toks], rule="uncertain"), {"x": _pad(b, [[1.0, 2.0, 4.0]] * 2)})
    assert math.isnan(no.within_corr.iloc[0]) and no.within_note.iloc[0] == NO_TURN_NOTE


def test_uncertain_share_and_sign_agreement_by_hand():
    # a turn of 4: tokens 0 and 2 measured by the rule, 3 a control, 1 not measured
    turn = [(0.3, 0.3, 0.3, 0.1, 1, 0), None, (-0.2, -0.2, -0.2, 0.2, 1, 0), (0.02, 0.02, 0.02, 0.01, 1, 1)]
    b = _batch([[turn]], rule="uncertain")
    df = mc_token_accuracy(b, {"x": _pad(b, [[1.0, 2.0, 3.0, -4.0]])}).iloc[0]
    assert df.unc_share == pytest.approx((1 + 3) / 10)
    # the truth: |Â| 0.5 on the uncertain tokens; the control 0.02 and the unmeasured token at the controls' mean 0.02
    assert df.unc_share_truth == pytest.approx(0.5 / (0.5 + 0.02 + 0.02))
    # clear signs (|Â| > 1.96 se): token 0 (0.3 > 0.196) and the control (0.02 > 0.0196); not token 2 (0.2 < 0.392)
    assert df.n_sign == 2 and df.sign_agreement == pytest.approx(0.5)  # token 0 agrees, the control does not


def test_both_slopes_on_a_constructed_case_with_known_values():
    """A ~ N(0, 1), halves Â^{a,b} = A + N(0, 0.5) each (Â = their mean: noise variance 0.25, ρ = 0.8):
    credit c = 2A gives slope_credit_on_truth 2ρ = 1.6 raw and 2 corrected, slope_truth_on_credit 0.5
    (unbiased by the truth's noise)."""
    rng = np.random.default_rng(0)
    n = 40000
    A = rng.normal(size=n)
    a, bb = A + rng.normal(0, np.sqrt(0.5), n), A + rng.normal(0, np.sqrt(0.5), n)
    est = (a + bb) / 2
    b = _batch([[[(est[j], a[j], bb[j], 0.5, 1, 0) for j in range(i, i + 4)]] for i in range(0, n, 4)])
    row = mc_token_accuracy(b, {"c": _pad(b, [2 * A[i : i + 4] for i in range(0, n, 4)])}).iloc[0]
    assert row.reliability == pytest.approx(0.8, abs=0.01)
    assert row.slope_credit_on_truth == pytest.approx(1.6, abs=0.03)
    assert row.slope_credit_on_truth_dis == pytest.approx(2.0, abs=0.04)
    assert row.slope_truth_on_credit == pytest.approx(0.5, abs=0.01)
    assert row.tok_corr_dis == pytest.approx(1.0, abs=0.01) and row.tok_dis_hi <= 1.0


def test_a_truth_too_noisy_gives_no_verdict():
    rng = np.random.default_rng(1)
    n = 400
    A = rng.normal(0, 0.1, n)
    a, bb = A + rng.normal(0, 1, n), A + rng.normal(0, 1, n)  # reliability ~ 0.02
    b = _batch([[[((a[j] + bb[j]) / 2, a[j], bb[j], 0.7, 1, 0) for j in range(i, i + 4)]] for i in range(0, n, 4)])
    row = mc_token_accuracy(b, {"c": _pad(b, [A[i : i + 4] for i in range(0, n, 4)])}).iloc[0]
    assert row.reliability < MIN_RELIABILITY
    assert math.isnan(row.tok_corr_dis) and math.isnan(row.slope_credit_on_truth_dis) and math.isfinite(row.tok_corr)
    assert "too little data for a verdict" in row.note


def _random_batch(seed, n_rows=12):
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n_rows):
        row = []
        for _ in range(rng.integers(1, 4)):
            turn = []
            for _ in range(rng.integers(1, 6)):
                if rng.random() < 0.6:
                    x = rng.normal(0, 0.3)
                    turn.append(
                        (
                            x,
                            x + rng.normal(0, 0.1),
                            x + rng.normal(0, 0.1),
                            abs(rng.normal(0, 0.1)),
                            1,
                            int(rng.random() < 0.2),
                        )
                    )
                else:
                    turn.append(None)
            row.append(turn)
        rows.append(row)
    b = _batch(rows, rule="uncertain")
    k = b.num_turns
    v = [rng.uniform(0, 1, n).tolist() for n in k]
    b = b.with_turn_fields(mc_value=v, mc_value_se=[[0.1] * n for n in k], mc_value_a=v, mc_value_b=v)
    adv = {"x": rng.normal(size=tuple(b.mask.shape)), "y": rng.normal(size=tuple(b.mask.shape))}
    return b, adv


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_fast_table_equals_the_reference_loop_and_chunks_add_up(seed):
    b, adv = _random_batch(seed)
    fast = mc_token_accuracy(b, adv)
    ref = mc_token_accuracy_reference(b, adv)
    pd.testing.assert_frame_equal(fast, ref, check_dtype=False, rtol=1e-9, atol=1e-12)
    # two chunks (rows split) pooled = the whole
    parts = [
        mc_token_accuracy_parts(b[list(range(0, 5))], {k: v[:5] for k, v in adv.items()}),
        mc_token_accuracy_parts(b[list(range(5, len(b)))], {k: v[5:] for k, v in adv.items()}),
    ]
    L0, L1 = int(b[list(range(0, 5))].lengths.max()), int(b[list(range(5, len(b)))].lengths.max())
    parts = [
        mc_token_accuracy_parts(b[list(range(0, 5))], {k: v[:5, :L0] for k, v in adv.items()}),
        mc_token_accuracy_parts(b[list(range(5, len(b)))], {k: v[5:, :L1] for k, v in adv.items()}),
    ]
    pd.testing.assert_frame_equal(finish_mc_token_accuracy(parts), fast, check_dtype=False, rtol=1e-9, atol=1e-12)


def test_missing_token_truth_is_said():
    b = TrajectoryBatch.from_rows(
        [
            {
                "traj_id": "a",
                "group_id": "g",
                "prompt_ids": [1],
                "response_ids": [2, 3],
                "loss_mask": [1, 1],
                "reward": 1.0,
            }
        ]
    )
    with pytest.raises(ValueError, match="within-turn accuracy needs the token truth"):
        credit_accuracy(b, {"x": np.zeros((1, 2))}, truth="mc-token")
    with pytest.raises(ValueError, match="'mc-token'"):
        credit_accuracy(b, {"x": np.zeros((1, 2))}, truth="token")


def test_old_column_names_are_read_with_a_note():
    old = pd.DataFrame({"estimator": ["a"], "turn_corr": [0.5], "turn_slope": [0.8], "turn_slope_dis": [1.0]})
    with pytest.warns(FutureWarning, match="turn_slope, turn_slope_dis"):
        new = renamed_columns(old)
    assert list(new.columns) == [
        "estimator",
        "turn_corr",
        "slope_credit_on_truth",
        "slope_credit_on_truth_dis",
        "slope_truth_on_credit",
    ]
    assert new.slope_truth_on_credit.iloc[0] == pytest.approx(0.25 / 0.8)
    assert renamed_columns(new) is new  # already new: as it is
