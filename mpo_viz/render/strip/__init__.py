"""The per-token credit strip: one ES module (``strip.js``) + CSS (``strip.css``) shipped as package
data, fed by one JSON payload (schema ``mpo_viz.strip/v1``).

The report inlines the module as a classic script (:func:`strip_js` with ``module=False``, which
defines ``window.mpoStrip = {mount, render}``); the anywidget view loads the module text itself
(:func:`strip_js`, whose ``render({model, el})`` reads the ``payload`` trait) and :func:`strip_css`.

Payload (all lists of length N = the trajectory's response length, padding excluded)::

    {"version": 1, "title": str, "tokens": [str], "mask": [0|1], "turn_ids": [int],
     "channels": {name: [float|null]},                     # null = no value (NaN, inf)
     "channel_info": {name: {"label": str, "center": float, "scale": float|null,
                             "log": bool}},                # optional "log": the values are natural
                                                           # logs; legend and hover show exp(v)
     "channel": str,                                       # initially shown
     "meta": {key: scalar},                                # shown in the header
     "spaced": bool,                                       # optional: put a gap between tokens
                                                           # (word-level tokens without spaces)
     "focus": int,                                         # optional: token to scroll to on open
     "notes": {index: str},                                # optional: a hover note per token (a
                                                           # multi-byte character split across
                                                           # tokens: its raw pieces)
     "truth": {"channel": str, "se": [float|null]}}        # optional: the token truth (below)

**The true advantage** (a file with the token truth of ``mpo-viz truth --tokens``): the channel
``truth`` holds ``Â_t`` on the measured tokens (null elsewhere) and ``payload["truth"]`` names it with
the standard errors. The strip then marks every measured token with a bar under it (a marker row
beneath each line of tokens), coloured by ``Â_t`` on the scale of the credit shown (the channel shown
when it is an advantage channel, ``adv_*``, ``advantages`` or ``truth``; else the truth channel's own),
so a token whose colour and mark differ is one where the estimator puts credit the truth does not
have; the hover gives ``Â_t ± 1.96·se``. The truth channel takes the advantage channels' colour scale
(:func:`set_scale` with :data:`TRUTH_CHANNEL` among them).

Colours: diverging scale centred at ``center`` (0, except the probability ratio: 1), saturating at
``scale`` (default: the 99th percentile of ``|v − center|`` over the strip's action tokens). An
optional ``channel_info[name]["scale_note"]`` says where a given scale comes from (shown in the
legend). Tokens beyond the scale are clipped to the end colours; the strip marks them (``▲``, a
dark underline) and the legend counts them and gives the largest ``|v − center|``.

Colour-scale modes (:data:`SCALE_MODES`, used by the widgets and the report; :func:`robust_scale`,
:func:`set_scale`): ``"absolute"`` — one fixed number for all advantage channels, taken from the
whole batch (the same value has the same colour across trajectories, strips and slider moves);
``"shared"`` — one number for all advantage channels of the trajectory shown (strips stacked for
comparison share it); ``"own"`` — each channel its own 99th percentile (the strip's default).
"""

from __future__ import annotations

import json
import math
from functools import cache
from importlib import resources

import numpy as np
import torch

from mpo_viz.advantages import registry
from mpo_viz.analysis.critic import critic_based, values_are_noise
from mpo_viz.data.token_text import char_notes, guess_split_groups
from mpo_viz.data.trajectory import TrajectoryBatch
from mpo_viz.data.turns import turn_ids_from_mask

__all__ = [
    "strip_js",
    "strip_css",
    "strip_payload",
    "payload_from_arrays",
    "payload_json",
    "payload_lists",
    "advantage_channels",
    "EXPORTS_MARKER",
    "SCALE_MODES",
    "robust_scale",
    "set_scale",
    "within_turn_part",
    "TRUTH_CHANNEL",
]

#: the strip channel of the token truth's ``Â_t`` (module docstring)
TRUTH_CHANNEL = "truth"
TRUTH_LABEL = "true advantage Â_t (Monte-Carlo, measured tokens)"

