"""How estimators compare: pairwise agreement over tokens and turns, sign flips, the per-trajectory
disagreement, and each estimator's advantage statistics.

Streaming: :func:`compare_stats` / :func:`advantage_stats` give additive statistics of one batch
(a chunk of a file), :func:`merge_compare_stats` / :func:`merge_advantage_stats` add another
chunk's, :func:`finish_compare` / :func:`finish_advantages` turn them into the table — the numbers
of the whole file, however it was cut.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd

from mpo_viz.analysis.arrays import adv_tensors, as_2d, batch_turn_index, to_numpy, turn_means
from mpo_viz.analysis.tables import turn_table
from mpo_viz.analysis.variance import merge_variance, variance_split
from mpo_viz.data.moments import Moments, correlation, pair_sums
from mpo_viz.data.trajectory import TrajectoryBatch

__all__ = [
    "compare_estimators",
    "compare_stats",
    "merge_compare_stats",
    "finish_compare",
    "sign_flips",
    "disagreement",
    "Disagreement",
    "advantage_stats",
    "merge_advantage_stats",
    "finish_advantages",
    "ADVANTAGE_COLUMNS",
]


def _concordance(ta: np.ndarray, tb: np.ndarray, turn_row: np.ndarray) -> tuple[int, int]:
    """(concordant, comparable) turn pairs within trajectories: a pair ``k < k'`` of the same
    trajectory is comparable when neither estimator ties it, concordant when both order it alike."""
    conc = comp = 0
    bounds = np.flatnonzero(np.diff(turn_row)) + 1
    for s, e in zip(np.r_[0, bounds], np.r_[bounds, turn_row.size]):
        if e - s < 2:
            continue
        da = np.sign(ta[s:e, None] - ta[None, s:e])
        db = np.sign(tb[s:e, None] - tb[None, s:e])
        iu = np.triu_indices(e - s, 1)
        da, db = da[iu], db[iu]
        ok = (da != 0) & (db != 0)
        comp += int(ok.sum())
        conc += int((ok & (da == db)).sum())
    return conc, comp


def compare_stats(batch: TrajectoryBatch, advantages) -> dict:
    """Additive sufficient statistics of :func:`compare_estimators` for one batch.

    ``{(a, b): {...sums...}}``; statistics of several batches (chunks of one file) add up key by key
    (:func:`merge_compare_stats`) and :func:`finish_compare` turns them into the comparison table,
    so a file streamed in chunks gets exactly the numbers of the whole file.
    """
    adv = adv_tensors(advantages)
    if len(adv) < 2:
        raise ValueError(f"advantages: expected at least two estimators, found {len(adv)}")
    m, idx = batch_turn_index(batch)
    tok, turn = {}, {}
    for k, v in adv.items():
        v = as_2d(v, f"advantages[{k!r}]")
        if v.shape != m.shape:
            raise ValueError(f"advantages[{k!r}]: expected shape {m.shape} (the mask's), found {v.shape}")
        tok[k] = v[idx.rows, idx.cols]
        turn[k] = turn_means(v, idx)
    out = {}
    for a, b in itertools.combinations(adv, 2):
        conc, comp = _concordance(turn[a], turn[b], idx.turn_row)
        out[(a, b)] = {
            "tok": pair_sums(tok[a], tok[b]),
            "turn": pair_sums(turn[a], turn[b]),
            "tok_sign": float((np.sign(tok[a]) == np.sign(tok[b])).sum()),
            "tok_opp": float((tok[a] * tok[b] < 0).sum()),
            "tok_zero": float(((tok[a] == 0) != (tok[b] == 0)).sum()),
            "turn_sign": float((np.sign(turn[a]) == np.sign(turn[b])).sum()),
            "conc": conc,
            "comp": comp,
            "flips": int((turn[a] * turn[b] < 0).sum()),
        }
    return out


def merge_compare_stats(acc: dict | None, new: dict) -> dict:
    """Add the statistics of :func:`compare_stats` of another batch into ``acc`` (returned)."""
    if acc is None:
        return {
            k: {kk: (vv.copy() if isinstance(vv, np.ndarray) else vv) for kk, vv in v.items()} for k, v in new.items()
        }
    for k, v in new.items():
        if k not in acc:
            raise ValueError(f"advantages: estimator pair {k} missing from earlier batches")
        for kk, vv in v.items():
            acc[k][kk] = acc[k][kk] + vv
    return acc


def finish_compare(stats: dict) -> pd.DataFrame:
    """The comparison table (see :func:`compare_estimators`) from accumulated statistics."""
    rows = []
    for (a, b), s in stats.items():
        n_tok, n_turn = s["tok"][0], s["turn"][0]
        rows.append(
            {
                "a": a,
                "b": b,
                "token_corr": correlation(s["tok"]),
                "sign_agreement": s["tok_sign"] / n_tok if n_tok else math.nan,
                "sign_opposite": s["tok_opp"] / n_tok if n_tok else math.nan,
                "sign_one_zero": s["tok_zero"] / n_tok if n_tok else math.nan,
                "turn_corr": correlation(s["turn"]),
                "turn_sign_agreement": s["turn_sign"] / n_turn if n_turn else math.nan,
                "turn_rank_agreement": s["conc"] / s["comp"] if s["comp"] else math.nan,
                "n_sign_flips": int(s["flips"]),
                "n_turns": int(n_turn),
            }
        )
    return pd.DataFrame(rows)


def compare_estimators(batch: TrajectoryBatch, advantages) -> pd.DataFrame:
    """Agreement between every pair of estimators on one batch, one row per pair ``(a, b)``.

    ``advantages``: ``{name: (B, L) tensor or result}`` (at least two). Over action tokens:
    ``token_corr`` (Pearson correlation of the per-token advantages), ``sign_agreement`` (share of
    action tokens where ``sign(A_a) == sign(A_b)``, zero being its own sign); the other tokens split
    into ``sign_opposite`` (strictly opposite signs, ``A_a · A_b < 0``) and ``sign_one_zero`` (exactly one
    of the two is 0: e.g. a group estimator's tokens in a group whose episodes all score alike), so the
    three add up to 1. Over turns (turn
    advantage = mean over the turn's action tokens): ``turn_corr``, ``turn_sign_agreement``,
    ``turn_rank_agreement`` (share of concordant pairs among the pairs of turns *of the same
    trajectory* that neither estimator ties; NaN when there is none), ``n_sign_flips`` (turns where
    ``A_a · A_b < 0``) and ``n_turns``. Correlations are NaN when either side is constant. A low
    ``sign_agreement`` beside ``n_sign_flips = 0`` is no contradiction: a flip needs the turn *means* to
    have strictly opposite signs, so tokens against a 0 (``sign_one_zero``) and tokens that disagree
    inside a turn whose mean agrees are no flip.
    """
    return finish_compare(compare_stats(batch, advantages))


def sign_flips(batch: TrajectoryBatch, advantages) -> pd.DataFrame:
    """The turns whose advantage sign differs between two estimators (``A_a · A_b < 0``).

    One row per (pair, turn): ``a``, ``b``, ``traj_id``, ``row``, ``turn``, ``adv_a``, ``adv_b``
    (turn means of the advantages).
    """
    adv = adv_tensors(advantages)
    tt = turn_table(batch, adv)
    parts = []
    for a, b in itertools.combinations(adv, 2):
        sel = tt[tt[f"adv_{a}"] * tt[f"adv_{b}"] < 0]
        parts.append(
            pd.DataFrame(
                {
                    "a": a,
                    "b": b,
                    "traj_id": sel["traj_id"].to_numpy(),
                    "row": sel["row"].to_numpy(),
                    "turn": sel["turn"].to_numpy(),
                    "adv_a": sel[f"adv_{a}"].to_numpy(),
                    "adv_b": sel[f"adv_{b}"].to_numpy(),
                }
            )
        )
    cols = ["a", "b", "traj_id", "row", "turn", "adv_a", "adv_b"]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=cols)


def disagreement(batch: TrajectoryBatch, advantages) -> np.ndarray:
    """Per trajectory ``(B,)``: the share of (turn, estimator pair) combinations whose turn
    advantages have opposite signs — 0 when every estimator agrees on every turn's sign, NaN for a
    row without turns. Used by the report to pick the most disagreed-on trajectories."""
    return Disagreement(batch)(advantages)


class Disagreement:
    """:func:`disagreement` on one batch, computed again and again (a view's sliders): the turn
    index is built once, and an estimator's turn means are kept while its advantages are the same
    tensor object as last time (the widgets' engine returns the same tensors for an estimator whose
    options did not change). ``Disagreement(batch)(advantages)`` equals
    ``disagreement(batch, advantages)``."""

    def __init__(self, batch: TrajectoryBatch):
        m, self._idx = batch_turn_index(batch)
        self._B = m.shape[0]
        self._means: dict = {}  # name -> (the advantages object, its turn means)

    def __call__(self, advantages) -> np.ndarray:
        turn = {}
        for k, v in advantages.items():
            obj = getattr(v, "advantages", v)
            hit = self._means.get(k)
            if hit is None or hit[0] is not obj:
                hit = self._means[k] = (obj, turn_means(as_2d(to_numpy(obj), k), self._idx))
            turn[k] = hit[1]
        pairs = list(itertools.combinations(turn, 2))
        flips = np.zeros(self._B)
        for a, b in pairs:
            flips += np.bincount(
                self._idx.turn_row, weights=(turn[a] * turn[b] < 0).astype(np.float64), minlength=self._B
            )
        with np.errstate(invalid="ignore", divide="ignore"):
            return flips / (self._idx.n_turns * max(len(pairs), 1))


# ---------------------------------------------------------------------------------------------
# each estimator's advantages

ADVANTAGE_COLUMNS = ("estimator", "mean", "std", "mean |A|", "across-turn var (mean)", "within-turn var (mean)")
"""The columns of :func:`finish_advantages` (the report's "Advantages by estimator")."""


def advantage_stats(batch: TrajectoryBatch, advantages) -> dict:
    """Mergeable statistics of each estimator's advantages on one batch: ``{name: {"moments":
    Moments of A over action tokens, "abs": of |A|, "split": the per-trajectory across/within
    table}}``. ``advantages``: ``{name: (B, L) tensor or result}``."""
    mask = as_2d(batch.mask, "mask") != 0
    out = {}
    for k, a in adv_tensors(advantages).items():
        s = variance_split(a, batch.mask, batch.turn_ids)
        av = a[mask]
        out[k] = {
            "moments": Moments.of(av),
            "abs": Moments.of(np.abs(av)),
            "split": pd.DataFrame({c: s[c] for c in ("across", "within", "ratio", "n_tokens")}),
        }
    return out


def merge_advantage_stats(acc: dict | None, new: dict) -> dict:
    """Add the statistics of :func:`advantage_stats` of another batch into ``acc`` (returned)."""
    acc = {} if acc is None else acc
    for k, v in new.items():
        a = acc.get(k)
        acc[k] = (
            dict(v)
            if a is None
            else {
                "moments": a["moments"].merge(v["moments"]),
                "abs": a["abs"].merge(v["abs"]),
                "split": merge_variance(a["split"], v["split"]),
            }
        )
    return acc


def finish_advantages(stats: dict, names=None) -> pd.DataFrame:
    """One row per estimator (``names``, default every one of ``stats``) with
    :data:`ADVANTAGE_COLUMNS`: mean, std and mean |A| over action tokens, and the mean across-turn
    and within-turn variance over trajectories with an action token."""
    rows = []
    for k in stats if names is None else names:
        s: dict = stats.get(k) or {"moments": Moments(), "abs": Moments(), "split": None}
        mo, ab, sp = s["moments"], s["abs"], s["split"]
        sp = sp[sp["n_tokens"] > 0] if sp is not None else pd.DataFrame({"across": [], "within": []})
        rows.append(
            (
                k,
                mo.mean_or_nan,
                mo.std,
                ab.mean_or_nan,
                float(sp["across"].mean()) if len(sp) else math.nan,
                float(sp["within"].mean()) if len(sp) else math.nan,
            )
        )
    return pd.DataFrame(rows, columns=list(ADVANTAGE_COLUMNS))
