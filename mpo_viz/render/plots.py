"""Static plotly figures (no ipywidgets import): value curves, the across/within diagnostic,
estimator comparison. Every function returns a ``plotly.graph_objects.Figure``; the widgets wrap
them in ``FigureWidget`` and the report inlines them.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from mpo_viz import analysis as an
from mpo_viz.data.trajectory import TrajectoryBatch

__all__ = [
    "value_curve",
    "value_curve_parts",
    "MC_TRACE",
    "span_shapes",
    "across_within",
    "estimator_comparison",
    "ESTIMATOR_COLOURS",
    "FIGURE_CONFIG",
    "line_trace",
]

#: plotly config of every figure the views and the report show: sized by its container, plotly's
#: own image export (the camera button) at twice the resolution
FIGURE_CONFIG = {"displaylogo": False, "responsive": True, "toImageButtonOptions": {"format": "png", "scale": 2}}

# One colour per estimator name, stable across figures (plotly's qualitative "D3" palette).
ESTIMATOR_COLOURS = {
    "mpo": "#d62728",
    "gae": "#1f77b4",
    "turn_gae": "#ff7f0e",
    "grpo": "#2ca02c",
    "drgrpo": "#98df8a",
    "rloo": "#9467bd",
    "reinforce_pp": "#8c564b",
    "reinforce_pp_baseline": "#c49c94",
    "vapo": "#e377c2",
    "gigpo": "#17becf",
    "bilevel_gae": "#9edae5",
    "mt_grpo": "#f7b6d2",
    "empg": "#dbdb8d",
}
_FALLBACK = ["#7f7f7f", "#bcbd22", "#aec7e8", "#ffbb78", "#ff9896", "#c5b0d5"]


#: the name of the value curve's Monte-Carlo markers (``mc_value`` ± 1.96 ``mc_value_se`` at turn starts)
MC_TRACE = "true value for this policy (Monte-Carlo, ±1.96 SE)"


def _colour(name: str, i: int) -> str:
    return ESTIMATOR_COLOURS.get(name, _FALLBACK[i % len(_FALLBACK)])


MAX_LINE_POINTS = 6000
"""Per-token lines longer than this are drawn decimated (see :func:`line_points`)."""


def line_points(y, act, *, max_points: int = MAX_LINE_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """``(x, y)`` of a per-token line drawn over action tokens, with gaps (NaN) over observations.

    Up to ``max_points`` tokens every token is a point (``x = 0..n-1``). Longer lines (a 50,000-token
    trajectory) are decimated for display the usual way for long series: positions fall into
    ``max_points / 2`` buckets and each bucket keeps its lowest and highest point, plus the first
    and last token of every run of action tokens and the observation token after it (so the gaps
    stay). Every point drawn is a real ``(token, value)`` pair and every bucket's extremes survive;
    the exact per-token numbers are in the strip. Returns float32 ``y`` (half the JSON of float64).
    """
    y = np.asarray(y, dtype=np.float64)
    act = np.asarray(act, dtype=bool)
    n = len(y)
    full = np.where(act, y, np.nan).astype(np.float32)
    if n <= max_points:
        return np.arange(n), full
    idx = np.flatnonzero(act)
    if not len(idx):
        return np.arange(0), full[:0]
    width = int(np.ceil(n / max(1, max_points // 2)))
    bucket = idx // width
    order = np.lexsort((y[idx], bucket))  # by bucket, then by value
    sb = bucket[order]
    lo = np.r_[True, sb[1:] != sb[:-1]]
    hi = np.r_[sb[1:] != sb[:-1], True]
    new_run = np.r_[True, np.diff(idx) > 1]
    ends = idx[np.r_[new_run[1:], True]]
    keep = np.unique(np.concatenate([idx[order[lo]], idx[order[hi]], idx[new_run], ends, ends[ends + 1 < n] + 1]))
    return keep, full[keep]


def line_trace(x, y, **kwargs) -> go.Scatter:
    """A per-token line (``x``, ``y`` from :func:`line_points`) as a Scatter whose isolated points
    (a one-token turn: a finite value between two gaps) get a marker, since a line needs two."""
    y = np.asarray(y, dtype=np.float64)
    f = np.isfinite(y)
    iso = f & ~np.r_[False, f[:-1]] & ~np.r_[f[1:], False]
    colour = kwargs.pop("marker_color", (kwargs.get("line") or {}).get("color"))
    if iso.any():
        return go.Scatter(
            x=x,
            y=y.astype(np.float32),
            mode="lines+markers",
            marker=dict(size=np.where(iso, 6, 0).astype(np.int8), color=colour),
            **kwargs,
        )
    return go.Scatter(x=x, y=y.astype(np.float32), mode="lines", marker=dict(color=colour), **kwargs)


def _row_arrays(batch: TrajectoryBatch, row: int):
    sub = batch[[row]]
    n = int(sub.lengths[0])
    return sub, n, sub.mask[0, :n].numpy() != 0


def learned_and_oracle(batch: TrajectoryBatch) -> np.ndarray | None:
    """The ``oracle_values`` ``(B, L)`` float64 of a batch whose ``values`` are something else (a
    learned or noisy critic), else None (no oracle column, no values, or values equal to the oracle's)."""
    if batch.values is None or not batch.has("oracle_values"):
        return None
    o = batch.padded("oracle_values").numpy().astype(np.float64)
    if np.array_equal(o, batch.values.numpy().astype(np.float64)):
        return None
    return o


MAX_SPAN_SHAPES = 40
"""Past this many turns the shaded turn spans are drawn as two path shapes (see :func:`span_shapes`)."""

SPAN_COLOURS = ("#9ecae1", "#c6dbef")
"""Fill colours of the shaded turn spans, alternating (even turns, odd turns)."""


def span_shapes(starts, ends, *, max_shapes: int = MAX_SPAN_SHAPES) -> list[dict]:
    """The shaded turn spans of a value curve, ``[start − ½, end + ½]`` over every panel, as plotly
    shape dicts, colours alternating between turns.

    Up to ``max_shapes`` turns: one rectangle per turn. More turns (a 50,000-token trajectory has
    hundreds) are drawn as two path shapes, one per colour, each the union of that colour's
    rectangles (``M x0,0 H x1 V 1 H x0 Z`` per turn, y in paper units): the same shading, but
    plotly (Python and plotly.js) handles two shapes instead of hundreds, each of which costs it
    about half a millisecond to validate and to draw."""
    spans = [(float(s) - 0.5, float(e) + 0.5) for s, e in zip(starts, ends)]
    style = dict(xref="x", yref="paper", line_width=0, opacity=0.35, layer="below")
    if len(spans) <= max_shapes:
        return [
            dict(type="rect", x0=x0, x1=x1, y0=0, y1=1, fillcolor=SPAN_COLOURS[k % 2], **style)
            for k, (x0, x1) in enumerate(spans)
        ]
    return [
        dict(
            type="path",
            path=" ".join(f"M{x0!r},0 H{x1!r} V1 H{x0!r} Z" for x0, x1 in spans[k::2]),
            fillcolor=SPAN_COLOURS[k],
            **style,
        )
        for k in (0, 1)
    ]


def value_curve_parts(
    batch: TrajectoryBatch,
    row: int,
    *,
    advantages: dict | None = None,
    returns=None,
    lines: dict | None = None,
    title: str | None = None,
) -> dict:
    """What :func:`value_curve` draws, as plain data (no plotly objects, so a view can update a
    figure on screen in place without building a new one): ``{"traces": [...], "shapes": [...],
    "title": str, "two": bool}``. Each trace is a dict with ``name``, ``x``, ``y``, ``mode``,
    ``size`` (marker sizes or None), ``panel`` (1: values, 2: advantages) and ``style`` (line
    options). ``lines``: more per-token lines for the value panel, ``{label: (B, L) array}`` (e.g. a
    learned critic beside the oracle)."""
    sub, n, act = _row_arrays(batch, row)
    if sub.values is None:
        raise ValueError("values: the batch has no 'values' field; a value curve needs a critic")
    v = sub.values[0, :n].numpy().astype(np.float64)
    tt = an.turn_table(sub)
    traces = []

    def line(name, y, panel, style):
        x, yy = line_points(y, act)
        yy = np.asarray(yy, dtype=np.float64)
        f = np.isfinite(yy)
        iso = f & ~np.r_[False, f[:-1]] & ~np.r_[f[1:], False]
        traces.append(
            {
                "name": name,
                "x": np.asarray(x),
                "y": yy.astype(np.float32),
                "panel": panel,
                "style": style,
                "mode": "lines+markers" if iso.any() else "lines",
                "size": np.where(iso, 6, 0).astype(np.int8) if iso.any() else None,
            }
        )

    fitted = an.fitted_critic_label(sub)  # values of mpo-viz fit-critic: say so, with its held-out EV
    line(f"value ({fitted})" if fitted else "value", v, 1, {"color": "#333", "width": 1.2})
    # turn means as flat segments over exactly each turn's shaded span (first action token − ½ to
    # last + ½), None breaking between turns
    sx, sy = [], []
    for s, e, m in zip(tt["start"], tt["end"], tt["value_mean"]):
        sx += [s - 0.5, e + 0.5, None]
        sy += [m, m, None]
    traces.append(
        {
            "name": "turn mean",
            "x": sx,
            "y": sy,
            "panel": 1,
            "mode": "lines",
            "size": None,
            "style": {"color": "#d62728", "width": 2.5},
        }
    )
    ov = learned_and_oracle(sub)
    if ov is not None:  # a learned (or noisy) critic beside the exact values of mpo-viz generate/rollout
        line("oracle value", ov[0, :n], 1, {"color": "#2ca02c", "width": 1.2, "dash": "dash"})
    mc = sub.field("mc_value")[0] if sub.has("mc_value") else None
    if mc is not None and len(mc) == len(tt):  # the policy's own Monte-Carlo value at each turn start
        se = sub.field("mc_value_se")[0] if sub.has("mc_value_se") else None
        traces.append(
            {
                "name": MC_TRACE,
                "x": tt["start"].to_numpy(),
                "y": np.asarray(mc, dtype=np.float32),
                "panel": 1,
                "mode": "markers",
                "size": np.full(len(mc), 8, dtype=np.int8),
                "style": {"color": "#9467bd", "width": 0},
                "error": None if se is None else (1.96 * np.asarray(se)).astype(np.float32),
            }
        )
    if returns is not None:
        line(
            "return",
            np.asarray(an.to_numpy(getattr(returns, "returns", returns)))[row, :n],
            1,
            {"color": "#1f77b4", "width": 1, "dash": "dot"},
        )
    for i, (name, y) in enumerate((lines or {}).items()):
        line(name, np.asarray(an.to_numpy(y))[row, :n], 1, {"color": _FALLBACK[i % len(_FALLBACK)], "width": 1.2})
    for i, (name, a) in enumerate((advantages or {}).items()):
        line(
            f"A ({name})",
            an.to_numpy(getattr(a, "advantages", a))[row, :n],
            2,
            {"color": _colour(name, i), "width": 1.2},
        )
    shapes = span_shapes(tt["start"].tolist(), tt["end"].tolist())
    traj = batch.traj_ids[row]
    return {
        "traces": traces,
        "shapes": shapes,
        "two": bool(advantages),
        "title": title
        if title is not None
        else f"values along trajectory {traj} ({len(tt)} turns; shaded: turn spans)",
    }


def value_curve(
    batch: TrajectoryBatch,
    row: int,
    *,
    advantages: dict | None = None,
    returns=None,
    lines: dict | None = None,
    title: str | None = None,
) -> go.Figure:
    """Values along one trajectory (x = response token position).

    Traces (per-token lines via :func:`line_points`, decimated beyond ``MAX_LINE_POINTS`` tokens;
    an isolated point, a one-token turn, gets a marker): ``value`` (action tokens; gaps over
    observations; ``value (fitted critic (held-out EV x))`` when the values come from
    ``mpo-viz fit-critic``, :func:`mpo_viz.analysis.fitted_critic_label`), ``turn mean`` (each turn's mean value over
    exactly the turn's span), ``oracle value``
    when the batch carries ``oracle_values`` that differ from ``values`` (:func:`learned_and_oracle`), optionally
    ``return`` (``returns``: ``(B, L)`` tensor or result), the extra ``lines``, the policy's own
    Monte-Carlo value at each turn start with ±1.96 standard errors when the batch carries the
    truth of ``mpo-viz truth`` (:data:`MC_TRACE`: "true value for this policy"), and, in a second
    panel, the per-token advantages of each entry of ``advantages`` (``{name: (B, L) tensor or
    result}``). Each turn's span (first to last action token) is shaded. The content is
    :func:`value_curve_parts`.
    """
    parts = value_curve_parts(batch, row, advantages=advantages, returns=returns, lines=lines, title=title)
    two = parts["two"]
    fig = make_subplots(
        rows=2 if two else 1, cols=1, shared_xaxes=True, vertical_spacing=0.06, row_heights=[0.6, 0.4] if two else None
    )
    for t in parts["traces"]:
        marker = {"color": t["style"]["color"]}
        if t["size"] is not None:
            marker["size"] = t["size"]
        err = t.get("error")
        fig.add_trace(
            go.Scatter(
                x=t["x"],
                y=t["y"],
                mode=t["mode"],
                name=t["name"],
                line=t["style"],
                marker=marker,
                connectgaps=False,
                error_y=None if err is None else dict(type="data", array=err, visible=True),
            ),
            row=t["panel"],
            col=1,
        )
    fig.update_layout(shapes=parts["shapes"])
    fig.update_layout(
        title=parts["title"],
        height=420 if two else 320,
        margin=dict(l=50, r=20, t=50, b=40),
        template="plotly_white",
        legend=dict(orientation="h", y=-0.15),
    )
    fig.update_yaxes(title_text="value", row=1, col=1)
    if two:
        fig.update_yaxes(title_text="advantage", row=2, col=1)
    fig.update_xaxes(title_text="response token", row=2 if two else 1, col=1)
    return fig


def across_within(
    vv: pd.DataFrame, *, title: str | None = None, max_points: int = 5000, source: str = "critic"
) -> go.Figure:
    """The paper's Fig. 2 diagnostic from a :func:`mpo_viz.analysis.value_variance` table.

    Left: one point per trajectory, ``within`` (x) against ``across`` (y) on log axes with the line
    y = x, coloured by reward (points above the line: values vary more across turns than within).
    Right: histogram of ``log10(across / within)`` over finite ratios. Rows with a zero or NaN
    statistic cannot sit on log axes and are left out (counted in the title). At most
    ``max_points`` points are drawn (an evenly spaced subset), the histogram uses all rows.
    ``source``: where the values come from (the data's ``values_source``: ``critic``, ``oracle``),
    named in the title.
    """
    d = vv[(vv["across"] > 0) & (vv["within"] > 0)]
    dropped = len(vv) - len(d)
    if len(d) > max_points:
        d = d.iloc[np.linspace(0, len(d) - 1, max_points).round().astype(int)]
    fig = make_subplots(
        rows=1,
        cols=2,
        column_widths=[0.58, 0.42],
        horizontal_spacing=0.12,
        subplot_titles=("across vs within (per trajectory)", "log10(across / within)"),
    )
    fig.add_trace(
        go.Scatter(
            x=d["within"],
            y=d["across"],
            mode="markers",
            name="trajectories",
            text=d["traj_id"],
            customdata=np.stack([d["reward"], d["n_turns"]], axis=1) if len(d) else None,
            hovertemplate="%{text}<br>within %{x:.3g}<br>across %{y:.3g}<br>reward %{customdata[0]:.3g}"
            "<br>turns %{customdata[1]}<extra></extra>",
            # many points overlap: smaller, translucent markers with a thin outline so density shows
            marker=dict(
                color=d["reward"],
                colorscale="Viridis",
                size=7 if len(d) <= 300 else 5,
                opacity=0.85 if len(d) <= 300 else max(0.25, min(0.6, 120 / len(d) ** 0.8)),
                line=dict(width=0.3, color="#333"),
                showscale=True,
                colorbar=dict(title="reward", x=1.02, xanchor="left", len=0.8, thickness=14),
            ),
        ),
        row=1,
        col=1,
    )
    if len(d):
        lo = float(min(d["within"].min(), d["across"].min()))
        hi = float(max(d["within"].max(), d["across"].max()))
        fig.add_trace(
            go.Scatter(x=[lo, hi], y=[lo, hi], mode="lines", name="y = x", line=dict(color="#888", dash="dash")),
            row=1,
            col=1,
        )
    r = vv["ratio"].to_numpy(dtype=np.float64)
    r = r[np.isfinite(r) & (r > 0)]
    fig.add_trace(go.Histogram(x=np.log10(r), nbinsx=40, name="log10 ratio", marker_color="#4c78a8"), row=1, col=2)
    fig.add_vline(x=0, line=dict(color="#888", dash="dash"), row=1, col=2)
    fig.update_xaxes(type="log", title_text="within-turn variance", row=1, col=1)
    fig.update_yaxes(type="log", title_text="across-turn variance", row=1, col=1)
    fig.update_xaxes(title_text="log10(across / within)", row=1, col=2)
    fig.update_yaxes(title_text="trajectories", row=1, col=2)
    n_inf = int(np.isinf(vv["ratio"].to_numpy(dtype=np.float64)).sum())
    note = f"{len(vv)} trajectories"
    if dropped:
        note += f"; {dropped} with a zero statistic not on the log axes"
    if n_inf:
        note += f"; {n_inf} infinite ratios"
    fig.update_layout(
        title=title if title is not None else f"{source} value variance across vs within turns ({note})",
        height=480,
        showlegend=False,
        template="plotly_white",
        margin=dict(l=60, r=90, t=70, b=50),
    )
    return fig


def estimator_comparison(batch: TrajectoryBatch, row: int, advantages: dict, *, title: str | None = None) -> go.Figure:
    """Per-turn advantages of several estimators on one trajectory: grouped bars, one series per
    estimator, x = turn; turn advantage = mean over the turn's action tokens (``A^T_k`` for MAE). When
    the batch carries the policy's Monte-Carlo truth (``mpo-viz truth``), the true turn advantage
    ``a_mc`` (:meth:`~mpo_viz.data.trajectory.TrajectoryBatch.turns`) is a last, hatched series."""
    if not advantages:
        raise ValueError("advantages: expected at least one estimator, found none")
    sub, n, _ = _row_arrays(batch, row)
    L = sub.mask.shape[1]
    rows_adv = {k: an.to_numpy(getattr(v, "advantages", v))[row : row + 1, :L] for k, v in advantages.items()}
    tt = an.turn_table(sub, rows_adv)
    fig = go.Figure()
    for i, name in enumerate(rows_adv):
        fig.add_trace(
            go.Bar(x=[f"T{k}" for k in tt["turn"]], y=tt[f"adv_{name}"], name=name, marker_color=_colour(name, i))
        )
    if "a_mc" in tt and tt["a_mc"].notna().all():  # the policy's true turn credit, from mpo-viz truth
        fig.add_trace(
            go.Bar(
                x=[f"T{k}" for k in tt["turn"]],
                y=tt["a_mc"],
                name="truth (Monte-Carlo)",
                marker_color="#9467bd",
                marker_pattern_shape="/",
            )
        )
    fig.update_layout(
        barmode="group",
        template="plotly_white",
        height=300,
        margin=dict(l=50, r=20, t=50, b=40),
        title=title if title is not None else f"per-turn advantage by estimator ({batch.traj_ids[row]})",
        xaxis_title="turn",
        yaxis_title="mean advantage over the turn",
    )
    return fig