#: colour-scale modes of the advantage channels (module docstring)
SCALE_MODES = ("absolute", "shared", "own")
SCALE_QUANTILE = 0.99
"""The strip saturates at this quantile of ``|v − center|`` (the JS uses the same order statistic)."""


def robust_scale(values, mask=None, *, center: float = 0.0, q: float = SCALE_QUANTILE) -> float:
    """The ``q`` quantile (lower order statistic, as the strip computes it) of ``|v − center|`` over
    the finite entries of ``values`` where ``mask`` is non-zero; 1.0 when there is none or it is 0."""
    v = np.asarray(values.detach().cpu().numpy() if hasattr(values, "detach") else values, dtype=np.float64)
    if mask is not None:
        m = np.asarray(mask.detach().cpu().numpy() if hasattr(mask, "detach") else mask) != 0
        v = v[m[..., : v.shape[-1]] if m.shape != v.shape else m]
    d = np.abs(v[np.isfinite(v)] - center)
    if not d.size:
        return 1.0
    d.sort()
    s = float(d[min(d.size - 1, int(np.floor(q * (d.size - 1))))]) or float(d[-1])
    return s if s > 0 else 1.0


def set_scale(payload: dict, names, scale: float | None, note: str = "") -> dict:
    """Set the colour scale of channels ``names`` (those present) in ``payload`` in place:
    ``scale`` None gives each back its own 99th percentile. Returns the payload."""
    info = payload.setdefault("channel_info", {})
    for k in names:
        if k in payload.get("channels", {}):
            i = info.setdefault(k, {"label": k, "center": 0.0})
            i["scale"] = None if scale is None else float(_floats([scale], 4)[0])
            i["scale_note"] = note if scale is not None else ""
    return payload


def within_turn_part(adv, mask, turn_ids) -> np.ndarray:
    """``A − (mean of A over its turn's action tokens)`` on action tokens, 0 elsewhere, for ``(B, L)``
    or ``(L,)`` arrays: MAE's micro scale ``β(u − ū)`` (the strip's ``micro_*`` channel)."""
    a = np.asarray(adv.detach().cpu().numpy() if hasattr(adv, "detach") else adv, dtype=np.float64)
    m = np.asarray(mask.detach().cpu().numpy() if hasattr(mask, "detach") else mask) != 0
    t = np.asarray(turn_ids.detach().cpu().numpy() if hasattr(turn_ids, "detach") else turn_ids, dtype=np.int64)
    one = a.ndim == 1
    a, m, t = np.atleast_2d(a), np.atleast_2d(m), np.atleast_2d(t)
    L = a.shape[1]
    m, t = m[:, :L], t[:, :L]
    k = int(t.max()) + 1 if t.size else 1
    key = (np.arange(a.shape[0])[:, None] * k + np.clip(t, 0, None)).ravel()
    am = np.where(m, a, 0.0).ravel()
    cnt = np.bincount(key, weights=m.ravel().astype(np.float64), minlength=a.shape[0] * k)
    tot = np.bincount(key, weights=am, minlength=a.shape[0] * k)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.where(m.ravel(), am - (tot / np.where(cnt > 0, cnt, 1))[key], 0.0).reshape(a.shape)
    return out[0] if one else out


EXPORTS_MARKER = "// @@EXPORTS@@"


@cache
def _read(name: str) -> str:
    return resources.files(__name__).joinpath(name).read_text(encoding="utf-8")


def strip_css() -> str:
    """The strip's stylesheet (scoped under ``.mpo-strip``)."""
    return _read("strip.css")


def strip_js(*, module: bool = True) -> str:
    """The strip's JavaScript.

    ``module=True``: the ES module text (exports ``mount`` and the default ``{render, mount}``),
    for anywidget's ``_esm``. ``module=False``: a classic script for inlining into a page without
    imports; it defines ``window.mpoStrip = {mount, render}``.
    """
    src = _read("strip.js")
    if module:
        return src
    head = src.split(EXPORTS_MARKER, 1)[0]
    head = head.replace("export function ", "function ")
    return "(function () {\n" + head + "\nwindow.mpoStrip = { mount, render };\n})();\n"


