"""Turn-level credit estimators and λ rules on hand-derived numbers: MT-GRPO's baselines (and the
bias of its two per-turn-index rules when the policy decides when to stop, computed exactly by
enumerating every group, the "index" one also against MT-GRPO's own code), bi-level GAE on RAGEN's
own example, EMPG (no public code: a closed form by hand), the λ rules, EMPG's need for entropies."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

import mpo_viz.advantages as A
from mpo_viz.data.synthetic import make_batch
from mpo_viz.data.trajectory import TrajectoryBatch

GRPO_HALF = 0.5 / (math.sqrt(0.5) + 1e-4)  # GRPO's |A| in a group of two with scores 1 and 0 (ε = 1e-4)


# ----------------------------------------------------------------------------- MT-GRPO by hand


def _rows(turn_rewards: list[list[float]], tokens: int = 2):
    """(rewards, mask) for rows whose turn k has ``tokens`` action tokens and reward
    ``turn_rewards[i][k]`` on its last one, one observation token between turns."""
    width = max(len(t) for t in turn_rewards) * (tokens + 1)
    R, M = np.zeros((len(turn_rewards), width)), np.zeros((len(turn_rewards), width))
    for i, rs in enumerate(turn_rewards):
        for k, r in enumerate(rs):
            a = k * (tokens + 1)
            M[i, a : a + tokens] = 1
            R[i, a + tokens - 1] = r
    return R, M


def _per_turn(adv: np.ndarray, M: np.ndarray, tokens: int = 2) -> list[list[float]]:
    out = []
    for i in range(M.shape[0]):
        k = int(M[i].sum()) // tokens
        vals = [adv[i, j * (tokens + 1) : j * (tokens + 1) + tokens] for j in range(k)]
        assert all(np.ptp(v) == 0 for v in vals)  # constant over a turn's tokens
        out.append([float(v[0]) for v in vals])
    return out


def _close(got: list[list[float]], want: list[list[float]]) -> None:
    assert [len(r) for r in got] == [len(r) for r in want]
    np.testing.assert_allclose(np.concatenate(got), np.concatenate(want), rtol=0, atol=1e-12)


def test_mt_grpo_by_hand():
    # row a: three turns, rewards 0.2, 0.5 then the outcome 1; row b: one turn, outcome 0
    R, M = _rows([[0.2, 0.5, 1.0], [0.0]])
    adv, ret = A.mt_grpo(R, M, ["g", "g"])
    # loo: Y_a = O_a + R̃_a = (1.2, 1.5, 1.0); Y_b = (0, 0, 0): each minus the other's
    _close(_per_turn(adv.numpy(), M), [[1.2, 1.5, 1.0], [-1.2]])
    torch.testing.assert_close(ret, adv)
    adv, _ = A.mt_grpo(R, M, ["g", "g"], turn_coef=0.5)
    _close(_per_turn(adv.numpy(), M), [[1.1, 1.25, 1.0], [-1.1]])
    # index_present: the outcomes 1, 0 give ±GRPO_HALF; the pools of turn 0 and turn 1 hold row a alone:
    # no turn part
    adv, _ = A.mt_grpo(R, M, ["g", "g"], turn_baseline="index_present")
    _close(_per_turn(adv.numpy(), M), [[GRPO_HALF] * 3, [-GRPO_HALF]])

    # index (MT-GRPO's code): the turn rewards over the whole group, row b's 0 included — a group of two
    # with values x and 0 gives ±(x/2)/(|x|/√2 + ε); row b (one turn) gets GRPO of the scores 1.7 and 0
    def pair(x):
        return (x / 2) / (abs(x) / math.sqrt(2) + 1e-4)

    adv, _ = A.mt_grpo(R, M, ["g", "g"], turn_baseline="index")
    _close(_per_turn(adv.numpy(), M), [[GRPO_HALF + pair(0.2), GRPO_HALF + pair(0.5), GRPO_HALF], [-pair(1.7)]])


@pytest.mark.parametrize("turn_baseline", ["index", "index_present"])
def test_mt_grpo_index_normalises_turn_rewards_per_turn_index(turn_baseline):
    # three rows of two turns: turn rewards 0, 1, 2 (mean 1, std 1), outcomes 1, 1, 0 (mean 2/3, std 1/√3);
    # every row has the intermediate turn, so the two index rules agree
    R, M = _rows([[0.0, 1.0], [1.0, 1.0], [2.0, 0.0]])
    adv, _ = A.mt_grpo(R, M, ["g"] * 3, turn_baseline=turn_baseline, eps=0.0, turn_coef=2.0)
    a_o = [(1 - 2 / 3) * math.sqrt(3), (1 - 2 / 3) * math.sqrt(3), -2 / 3 * math.sqrt(3)]
    want = [[a_o[0] + 2 * -1.0, a_o[0]], [a_o[1] + 0.0, a_o[1]], [a_o[2] + 2 * 1.0, a_o[2]]]
    _close(_per_turn(adv.numpy(), M), want)


@pytest.mark.filterwarnings("ignore:group_ids")
def test_mt_grpo_groups_of_one_constant_rewards_and_empty_rows():
    R, M = _rows([[0.3, 1.0], [0.3, 1.0], [0.5, 2.0]])
    M = np.vstack([M, np.zeros(M.shape[1])])
    R = np.vstack([R, np.zeros(R.shape[1])])
    adv, _ = A.mt_grpo(R, M, ["c", "c", "alone", "c"])  # (the warning: test_warnings.py)
    # rows 0, 1 are identical and row 3 (no action token) counts as outcome 0 with no turn reward
    per = _per_turn(adv.numpy(), M)
    assert per[0] == pytest.approx([1.3 - (1.3 + 0.0) / 2, 1.0 - (1.0 + 0.0) / 2], abs=1e-12)
    assert per[2] == [0.0, 0.0]  # a group of one: nothing to leave out
    assert (adv.numpy()[3] == 0).all()
    for turn_baseline in ("index", "index_present"):
        adv, _ = A.mt_grpo(R[:2], M[:2], ["c", "c"], turn_baseline=turn_baseline)
        assert (adv.numpy() == 0).all()  # constant rewards: every normalised term is 0


# ----------------------------------------------------------------------------- the bias, exactly

# One decision at turn 0: answer now (1 turn, success 0.5) or call a tool (a second turn; the call
# costs 0.25 and raises success to 0.75). Returns: 0.5 either way: the choice has zero true advantage.
STOP, TOOL = (None, 0.5), (-0.25, 0.75)


def _enumerate(n: int, p_tool: float, tool=TOOL, stop=STOP, **opts) -> tuple[float, float]:
    """E[A at row 0's first turn | row 0 called the tool] and | answered at once, exactly: every
    group of n rows (each row one of the four outcomes: stop/tool × fail/succeed) with its probability."""
    kinds = [
        (stop, 0.0, (1 - p_tool) * (1 - stop[1])),
        (stop, 1.0, (1 - p_tool) * stop[1]),
        (tool, 0.0, p_tool * (1 - tool[1])),
        (tool, 1.0, p_tool * tool[1]),
    ]
    combos = list(itertools.product(range(4), repeat=n))
    rows, gids = [], []
    for c, combo in enumerate(combos):
        for j in combo:
            (cost, _), outcome, _ = kinds[j]
            rows.append([outcome] if cost is None else [cost, outcome])
            gids.append(c)
    R, M = _rows(rows)
    adv, _ = A.mt_grpo(R, M, gids, **opts)
    first = adv.numpy()[::n, 0]  # row 0 of each group, its first token
    prob_others = np.array([math.prod(kinds[j][2] for j in combo[1:]) for combo in combos])
    own = np.array([combo[0] for combo in combos])
    e = {}
    for name, js in (("tool", (2, 3)), ("stop", (0, 1))):
        w = np.array([kinds[j][2] for j in own]) * prob_others * np.isin(own, js)
        e[name] = float((w * first).sum() / w.sum())
    return e["tool"], e["stop"]


def _grpo_outcome_only(n: int, p_tool: float) -> float:
    """The index_present baseline's expected advantage gap computed another way: every tool row's turn term
    is 0 (all its pool pays the same cost), so row 0 gets GRPO of the outcomes alone."""
    p_mix = p_tool * TOOL[1] + (1 - p_tool) * STOP[1]  # another row's success probability
    gap = 0.0
    for own_p, sign in ((TOOL[1], 1), (STOP[1], -1)):
        for outs in itertools.product((0.0, 1.0), repeat=n):
            pr = (own_p if outs[0] else 1 - own_p) * math.prod(p_mix if o else 1 - p_mix for o in outs[1:])
            x = np.array(outs)
            std = x.std(ddof=1)
            gap += sign * pr * (x[0] - x.mean()) / (std + 1e-4)
    return gap


@pytest.mark.filterwarnings("ignore:group_ids")
@pytest.mark.parametrize("n,p_tool", [(2, 0.5), (3, 0.3), (3, 0.8)])
def test_index_present_baseline_pays_a_hidden_bonus_for_another_turn_loo_does_not(n, p_tool):
    tool, stop = _enumerate(n, p_tool, turn_baseline="index_present")
    gap = tool - stop
    assert gap == pytest.approx(_grpo_outcome_only(n, p_tool), abs=1e-9)
    assert gap > 0.1  # a zero-advantage choice credited as clearly better: the −E[cost] bonus
    if n == 2:  # by hand: (0.75 − 0.5) · GRPO_HALF, whatever the policy
        assert gap == pytest.approx(0.25 * GRPO_HALF, abs=1e-12)
    tool, stop = _enumerate(n, p_tool)  # the default, leave-one-out over the whole group
    assert tool - stop == pytest.approx(0.0, abs=1e-12)


WORKED = json.loads((Path(__file__).parent / "fixtures" / "mt_grpo_source.json").read_text(encoding="utf-8"))


def test_index_baseline_charges_the_turn_reward_to_another_turn_as_mt_grpos_code_does():
    # MT-GRPO's own code on every group of two (fixtures/mt_grpo_source.json, 'worked_example_n2': the 16
    # groups in the order of _enumerate, each row stop or tool × fail or succeed): the expected gap at
    # p_tool = 0.5 from its outputs, against mpo_viz's "index" on the same groups
    case = next(c for c in WORKED["cases"] if c["inputs"] == "worked_example_n2")
    first = np.array(case["advantages"])[::2, 0]  # row 0 of each group, its first token
    kinds = [(0.5 * 0.5), (0.5 * 0.5), (0.5 * 0.25), (0.5 * 0.75)]  # stop-fail, stop-succeed, tool-fail, tool-succeed
    own, other = np.repeat(np.arange(4), 4), np.tile(np.arange(4), 4)
    w = np.array([kinds[a] * kinds[b] for a, b in zip(own, other)])
    source_gap = ((w * first)[own >= 2].sum() / w[own >= 2].sum()) - ((w * first)[own < 2].sum() / w[own < 2].sum())
    tool, stop = _enumerate(2, 0.5, turn_baseline="index")
    assert tool - stop == pytest.approx(source_gap, abs=1e-6)
    assert tool - stop == pytest.approx(-0.3533, abs=1e-4)  # docs/concepts.md's table
    assert (tool, stop) == pytest.approx((-0.2650, 0.0883), abs=1e-4)
    # the turn term of a tool row beside a row that stopped is ∓(c/2)/(c/√2 + ε) ≈ −0.707 whatever the cost c:
    # the level of the cost, scaled to one std, charged to the decision to continue
    for cost in (-0.25, -0.01):
        R, M = _rows([[cost, 1.0], [1.0]])
        a_tool, _ = A.mt_grpo(R, M, ["g", "g"], turn_baseline="index")
        assert a_tool.numpy()[0, 0] - a_tool.numpy()[0, 3] == pytest.approx(
            -0.5 / (1 / math.sqrt(2) + 1e-4 / abs(cost))
        )


@pytest.mark.filterwarnings("ignore:group_ids")
@pytest.mark.parametrize("n,p_tool", [(3, 0.3), (4, 0.5)])
def test_index_baseline_gap_in_larger_groups(n, p_tool):
    tool, stop = _enumerate(n, p_tool, turn_baseline="index")
    assert tool - stop < -0.25  # a zero-advantage choice credited as clearly worse
    if n == 4:  # docs/concepts.md: −0.560 in groups of four; index_present's +0.351 beside it
        assert tool - stop == pytest.approx(-0.5604, abs=1e-4)
        tool, stop = _enumerate(n, p_tool, turn_baseline="index_present")
        assert tool - stop == pytest.approx(0.3514, abs=1e-4)


@pytest.mark.parametrize("cost", [-0.1, -0.5])
def test_loo_expected_advantage_is_the_true_advantage(cost):
    tool, stop = _enumerate(2, 0.4, tool=(cost, 0.75))
    assert tool - stop == pytest.approx((cost + 0.75) - 0.5, abs=1e-12)


# ----------------------------------------------------------------------------- bi-level GAE by hand


def test_bilevel_gae_on_ragens_example_by_hand():
    # RAGEN's core_algos.py example: rewards 1 at positions 4 and 9, V = 0.1..1.0, γ = λ = 1, γ_H = 0.95
    R = np.zeros((1, 10))
    R[0, [4, 9]] = 1.0
    V = np.arange(1, 11)[None] / 10
    M = np.ones((1, 10))
    T = np.array([[0] * 5 + [1] * 5])
    adv, ret = A.bilevel_gae(R, V, M, turn_ids=T, whiten=False)
    # turn level: A^H_1 = 1 − 1.0 = 0; A^H_0 = 1 + 0.95·1.0 − 0.5 = 1.45; inside a turn each earlier
    # token adds γ·V_{t+1} − V_t = 0.1
    np.testing.assert_allclose(adv.numpy()[0], [1.85, 1.75, 1.65, 1.55, 1.45, 0.4, 0.3, 0.2, 0.1, 0.0], atol=1e-12)
    np.testing.assert_allclose(ret.numpy()[0], [1.95] * 5 + [1.0] * 5, atol=1e-12)  # the turn return, flat
    white, ret2 = A.bilevel_gae(R, V, M, turn_ids=T)  # the default whitens, as RAGEN
    x = adv.numpy()[0]
    np.testing.assert_allclose(white.numpy()[0], (x - x.mean()) / math.sqrt(x.var(ddof=1) + 1e-8), atol=1e-12)
    torch.testing.assert_close(ret2, ret)


# ----------------------------------------------------------------------------- EMPG by hand


def _empg_case():
    # one group of two rows, scores 1 and 0; row 0: turns of 2 and 1 tokens, row 1: one turn of 2
    M = np.array([[1, 1, 0, 1], [1, 1, 0, 0]], dtype=np.float64)
    R = np.array([[0, 0, 0, 1.0], [0, 0, 0, 0]])
    T = np.array([[0, 0, 0, 1], [0, 0, 0, 0]])
    H = np.array([[0.1, 0.3, np.nan, 1.0], [0.5, 0.7, np.nan, np.nan]])  # step means 0.2, 1.0 and 0.6
    return R, M, T, H


def test_empg_by_hand():
    R, M, T, H = _empg_case()
    adv, ret = A.empg(R, M, ["g", "g"], entropy=H, turn_ids=T, eps=0.0)
    a = [math.sqrt(0.5), -math.sqrt(0.5)]  # GRPO, ε = 0: ±0.5/std, std = √0.5
    hn = [0.0, 0.8 / (0.8 + 1e-8), 0.4 / (0.8 + 1e-8)]  # (H − 0.2)/(1.0 − 0.2 + 1e-8)
    raw = [math.exp(-x) for x in hn]
    g = [x / (sum(raw) / 3 + 1e-8) for x in raw]
    mod = [g[0] * a[0] + 0.1 * math.exp(-hn[1]), g[1] * a[0], g[2] * a[1]]  # the bonus: row 0's next step
    c = sum(mod) / 3
    want = np.array([[mod[0] - c] * 2 + [0, mod[1] - c], [mod[2] - c] * 2 + [0, 0]])
    np.testing.assert_allclose(adv.numpy(), want, atol=1e-12)
    torch.testing.assert_close(ret, adv)
    # confident steps amplified, uncertain ones attenuated: g is 1 on average over the steps
    assert g[0] > 1 > g[1] and sum(g) / 3 == pytest.approx(1.0, abs=1e-7)
    plain, _ = A.empg(R, M, ["g", "g"], entropy=H, turn_ids=T, eps=0.0, zeta=0.0, center=False)
    np.testing.assert_allclose(plain.numpy()[0, [0, 3]], [g[0] * a[0], g[1] * a[0]], atol=1e-12)


def test_empg_constant_entropy_and_one_step():
    # every step equally uncertain: Ĥ = 0, g = 1, f = 1: GRPO plus ζ on every step with a next step
    R, M, T, _ = _empg_case()
    H = np.where(M == 1, 0.4, np.nan)
    adv, _ = A.empg(R, M, ["g", "g"], entropy=H, turn_ids=T, eps=0.0, center=False)
    g = 1 / (1 + 1e-8)
    a = math.sqrt(0.5)
    np.testing.assert_allclose(adv.numpy(), [[g * a + 0.1] * 2 + [0, g * a], [-g * a] * 2 + [0, 0]], atol=1e-12)


def test_empg_needs_entropies_and_says_so():
    R, M, T, H = _empg_case()
    with pytest.raises(ValueError, match=r"entropy: EMPG needs the policy's per-token entropy \(field 'entropy'"):
        A.empg(R, M, ["g", "g"], entropy=None, turn_ids=T)
    bad = H.copy()
    bad[1, 1] = np.nan
    with pytest.raises(ValueError, match=r"entropy: row 1, position 1: expected a finite entropy on an action token"):
        A.empg(R, M, ["g", "g"], entropy=bad, turn_ids=T)
    batch = make_batch(6, seed=1, turns=(1, 3), group_size=3)
    assert A.missing(batch, "empg") == ["entropy"]  # the views and the report skip it on this batch
    with pytest.raises(
        ValueError,
        match=r"estimator 'empg' needs what this batch lacks — entropy: the policy's "
        r"per-token entropy \(field 'entropy'\)",
    ):
        A.compute(batch, "empg")
    rows = list(batch.rows())
    for i, r in enumerate(rows):
        if i != 4:
            r["entropy"] = [0.5] * len(r["response_ids"])
    part = TrajectoryBatch.from_rows(rows)
    with pytest.raises(
        ValueError,
        match=rf"entropy: row 4 \(traj_id {rows[4]['traj_id']!r}\) has no per-token "
        r"entropies; estimator 'empg' needs them on every row",
    ):
        A.compute(part, "empg")
    for r in rows:
        r["entropy"] = [0.5] * len(r["response_ids"])
    res = A.compute(TrajectoryBatch.from_rows(rows), "empg")
    assert np.isfinite(res.advantages.numpy()).all() and res.options["zeta"] == 0.1


# ----------------------------------------------------------------------------- λ rules by hand


def _terminal_rows(lengths):
    """Rows of ℓ action tokens, reward 1 on the last, values 0."""
    M = np.zeros((len(lengths), max(lengths)))
    for i, n in enumerate(lengths):
        M[i, :n] = 1
    R = np.zeros_like(M)
    R[np.arange(len(lengths)), np.asarray(lengths) - 1] = 1.0
    return R, np.zeros_like(M), M


def test_relative_position_keeps_q_at_the_first_step_whatever_the_length():
    R, V, M = _terminal_rows([1, 2, 3, 7, 40])
    adv, _ = A.gae(R, V, M, lam_rule="relative_position", q=0.3)
    np.testing.assert_allclose(adv.numpy()[:, 0], [1.0, 0.3, 0.3, 0.3, 0.3], atol=1e-12)
    # turns: K one-token turns, the turn λ_T = q^{1/(K−1)}: the first turn keeps q
    T = np.cumsum(M, axis=1).astype(np.int64) - 1
    adv, _ = A.turn_gae(R, V, M, turn_ids=np.maximum(T, 0), lam_rule="relative_position", q=0.3)
    np.testing.assert_allclose(adv.numpy()[:, 0], [1.0, 0.3, 0.3, 0.3, 0.3], atol=1e-12)


def test_vapo_rule_is_vapo_and_fixed_is_todays_gae(make_random):
    d = make_random(3, B=10)
    args = (d["rewards"], d["values"], d["mask"])
    va, vr = A.vapo(*args, bootstrap_value=d["bootstrap_value"], alpha=0.3)
    ga, gr = A.gae(*args, bootstrap_value=d["bootstrap_value"], lam_rule="vapo", alpha=0.3)
    torch.testing.assert_close(va, ga, rtol=0, atol=0)  # vapo = gae with lam_rule="vapo" ...
    _, g1 = A.gae(*args, bootstrap_value=d["bootstrap_value"], lam=1.0)
    torch.testing.assert_close(vr, g1, rtol=0, atol=0)  # ... whose returns use λ = 1
    assert not torch.equal(vr, gr)
    fa, fr = A.gae(*args, lam=0.7, lam_rule="fixed", alpha=2.0, q=0.1)  # fixed ignores α and q
    pa, pr = A.gae(*args, lam=0.7)
    torch.testing.assert_close(fa, pa, rtol=0, atol=0)
    torch.testing.assert_close(fr, pr, rtol=0, atol=0)
    # SAO's estimator: λ = 1 − 1/(1.5·ℓ) per row
    R, V, M = _terminal_rows([1, 2, 4])
    adv, _ = A.gae(R, V, M, lam_rule="vapo", alpha=1.5)
    lam = [0.0, 1 - 1 / 3, 1 - 1 / 6]
    np.testing.assert_allclose(adv.numpy()[:, 0], [1.0, lam[1], lam[2] ** 3], atol=1e-12)


def test_mpo_turn_lambda_follows_the_rule():
    b = make_batch(8, seed=4, turns=(1, 4), turn_len=(1, 5), group_size=2)
    for rule, kw in (("vapo", {"alpha": 0.6}), ("relative_position", {"q": 0.4})):
        a, _ = A.mae(b.token_rewards, b.values, b.mask, turn_ids=b.turn_ids, lam_rule=rule, **kw)
        # each row equals mae with that row's λ_T as a fixed turn_lam
        for i, k in enumerate(b.num_turns):
            lam = max(1 - 1 / (0.6 * k), 0.0) if rule == "vapo" else (0.4 ** (1 / (k - 1)) if k > 1 else 1.0)
            row, _ = A.mae(
                b.token_rewards[i : i + 1],
                b.values[i : i + 1],
                b.mask[i : i + 1],
                turn_ids=b.turn_ids[i : i + 1],
                turn_lam=float(lam),
            )
            torch.testing.assert_close(a[i : i + 1], row, rtol=1e-6, atol=1e-6)