def round_sig(x, sig: int) -> np.ndarray:
    """``x`` rounded to ``sig`` significant digits, as float64 (NaN where ``x`` is NaN or ±inf):
    element for element the number ``float(f"{v:.{sig}g}")`` gives, computed on whole arrays.

    Each finite non-zero ``v`` is scaled by an exact power of ten ``10**k`` (``|k| <= 22``) so that
    ``sig`` digits are left of the point, rounded half to even, and divided back (one correctly
    rounded operation, so the result is the double nearest to the decimal, as ``float()`` of the
    string is). Where that could differ from the string (the scaled value within 1e-9 of a half,
    i.e. a possible tie; a misjudged exponent; ``|k| > 22``) the value is formatted as a string."""
    a = np.asarray(x, dtype=np.float64).ravel()
    out = np.where(np.isfinite(a), a, np.nan)
    nz = np.flatnonzero(np.isfinite(a) & (a != 0))
    if not len(nz):
        return out
    w = a[nz]
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        k = (sig - 1) - np.floor(np.log10(np.abs(w))).astype(np.int64)
        ok = np.abs(k) <= 22
        p = 10.0 ** np.abs(np.where(ok, k, 0))
        scaled = np.where(k >= 0, w * p, w / p)
        m = np.rint(scaled)
        r = np.where(k >= 0, m / p, m * p)
        mag = np.abs(scaled)
        frac = mag - np.floor(mag)
    bad = ~ok | (mag < 10.0 ** (sig - 1)) | (mag >= 10.0**sig) | (np.abs(frac - 0.5) < 1e-9)
    if bad.any():
        f = f"{{:.{sig}g}}"
        r[bad] = [float(f.format(v)) for v in w[bad].tolist()]
    out[nz] = r
    return out


def _floats(x, sig: int) -> list:
    """Rounded to ``sig`` significant digits (:func:`round_sig`); NaN / inf → None (JSON null)."""
    return [None if v != v else v for v in round_sig(x, sig).tolist()]


def payload_from_arrays(
    tokens,
    mask,
    turn_ids=None,
    channels: dict | None = None,
    *,
    channel_info: dict | None = None,
    channel: str | None = None,
    title: str = "",
    meta: dict | None = None,
    digits: int = 5,
    arrays: bool = False,
) -> dict:
    """A strip payload from plain 1-D arrays of one trajectory (length N each).

    ``tokens``: N display strings; ``mask``: 0/1 (1 = action token); ``turn_ids``: ids (None →
    derived from mask runs); ``channels``: ``{name: N floats}``; ``channel_info``: optional
    ``{name: {"label", "center", "scale"}}``; ``channel``: the channel shown first (default: the
    first). Values are rounded to ``digits`` significant digits to keep payloads small.

    ``arrays``: the numbers as numpy arrays instead of lists — each channel ``(N,)`` float64 (a
    missing value is NaN instead of None), ``mask`` ``(N,)`` uint8, ``turn_ids`` ``(N,)`` int32 —
    what the widgets send as binary buffers without going through Python lists; the same numbers
    (:func:`payload_lists` turns it into the list form, :func:`payload_json` writes either).
    """
    tokens = [("" if t is None else str(t)) for t in tokens]
    n = len(tokens)
    m = np.asarray(mask).ravel()
    if m.shape[0] != n:
        raise ValueError(f"mask: expected {n} entries (one per token), found {m.shape[0]}")
    m = (m != 0).astype(np.int64)
    t = turn_ids_from_mask(m) if turn_ids is None else np.asarray(turn_ids, dtype=np.int64).ravel()
    if t.shape[0] != n:
        raise ValueError(f"turn_ids: expected {n} entries (one per token), found {t.shape[0]}")
    chans = {}
    for k, v in (channels or {}).items():
        a = np.asarray(v.detach().cpu().numpy() if hasattr(v, "detach") else v, dtype=np.float64).ravel()
        if a.shape[0] != n:
            raise ValueError(f"channels[{k!r}]: expected {n} values (one per token), found {a.shape[0]}")
        chans[k] = round_sig(a, digits) if arrays else _floats(a, digits)
    info = {k: {"label": k, "center": 0.0, "scale": None} for k in chans}
    for k, v in (channel_info or {}).items():
        if k in info:
            info[k].update(v)
    if channel is not None and channel not in chans:
        raise ValueError(f"channel: expected one of {sorted(chans)}, found {channel!r}")
    return {
        "version": 1,
        "title": str(title),
        "tokens": tokens,
        "mask": m.astype(np.uint8) if arrays else m.tolist(),
        "turn_ids": t.astype(np.int32) if arrays else t.tolist(),
        "channels": chans,
        "channel_info": info,
        "channel": channel if channel is not None else (next(iter(chans)) if chans else None),
        "meta": {k: _scalar(v) for k, v in (meta or {}).items()},
    }


def _scalar(v):
    if isinstance(v, (np.generic,)):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None if math.isnan(v) else str(v)
    return v


def _row_tokens(batch: TrajectoryBatch, i: int, n: int, tokens) -> tuple[list[str], dict[int, str]]:
    """Display strings of row ``i`` and the hover notes of split characters (``{index: note}``):
    from a decoder's ``with_notes`` (raw bytes listed), else recovered from the texts
    (:func:`mpo_viz.data.token_text.guess_split_groups`: token ids listed)."""
    ids = [int(x) for x in np.asarray(batch.field("response_ids")[i]).tolist()]
    if tokens is not None and callable(tokens):
        with_notes = getattr(tokens, "with_notes", None)
        if with_notes is not None:
            texts, notes = with_notes(ids)
            return [str(s) for s in texts], notes
        texts = [str(s) for s in tokens(ids)]
    elif tokens is not None:
        texts = [str(s) for s in tokens]
    elif batch.has("response_tokens") and batch.field("response_tokens")[i] is not None:
        texts = ["" if s is None else str(s) for s in batch.field("response_tokens")[i]]
    else:
        return [f"{x} " for x in ids], {}
    return texts, char_notes(texts, ids, guess_split_groups(texts)) if len(texts) == len(ids) else {}


def strip_payload(
    batch: TrajectoryBatch,
    row: int,
    *,
    advantages: dict | None = None,
    td=None,
    tokens=None,
    channel: str | None = None,
    title: str | None = None,
    digits: int = 5,
    arrays: bool = False,
) -> dict:
    """The strip payload for trajectory ``row`` of a :class:`~mpo_viz.data.trajectory.TrajectoryBatch`.

    Channels (each only when the batch has what it needs):

    * ``adv_<name>`` for each entry of ``advantages`` (``{name: (B, L) tensor or result}``), and
      per-token ``adv_*`` columns already in the batch (e.g. written by ``mpo-viz advantages``);
    * ``micro_<name>`` for the first multiscale estimator among them (mpo or mae:
      :func:`mpo_viz.advantages.multiscale_estimator`): that advantage minus its turn mean — MAE's
      within-turn part ``β(u − ū)`` — so the micro scale is visible even when ``A^T_k`` dominates the colour;
    * ``advantages`` (logged), ``value``, ``td`` (the one-step TD error ``δ_t = r_t + γV_{t+1} − V_t``
      over action tokens, given by the caller as ``td``: a ``(B, L)`` tensor or array, e.g.
      :func:`mpo_viz.analysis.td_error`; the strip computes no estimator itself), ``reward``;
    * ``logprob`` (``old_logprobs``, else ``rollout_logprobs``), ``ratio`` =
      ``exp(old − rollout)`` (centred at 1), ``kl`` = ``old − ref`` (k1), ``entropy``;
    * what a trainer's update did (the saved ``ratio`` and ``clipped``): ``update_ratio`` — the log
      of the ratio after the update (centred at 0, so ×2 and ÷2 get opposite colours of one depth;
      legend and hover show the ratio itself) and ``clipped`` (1 where the loss's clip held the
      token; scale 1).

    ``tokens``: display strings for the row, or a callable ``ids -> strings`` (a tokenizer's
    per-token decode); default the ``response_tokens`` field, else the token ids. ``arrays``: the
    numbers as numpy arrays (:func:`payload_from_arrays`), as the widgets send them.
    """
    B = len(batch)
    if not -B <= row < B:
        raise ValueError(f"row: expected an index in [0, {B}), found {row}")
    row = row % B
    sub = batch[[row]]
    n = int(sub.lengths[0])
    mask = sub.mask[0, :n].numpy()
    ch = _Channels(n)
    _advantage_channels(ch, sub, row, advantages, mask)
    _value_channels(ch, sub, row, td)
    _logprob_channels(ch, sub)
    _update_channels(ch, sub)
    truth_se = _truth_channel(ch, sub)
    _other_channels(ch, sub)
    noise = values_are_noise(sub)
    if noise:
        _mark_noise(ch)
    # observation tokens carry no values: blank them so hover shows "—" rather than a stale number
    chans = {k: np.where(mask != 0, v, np.nan) for k, v in ch.values.items()}
    if channel is None:
        channel = next((k for k in chans if k.startswith("adv_")), None) or ("value" if "value" in chans else None)
    toks, notes = _row_tokens(batch, row, n, tokens)
    score = float(sub.token_rewards[0].sum())
    meta = {"group": batch.group_ids[row], "score": round(score, 6), "turns": int(sub.num_turns[0])}
    payload = payload_from_arrays(
        toks,
        mask,
        sub.turn_ids[0, :n].numpy(),
        chans,
        channel_info=ch.info,
        channel=channel,
        title=title if title is not None else f"trajectory {batch.traj_ids[row]}",
        meta=meta,
        digits=digits,
        arrays=arrays,
    )
    # word-level tokenizers give tokens without whitespace: ask the strip to space them out
    payload["spaced"] = len(toks) > 1 and not any(any(c.isspace() for c in t) for t in toks)
    if notes:
        payload["notes"] = {str(k): v for k, v in sorted(notes.items())}
    if truth_se is not None:
        payload["truth"] = {"channel": TRUTH_CHANNEL, "se": _floats(np.where(mask != 0, truth_se, np.nan), digits)}
    if noise:
        payload["meta"]["critic"] = f"NOISE: {noise}"
    return payload


NOISE_LABEL = " — NOISE: the critic's values are no estimate, do not read this as credit"


def _mark_noise(ch: _Channels) -> None:
    """Say beside every channel built on critic values (``value``, ``td`` and the ``adv_`` /
    ``micro_`` channels of critic-based estimators) that those values are noise."""
    for name, info in ch.info.items():
        est = name.split("_", 1)[1] if name.startswith(("adv_", "micro_")) else None
        if name in ("value", "td") or (est is not None and critic_based([est])):
            info["label"] += NOISE_LABEL


class _Channels:
    """The channels of one strip being built: values (length n) and their info, in order."""

    def __init__(self, n: int):
        self.n = n
        self.values: dict[str, np.ndarray] = {}
        self.info: dict[str, dict] = {}

    def add(self, name: str, arr, label: str, center: float = 0.0) -> None:
        self.values[name] = np.asarray(arr, dtype=np.float64)[: self.n]
        self.info[name] = {"label": label, "center": center, "scale": None}


MICRO_LABEL = (
    "within-turn part ({est}: A − turn mean; relative to its turn: blue = above the turn's mean, "
    "even in a failed episode)"
)


def _option_channels(advantages: dict, mask: np.ndarray, turn_ids: np.ndarray) -> dict:
    """``{channel: (values (n,) float64, label)}`` of the channels that depend on the estimators'
    options: ``adv_<name>`` for each ``{name: (n,) advantages}`` and, for the first multiscale
    estimator among them (:func:`mpo_viz.advantages.multiscale_estimator`), ``micro_<name>`` = the
    advantage minus its turn mean over action tokens (MAE's ``β(u − ū)``; the turn mean is
    ``A^T_k``). Not blanked or rounded (see :func:`advantage_channels`)."""
    out = {f"adv_{k}": (np.asarray(a, dtype=np.float64), f"advantage ({k})") for k, a in advantages.items()}
    for est in filter(None, [registry.multiscale_estimator(advantages)]):
        act = mask != 0
        a = np.where(act, out[f"adv_{est}"][0], 0.0)
        cnt = np.bincount(turn_ids, weights=act.astype(np.float64))
        tot = np.bincount(turn_ids, weights=a)
        with np.errstate(invalid="ignore", divide="ignore"):
            out[f"micro_{est}"] = (a - (tot / cnt)[turn_ids], MICRO_LABEL.format(est=est))
    return out


def advantage_channels(advantages: dict, mask, turn_ids, *, digits: int = 5) -> dict:
    """The strip channels a slider move changes, exactly as :func:`strip_payload` (``arrays=True``)
    builds them: ``{"adv_<name>": (n,) float64, "micro_<est>": (n,) float64}`` for ``advantages``
    = ``{name: (n,) advantages of one trajectory}`` (n = its response length), ``mask`` and
    ``turn_ids`` ``(n,)``; observation tokens NaN, values rounded to ``digits`` significant digits
    (:func:`round_sig`). What the views send as a patch (``StripWidget.update_channels``)."""
    m = np.asarray(mask).ravel()
    t = np.asarray(turn_ids, dtype=np.int64).ravel()
    rows = {
        k: np.asarray(a.detach().cpu().numpy() if hasattr(a, "detach") else a, dtype=np.float64).ravel()
        for k, a in advantages.items()
    }
    for k, a in rows.items():
        if a.shape[0] != m.shape[0]:
            raise ValueError(f"advantages[{k!r}]: expected {m.shape[0]} values (one per token), found {a.shape[0]}")
    return {k: round_sig(np.where(m != 0, v, np.nan), digits) for k, (v, _) in _option_channels(rows, m, t).items()}


def _advantage_channels(ch: _Channels, sub, row: int, advantages, mask: np.ndarray) -> None:
    """``adv_<name>`` of each given estimator, the multiscale one's within-turn part
    ``micro_<name>`` (:func:`_option_channels`), the stored ``adv_*`` columns and the logged ``advantages``."""
    rows = {}
    for name, a in (advantages or {}).items():
        a = getattr(a, "advantages", a)
        a = a.detach().cpu().numpy() if hasattr(a, "detach") else np.asarray(a)
        rows[name] = np.asarray(a[row], dtype=np.float64)[: ch.n]
    for k, (v, label) in _option_channels(rows, mask, sub.turn_ids[0, : ch.n].numpy()).items():
        ch.add(k, v, label)
    for f in sub.token_fields:
        if f.startswith("adv_") and f not in ch.values:
            ch.add(f, sub.padded(f, fill=math.nan)[0].numpy(), f"advantage ({f[4:]}, stored)")
    if sub.has("advantages"):
        ch.add("advantages", sub.padded("advantages", fill=math.nan)[0].numpy(), "advantage (logged)")


def _value_channels(ch: _Channels, sub, row: int, td) -> None:
    """``value``, the TD error ``td`` (given by the caller) and ``reward``."""
    if sub.values is not None:
        ch.add("value", sub.values[0].numpy(), "value")
    if td is not None:
        td = td.detach().cpu().numpy() if hasattr(td, "detach") else np.asarray(td)
        ch.add("td", td[row] if td.ndim == 2 else td, "TD error δ")
    ch.add("reward", sub.padded("rewards", fill=0.0)[0].numpy(), "reward")


def _logprob_channels(ch: _Channels, sub) -> None:
    """``logprob`` (old, else rollout), the ``ratio`` old/rollout, ``kl`` to the reference, ``entropy``."""

    def field(name):
        return sub.padded(name, fill=math.nan)[0].numpy() if sub.has(name) else None

    old, roll, ref = field("old_logprobs"), field("rollout_logprobs"), field("ref_logprobs")
    if old is not None or roll is not None:
        ch.add("logprob", old if old is not None else roll, "logprob (old)" if old is not None else "logprob (rollout)")
    if old is not None and roll is not None:
        ch.add("ratio", np.exp(np.clip(old - roll, -20, 20)), "ratio exp(old − rollout)", center=1.0)
    if old is not None and ref is not None:
        ch.add("kl", old - ref, "KL k1 (old − ref)")
    if sub.has("entropy"):
        ch.add("entropy", field("entropy"), "entropy")


def _update_channels(ch: _Channels, sub) -> None:
    """``update_ratio`` (log of the saved ``ratio``, flagged ``log``) and ``clipped`` (0/1, scale 1)."""
    if sub.has("ratio"):
        with np.errstate(divide="ignore", invalid="ignore"):  # ratios are > 0 on action tokens
            ch.add(
                "update_ratio",
                np.log(sub.padded("ratio", torch.float64, fill=math.nan)[0].numpy()),
                "ratio after the update (log scale)",
            )
        ch.info["update_ratio"]["log"] = True
    if sub.has("clipped"):
        ch.add(
            "clipped", sub.padded("clipped", torch.float64, fill=math.nan)[0].numpy(), "clipped by the loss (1 = yes)"
        )
        ch.info["clipped"]["scale"] = 1.0


def _truth_channel(ch: _Channels, sub) -> np.ndarray | None:
    """The token truth's ``Â_t`` as the channel :data:`TRUTH_CHANNEL` (NaN where not measured); its
    standard errors (None without a token truth)."""
    if not (sub.has("mc_tok_adv") and sub.has("mc_tok_measured")):
        return None
    measured = sub.padded("mc_tok_measured", torch.float64, fill=0.0)[0].numpy()[: ch.n] > 0.5
    adv = sub.padded("mc_tok_adv", torch.float64, fill=math.nan)[0].numpy()[: ch.n]
    ch.add(TRUTH_CHANNEL, np.where(measured, adv, np.nan), TRUTH_LABEL)
    if not sub.has("mc_tok_adv_se"):
        return np.full(ch.n, np.nan)
    se = sub.padded("mc_tok_adv_se", torch.float64, fill=math.nan)[0].numpy()[: ch.n]
    return np.where(measured, se, np.nan)


_KNOWN = {
    "response_ids",
    "loss_mask",
    "turn_ids",
    "response_tokens",
    "token_rewards",
    "values",
    "advantages",
    "returns",
    "old_logprobs",
    "rollout_logprobs",
    "ref_logprobs",
    "entropy",
    "ratio",
    "clipped",
}


def _other_channels(ch: _Channels, sub) -> None:
    """Any other numeric per-token column (e.g. an environment's oracle_values) is a channel too (the
    token truth's own columns aside: :func:`_truth_channel` shows them)."""
    for f in sub.token_fields:
        if f in _KNOWN or f in ch.values or f.startswith(("adv_", "ret_", "mc_tok_")):
            continue
        try:
            ch.add(f, sub.padded(f, torch.float64, fill=math.nan)[0].numpy(), f)
        except (ValueError, TypeError, KeyError):
            continue  # strings or other non-numeric columns


def _json_numbers(a: np.ndarray) -> list:
    """An array of a payload (``arrays=True``) as the JSON form's list: NaN / ±inf as None."""
    if a.dtype.kind == "f":
        return [None if v != v or v in (math.inf, -math.inf) else v for v in a.tolist()]
    return a.tolist()


def payload_lists(payload: dict) -> dict:
    """The JSON form of a payload: its numpy arrays (a payload built with ``arrays=True``, or a
    widget's) as lists, NaN as None; a payload of lists is returned as is. A new dict (the arrays
    of ``channels``, ``mask`` and ``turn_ids`` converted; nothing else is copied)."""
    chans = payload.get("channels") or {}
    if not any(isinstance(payload.get(k), np.ndarray) for k in ("mask", "turn_ids")) and not any(
        isinstance(v, np.ndarray) for v in chans.values()
    ):
        return payload
    out = dict(payload)
    for k in ("mask", "turn_ids"):
        if isinstance(out.get(k), np.ndarray):
            out[k] = _json_numbers(out[k])
    out["channels"] = {k: _json_numbers(v) if isinstance(v, np.ndarray) else v for k, v in chans.items()}
    return out


def payload_json(payload: dict) -> str:
    """Compact JSON of a payload (lists or arrays, :func:`payload_lists`), safe to inline in
    ``<script type="application/json">``."""
    s = json.dumps(payload_lists(payload), separators=(",", ":"), allow_nan=False, ensure_ascii=False)
    return (
        s.replace("</", "<\\/").replace("<!--", "<\\u0021--").replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")
    )
