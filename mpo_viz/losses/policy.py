"""Policy losses: token PPO, MPO's turn-level PPO, GSPO, SAO, CISPO, SAPO; a registry; metrics.

The first four kinds share one shape. With ``logr_t = clamp(logπ_θ − logπ_base, ±20)`` on action tokens
(base = ``old_logp``, or ``rollout_logp`` for SAO), each action token gets a surrogate ratio
``s_t`` and the clipped objective

    L_t = max(−A_t·s_t, −A_t·clip(s_t, 1 − ε_low, 1 + ε_high))        [dual clip: A_t < 0 → min(L_t, −c·A_t)]

* ``token_ppo``: ``s_t = exp(logr_t)``.
* ``turn_ppo`` (MPO): ``s_{k,j} = sg(ρ_k)·exp(logπ_θ(j) − sg(logπ_θ(j)))`` with the turn ratio
  ``ρ_k = exp(mean_{j∈k} logr_j)`` (``ratio="geo_mean"``) or ``exp(clamp(Σ_{j∈k} logr_j, ±20))``
  (``ratio="product"``). The value of ``s`` is ``ρ_k`` (turn-level trust region) but its gradient
  is ``ρ_k·∇logπ_θ(j)`` (token-level credit). Making ``ρ_k`` itself differentiable would give every
  token of the turn the gradient ``−ρ_k·mean_j A_{k,j}·∇logπ``: MAE's within-turn centering would
  cancel. ``tests/losses/test_policy.py`` holds a regression test for exactly this.
  The turn's band alone lets one token of a long turn move far while the turn's mean ratio stays
  inside it (ε = 0.2 on a 26-token geometric mean admits a ~1.2^26-fold move of one token), and
  the turn ratio weights every token's gradient by ρ_k ≈ 1, so a token whose probability already
  fell keeps being pushed down for a negative advantage (token_ppo's own ratio shrinks that push).
  So turn_ppo holds a band on each token's own ratio ``r_t`` **by default**, ``token_clip`` = c =
  :data:`TURN_PPO_TOKEN_CLIP` (2.0): a token with ``A_t > 0, r_t > c`` or ``A_t < 0, r_t < 1/c``
  keeps its loss value and gets no gradient (counted in ``clipfrac_high`` / ``clipfrac_low``).
  ``token_clip=None`` is the bare form.
* ``gspo``: the same construction with the whole trajectory (all its action tokens) as the unit;
  ``token_clip`` available (default None: GSPO's own tight clip is its trust region).
* ``sao``: ``r_t = exp(logr_t)`` against the *rollout* log-probs; ``L_t = −A_t·sg(r_t)·exp(logπ_θ −
  sg(logπ_θ))`` for ``1 − ε_low < r_t < 1 + ε_high`` and 0 outside (no gradient, whatever A's sign).

Two kinds replace the clipped objective:

* ``cispo`` (MiniMax-M1, arXiv 2506.13585): ``L_t = −A_t·sg(clip(r_t, 1 − ε_low, 1 + ε_high))·logπ_θ(t)``,
  every token keeps the gradient ``−A_t·clip(r_t)·∇logπ_θ(t)`` (the weight is clipped, never the
  token); default ε 1.0 / 4.0 (no lower bound, weight ≤ 5: ScaleRL's, SkyRL's defaults). The loss
  *value* carries ``logπ_θ`` (as the public implementations write it), so only its gradient
  compares with the other kinds'.
* ``sapo`` (Qwen, arXiv 2511.20347): ``L_t = −A_t·(4/τ_t)·σ(τ_t·(r_t − 1))``, τ_t = ``tau_pos`` (1.0)
  where A_t > 0 and ``tau_neg`` (1.05) elsewhere: a soft gate instead of the hard clip, gradient
  ``−A_t·4σ(1 − σ)·r_t·∇logπ_θ(t)`` (= the policy gradient at r = 1, decaying smoothly away from it);
  default aggregation ``seq-mean-token-mean`` (the paper's). Nothing is clipped (clip fractions 0).

The clipped branch is taken only where it is *strictly* larger (then its gradient is 0, as with
``torch.maximum``); ties take the unclipped branch, whose gradient is then the same.

:func:`policy_loss_reference` is the readable per-token loop the vectorized code is tested against.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from mpo_viz.checks import OptionError, TensorLike, warn_once
from mpo_viz.losses._common import (
    Segments,
    as_tensor,
    check_finite,
    check_mask,
    check_same_shape,
    result_dtype,
    row_segments,
    segments,
)
from mpo_viz.losses.aggregate import AGG_MODES, check_scale, reduce_checked
from mpo_viz.options import UNSET, Option

__all__ = [
    "LOGR_CLAMP",
    "TURN_PPO_TOKEN_CLIP",
    "SAO_BANDS",
    "RATIO_MODES",
    "METRIC_NAMES",
    "LossKind",
    "LOGPROB_FIELDS",
    "LOGPROB_WHAT",
    "PolicyInputs",
    "PolicyTerms",
    "ClipFlags",
    "clip_flags",
    "available_losses",
    "get_loss",
    "register_loss",
    "loss_options",
    "policy_loss",
    "policy_loss_reference",
]

LOGR_CLAMP = 20.0
#: turn_ppo's default token band c: each token's own ratio is held to [1/c, c] on the side its
#: advantage pushes (``token_clip=None`` is the bare turn-level trust region)
TURN_PPO_TOKEN_CLIP = 2.0
RATIO_MODES = ("geo_mean", "product")

METRIC_NAMES = (
    "clipfrac_low",
    "clipfrac_high",
    "clipfrac",
    "dual_clipfrac",
    "turn_clipfrac",
    "approx_kl",
    "ratio_mean",
    "ratio_min",
    "ratio_max",
    "turn_ratio_mean",
    "turn_ratio_min",
    "turn_ratio_max",
    "within_turn_shift",
    "surrogate_gap",
)


#: the batch field each log-prob argument of :func:`policy_loss` comes from
LOGPROB_FIELDS = {"old_logp": "old_logprobs", "rollout_logp": "rollout_logprobs"}
#: what each log-prob argument is, in the words of the messages that ask for it (the losses', the trainer's)
LOGPROB_WHAT = {"old_logp": "the policy's log-probs at rollout", "rollout_logp": "the sampler's log-probs"}

# --------------------------------------------------------------------------------------------
# Options: the keywords of every kind, and the kinds' own (each declared once)
# --------------------------------------------------------------------------------------------

CLIP_LOW = Option(
    "clip_low",
    kind="float",
    low=0,
    high=1,
    optional=True,
    label="ε_low",
    doc="lower clip range ε_low: the ratio's band starts at 1 − ε_low (1: no lower bound; None: the kind's default)",
)
CLIP_HIGH = Option(
    "clip_high",
    kind="float",
    low=0,
    optional=True,
    label="ε_high",
    doc="upper clip range ε_high: the ratio's band ends at 1 + ε_high (None: the kind's default)",
)
RATIO = Option(
    "ratio",
    kind="choice",
    choices=RATIO_MODES,
    expect=f"one of {', '.join(RATIO_MODES)}",
    doc="the turn ratio ρ_k of turn_ppo (and gspo's sequence ratio): the geometric mean of the token "
    "ratios or their product (clamped)",
)
AGG = Option(
    "agg",
    kind="choice",
    choices=AGG_MODES,
    optional=True,
    expect=f"one of {', '.join(AGG_MODES)}",
    doc="how the per-token loss is reduced (None: the kind's default)",
)
DUAL_CLIP = Option(
    "dual_clip",
    kind="float",
    low=1,
    low_open=True,
    optional=True,
    label="c",
    expect="a number > 1 (verl uses 3) or None",
    doc="dual clip c: where A < 0 the loss is at most −c·A (None: off)",
)
TOKEN_CLIP = Option(
    "token_clip",
    kind="float",
    low=1,
    low_open=True,
    optional=True,
    label="token band",
    expect="a number > 1 (a band [1/c, c] on each token's own ratio) or None",
    doc="token band c: a token whose own ratio left [1/c, c] on the side its advantage pushes "
    "gets no gradient (None: off)",
)
#: SAO's bands on the ratio against the rollout log-probs, per task type: (1 − ε_low, 1 + ε_high)
SAO_BANDS = {"math": (0.7, 6.0), "code": (0.2, 4.0)}
BAND = Option(
    "band",
    kind="choice",
    choices=tuple(SAO_BANDS),
    optional=True,
    label="band",
    expect=f"one of {', '.join(SAO_BANDS)} or None",
    doc="SAO's band per task type: math keeps tokens with 0.7 < r < 6.0, code 0.2 < r < 4.0 (None: "
    "clip_low / clip_high, default the math band)",
)
TAU_POS = Option(
    "tau_pos",
    kind="float",
    low=0,
    low_open=True,
    label="τ+",
    doc="SAPO's gate temperature on tokens with a positive advantage (larger: the gate closes faster)",
)
TAU_NEG = Option(
    "tau_neg",
    kind="float",
    low=0,
    low_open=True,
    label="τ−",
    doc="SAPO's gate temperature on tokens with a zero or negative advantage",
)
_KIND_DEFAULTS = ("clip_low", "clip_high", "agg")  # None: the kind's own default
#: every keyword of :func:`policy_loss` a loss kind can be configured with, beside its own options
KEYWORDS = (CLIP_LOW, CLIP_HIGH, RATIO, AGG)
_VOCAB = {o.name: o for o in (*KEYWORDS, DUAL_CLIP, TOKEN_CLIP, TAU_POS, TAU_NEG, BAND)}


# --------------------------------------------------------------------------------------------
# Registry
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PolicyInputs:
    """What a loss kind receives; every tensor (B, L), zeros on masked tokens.

    ``logp`` is differentiable; ``logr`` = clamp(logp − base, ±20) (differentiable through logp),
    base being ``old_logp`` or, for kinds that need it, ``rollout_logp``.
    """

    logp: torch.Tensor
    logr: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor  # bool
    turns: Segments
    clip_low: float
    clip_high: float
    ratio: str


@dataclass(frozen=True)
class PolicyTerms:
    """What a loss kind returns: the per-token loss and, per token, which clip is active (bool).

    Each kind sets the flags by its own rule, beside its loss (the one place that says whether a
    token is clipped): token_ppo, turn_ppo, gspo — the clipped branch is strictly active (the ratio
    left the band on the side its advantage pushes), or the token band holds the token
    (``clipped_low``/``clipped_high``), or the dual clip caps it (``dual_clipped``); sao — the
    token's ratio lies outside its band (dropped, whatever A's sign); cispo — the token's weight
    was clipped (the token keeps a gradient); sapo — never (a soft gate, no clip).
    """

    loss: torch.Tensor
    clipped_low: torch.Tensor
    clipped_high: torch.Tensor
    dual_clipped: torch.Tensor

    @property
    def clipped(self) -> torch.Tensor:
        """(B, L) bool: any of the three flags — the tokens the loss clipped or dropped."""
        return self.clipped_low | self.clipped_high | self.dual_clipped


@dataclass(frozen=True)
class ClipFlags:
    """What a loss kind's clip does, per token and per turn, at given log-probs (:func:`clip_flags`).

    ``ratio`` (B, L): ``r_t = exp(logr_t)``, the token's ratio against the kind's base (``old_logp``;
    sao: ``rollout_logp``), its log clamped to ±20; 1 on masked tokens. ``clipped`` (B, L) bool:
    :attr:`PolicyTerms.clipped` of the kind. ``turn_ratio`` (S,): ρ_k over each turn's action
    tokens as ``ratio`` says (``geo_mean``: ``exp(mean_{j∈k} logr_j)``, the geometric mean of the
    token ratios; ``product``: ``exp(clamp(Σ logr_j, ±20))``) — turn_ppo's own ratio, for every
    kind. ``turn_clipped`` (S,) bool: ρ_k outside ``[1 − ε_low, 1 + ε_high]`` (the rule of the
    ``turn_clipfrac`` metric, whose value is their mean). ``turn_row`` (S,) int64: the row of each
    turn; turns are in row then turn order.
    """

    ratio: torch.Tensor
    clipped: torch.Tensor
    turn_ratio: torch.Tensor
    turn_clipped: torch.Tensor
    turn_row: torch.Tensor


@dataclass(frozen=True)
class LossKind:
    """A registered policy loss.

    ``needs`` ⊆ {"turns", "rollout_logp"}: "turns" — the loss itself uses turn ids (pass
    ``turn_ids`` when turns are not the mask runs); "rollout_logp" — ``rollout_logp`` is required.
    ``ratio_against`` is the log-prob the ratio is formed against. ``clip_low``/``clip_high``/``agg``
    are the defaults used when the caller passes None; ``options`` the names of the kind's own
    keyword options, ``spec`` their declarations (:class:`~mpo_viz.options.Option`, defaults from
    ``fn``'s signature). ``span_ratio``: the clip acts on a ratio over a span of tokens (a turn's or
    a sequence's geometric mean), so single tokens can move inside it — what the trainer's collapse
    check watches (``ratio_max`` against ``turn_ratio_max``). ``presets``: an option whose value
    names keyword values, ``{option: {value: {keyword: v}}}`` (sao's ``band``: ``{"math": {"clip_low":
    0.3, "clip_high": 5.0}, ...}``), applied before the kind's defaults.
    """

    name: str
    fn: Callable[..., PolicyTerms]
    needs: frozenset
    ratio_against: str = "old_logp"
    clip_low: float = 0.2
    clip_high: float = 0.2
    agg: str = "token-mean"
    options: tuple = ()
    span_ratio: bool = False
    presets: dict = field(default_factory=dict, compare=False)
    doc: str = field(default="", compare=False)
    spec: tuple = field(default=(), compare=False)

    @property
    def logprobs(self) -> tuple[str, ...]:
        """The log-prob arguments of :func:`policy_loss` this kind cannot do without (``old_logp``,
        ``rollout_logp``); :data:`LOGPROB_FIELDS` names the batch field of each."""
        out = ("rollout_logp",) if "rollout_logp" in self.needs else ()
        return out + (("old_logp",) if self.ratio_against == "old_logp" else ())

    def keywords(self) -> tuple[Option, ...]:
        """The keywords of :func:`policy_loss` with this kind's defaults (``clip_low``,
        ``clip_high``, ``ratio``, ``agg``), then its own options: every option it can be
        configured with."""
        defaults = {"clip_low": self.clip_low, "clip_high": self.clip_high, "ratio": "geo_mean", "agg": self.agg}
        return tuple(replace(o, default=defaults[o.name]) for o in KEYWORDS) + self.spec


_REGISTRY: dict[str, LossKind] = {}
_NEEDS = frozenset({"turns", "rollout_logp"})


def register_loss(
    name: str,
    fn: Callable[..., PolicyTerms] | None = None,
    *,
    needs=(),
    ratio_against: str = "old_logp",
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    agg: str = "token-mean",
    options=(),
    span_ratio: bool = False,
    presets: dict | None = None,
):
    """Register a loss kind ``fn(inputs: PolicyInputs, **options) -> PolicyTerms`` under ``name``.

    Usable as ``register("name", fn, ...)`` or as a decorator ``@register_loss("name", ...)``. A name
    can be registered once (ValueError otherwise). ``options``: the kind's own keyword options,
    :class:`~mpo_viz.options.Option` declarations or names of the declared ones (``"dual_clip"``,
    ``"token_clip"``); an undeclared name takes an unchecked option (kind ``"any"``). Defaults come
    from ``fn``'s signature. ``presets``: see :class:`LossKind` (each preset option must be one of
    ``options``; its presets may set ``clip_low``, ``clip_high`` and ``agg``).
    """

    def deco(f):
        if name in _REGISTRY:
            raise ValueError(f"name: loss kind {name!r} is already registered")
        nd = frozenset(needs)
        if not nd <= _NEEDS:
            raise ValueError(f"needs: expected a subset of {sorted(_NEEDS)}, found {sorted(nd)}")
        if ratio_against not in ("old_logp", "rollout_logp"):
            raise ValueError(f"ratio_against: expected 'old_logp' or 'rollout_logp', found {ratio_against!r}")
        if agg not in AGG_MODES:
            raise ValueError(f"agg: expected one of {', '.join(AGG_MODES)}, found {agg!r}")
        names = {o.name if isinstance(o, Option) else o for o in options}
        for opt, table in (presets or {}).items():
            keys = {k for kw in table.values() for k in kw}
            if opt not in names or not keys <= set(_KIND_DEFAULTS):
                raise ValueError(
                    f"presets: expected presets of the kind's own options setting {', '.join(_KIND_DEFAULTS)}, "
                    f"found {opt!r} setting {sorted(keys)}"
                )
        _REGISTRY[name] = LossKind(
            name=name,
            fn=f,
            needs=nd,
            ratio_against=ratio_against,
            clip_low=float(clip_low),
            clip_high=float(clip_high),
            agg=agg,
            options=tuple(o.name if isinstance(o, Option) else o for o in options),
            span_ratio=bool(span_ratio),
            presets=dict(presets or {}),
            doc=(f.__doc__ or "").strip(),
            spec=_declare(f, options),
        )
        return f

    return deco(fn) if fn is not None else deco


def _declare(fn: Callable, options: Iterable) -> tuple[Option, ...]:
    """The kind's own options as :class:`Option` s, defaults from ``fn``'s signature."""
    params = inspect.signature(fn).parameters
    out = []
    for o in options:
        o = o if isinstance(o, Option) else _VOCAB.get(o, Option(o, kind="any"))
        p = params.get(o.name)
        out.append(replace(o, default=UNSET if p is None or p.default is inspect.Parameter.empty else p.default))
    return tuple(out)


def loss_options(kind: str) -> tuple[Option, ...]:
    """Every option loss ``kind`` can be configured with, defaults filled in: the keywords of
    :func:`policy_loss` (``clip_low``, ``clip_high``, ``ratio``, ``agg``, with the kind's
    defaults), then the kind's own (``dual_clip``, ``token_clip``)."""
    return get_loss(kind).keywords()


def available_losses() -> list[str]:
    """Names of the registered loss kinds, sorted."""
    return sorted(_REGISTRY)


def get_loss(name: str) -> LossKind:
    """The :class:`LossKind` registered under ``name`` (ValueError naming the known ones)."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"kind: expected one of {', '.join(available_losses())}, found {name!r}") from None


# --------------------------------------------------------------------------------------------
# The kinds
# --------------------------------------------------------------------------------------------


def _clipped_objective(
    s,
    adv,
    mask,
    lo: float,
    hi: float,
    dual_clip: float | None,
    token_hold: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> PolicyTerms:
    """``max(−A·s, −A·clip(s, lo, hi))`` and the optional dual clip, with the active-branch masks.

    ``token_hold`` = (low, high) bool (B, L): tokens whose loss keeps its value but loses its
    gradient (the token band of turn_ppo/gspo), counted as clipped low / high.
    """
    unclipped = -adv * s
    s_c = s.detach().clamp(lo, hi)
    clipped = -adv * s_c
    active = mask & (clipped > unclipped)  # strictly: then s is outside the band and clip(s) is flat
    loss = torch.where(active, clipped, unclipped)
    sd = s.detach()
    low = active & (sd < lo)
    high = active & (sd > hi)
    if dual_clip is not None:
        dual_val = -adv.detach() * dual_clip
        dual = mask & (adv < 0) & (loss > dual_val)
        loss = torch.where(dual, dual_val, loss)
    else:
        dual = torch.zeros_like(mask)
    if token_hold is not None:
        hold_low, hold_high = token_hold
        loss = torch.where(hold_low | hold_high, loss.detach(), loss)
        low, high = low | hold_low, high | hold_high
    return PolicyTerms(loss=loss, clipped_low=low, clipped_high=high, dual_clipped=dual)


def unit_ratio(logr: torch.Tensor, units: Segments, ratio: str) -> torch.Tensor:
    """Per-unit ratio (S,) from the clamped token log-ratios (B, L) (detached).

    ``geo_mean``: ``exp(mean_{j∈k} logr_j)``; ``product``: ``exp(clamp(Σ_{j∈k} logr_j, ±20))``.
    """
    lr = logr.detach()
    tot = units.sum(lr)
    if ratio == "geo_mean":
        log_rho = tot / units.counts.to(lr.dtype)
    else:
        log_rho = tot.clamp(-LOGR_CLAMP, LOGR_CLAMP)
    return torch.exp(log_rho)


def _token_gradient_surrogate(x: PolicyInputs, units: Segments) -> torch.Tensor:
    """``s_{k,j} = sg(ρ_k) · exp(logπ_j − sg(logπ_j))``: value ρ_k, gradient ρ_k·∇logπ_j."""
    rho = unit_ratio(x.logr, units, x.ratio)
    return units.broadcast(rho, fill=1.0) * torch.exp(x.logp - x.logp.detach())


def product_warning(kind: str, clip_low: float, clip_high: float, counts: torch.Tensor) -> str:
    """What ``ratio="product"`` does to ``kind``'s units at this clip (``counts``: tokens per unit)."""
    lo, hi = (-math.log(1 - clip_low) if clip_low < 1 else math.inf), math.log(1 + clip_high)
    med = int(counts.median().item()) if counts.numel() else 0
    here = (
        f" The median unit of this batch has {med} tokens: a mean token log-ratio beyond "
        f"-{lo / med:.4f} / +{hi / med:.4f} (a {hi / med:.2%} move per token) clips it."
        if med
        else ""
    )
    return (
        f"{kind}: ratio='product' clips the product of a unit's token ratios at [{1 - clip_low:g}, {1 + clip_high:g}], "
        f"so a unit of n tokens stays inside only while its mean token log-ratio lies within "
        f"[-{lo:.3f}/n, +{hi:.3f}/n]: at n = 20 that is a {hi / 20:.2%} move per token on average, so once the "
        f"policy has moved at all nearly every unit of 20+ tokens is outside the band (its tokens whose "
        f"advantage pushes further get no gradient).{here} ratio='geo_mean' (the default) holds the same band on the "
        "mean log-ratio, "
        f"i.e. the product's band scaled with the unit's length."
    )


def _warn_product(kind: str, x: PolicyInputs, units: Segments) -> None:
    """Once per process per kind: what the product ratio does at this clip (:func:`product_warning`)."""
    if x.ratio == "product":
        warn_once(f"{kind}.ratio=product", product_warning(kind, x.clip_low, x.clip_high, units.counts))


def _token_band(x: PolicyInputs, token_clip) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Tokens the band ``[1/c, c]`` on each token's own ratio ``r_t`` holds: ``A_t < 0`` and
    ``r_t < 1/c`` (low), ``A_t > 0`` and ``r_t > c`` (high). None when ``token_clip`` is None."""
    if token_clip is None:
        return None
    logr = x.logr.detach()
    log_c = math.log(token_clip)
    adv = x.advantages
    return x.mask & (adv < 0) & (logr < -log_c), x.mask & (adv > 0) & (logr > log_c)


@register_loss("token_ppo", options=("dual_clip",))
def token_ppo(x: PolicyInputs, *, dual_clip: float | None = None) -> PolicyTerms:
    """PPO's clipped surrogate with the per-token ratio ``r_t = exp(logr_t)``; optional dual clip."""
    s = torch.exp(x.logr)
    return _clipped_objective(s, x.advantages, x.mask, 1 - x.clip_low, 1 + x.clip_high, dual_clip)


@register_loss("turn_ppo", needs=("turns",), options=("dual_clip", "token_clip"), span_ratio=True)
def turn_ppo(
    x: PolicyInputs, *, dual_clip: float | None = None, token_clip: float | None = TURN_PPO_TOKEN_CLIP
) -> PolicyTerms:
    """MPO: the turn ratio ρ_k in the token-gradient form ``sg(ρ_k)·exp(logπ − sg(logπ))``, with
    the token band ``token_clip`` = c (default 2.0; None = the bare form): a token whose own ratio
    left ``[1/c, c]`` on the side its advantage pushes gets no gradient."""
    _warn_product("turn_ppo", x, x.turns)
    s = _token_gradient_surrogate(x, x.turns)
    return _clipped_objective(
        s, x.advantages, x.mask, 1 - x.clip_low, 1 + x.clip_high, dual_clip, _token_band(x, token_clip)
    )


@register_loss(
    "gspo",
    clip_low=3e-4,
    clip_high=4e-4,
    agg="seq-mean-token-mean",
    options=("dual_clip", "token_clip"),
    span_ratio=True,
)
def gspo(x: PolicyInputs, *, dual_clip: float | None = None, token_clip: float | None = None) -> PolicyTerms:
    """GSPO: the turn_ppo construction with the whole trajectory as one unit (token band as turn_ppo)."""
    units = row_segments(x.mask)
    _warn_product("gspo", x, units)
    s = _token_gradient_surrogate(x, units)
    return _clipped_objective(
        s, x.advantages, x.mask, 1 - x.clip_low, 1 + x.clip_high, dual_clip, _token_band(x, token_clip)
    )


def _band_eps(band: str) -> dict:
    lo, hi = SAO_BANDS[band]
    return {"clip_low": round(1 - lo, 12), "clip_high": round(hi - 1, 12)}


@register_loss(
    "sao",
    needs=("rollout_logp",),
    ratio_against="rollout_logp",
    clip_low=0.3,
    clip_high=5.0,
    options=("band",),
    presets={"band": {b: _band_eps(b) for b in SAO_BANDS}},
)
def sao(x: PolicyInputs, *, band: str | None = None) -> PolicyTerms:
    """SAO: ``−A·sg(r)·exp(logπ − sg(logπ))`` inside ``(1 − ε_low, 1 + ε_high)`` vs rollout, 0 outside
    (the token is dropped, whatever A's sign). ``band`` names the band per task type
    (:data:`SAO_BANDS`: math (0.7, 6.0) — the default ε 0.3 / 5.0 —, code (0.2, 4.0)); it sets
    ε before the loss is formed, so this function reads the band from ``x``."""
    r = torch.exp(x.logr.detach())
    lo, hi = 1 - x.clip_low, 1 + x.clip_high
    inside = x.mask & (r > lo) & (r < hi)
    s = r * torch.exp(x.logp - x.logp.detach())
    loss = torch.where(inside, -x.advantages * s, torch.zeros((), dtype=s.dtype, device=s.device))
    return PolicyTerms(
        loss=loss,
        clipped_low=x.mask & (r <= lo),
        clipped_high=x.mask & (r >= hi),
        dual_clipped=torch.zeros_like(x.mask),
    )


@register_loss("cispo", clip_low=1.0, clip_high=4.0)
def cispo(x: PolicyInputs) -> PolicyTerms:
    """CISPO: ``−A·sg(clip(r, 1 − ε_low, 1 + ε_high))·logπ_θ``, r against ``old_logp``; every token
    keeps a gradient (the importance weight is clipped, not the token). Defaults ε 1.0 / 4.0."""
    r = torch.exp(x.logr.detach())
    lo, hi = 1 - x.clip_low, 1 + x.clip_high
    loss = torch.where(
        x.mask, -x.advantages * r.clamp(lo, hi) * x.logp, torch.zeros((), dtype=r.dtype, device=r.device)
    )
    return PolicyTerms(
        loss=loss, clipped_low=x.mask & (r < lo), clipped_high=x.mask & (r > hi), dual_clipped=torch.zeros_like(x.mask)
    )


@register_loss("sapo", agg="seq-mean-token-mean", options=("tau_pos", "tau_neg"))
def sapo(x: PolicyInputs, *, tau_pos: float = 1.0, tau_neg: float = 1.05) -> PolicyTerms:
    """SAPO: ``−A·(4/τ)·σ(τ·(r − 1))`` with τ = ``tau_pos`` where A > 0, ``tau_neg`` elsewhere: a
    soft gate instead of the clip (its gradient ``−A·4σ(1 − σ)·r·∇logπ`` is the policy gradient at
    r = 1). ``clip_low``/``clip_high`` only set the band of the ``turn_clipfrac`` metric."""
    r = torch.exp(x.logr)
    pos = torch.tensor(float(tau_pos), dtype=r.dtype, device=r.device)
    tau = torch.where(x.advantages > 0, pos, torch.tensor(float(tau_neg), dtype=r.dtype, device=r.device))
    gate = torch.sigmoid(tau * (r - 1)) * (4 / tau)
    loss = torch.where(x.mask, -x.advantages * gate, torch.zeros((), dtype=r.dtype, device=r.device))
    none = torch.zeros_like(x.mask)
    return PolicyTerms(loss=loss, clipped_low=none, clipped_high=none, dual_clipped=none)


# --------------------------------------------------------------------------------------------
# The entry point
# --------------------------------------------------------------------------------------------


def policy_loss(
    kind: str,
    logp: TensorLike,
    old_logp: TensorLike | None,
    advantages: TensorLike,
    mask: TensorLike,
    *,
    turn_ids: TensorLike | None = None,
    clip_low: float | None = None,
    clip_high: float | None = None,
    ratio: str = "geo_mean",
    agg: str | None = None,
    scale: float | None = None,
    rollout_logp: TensorLike | None = None,
    **options: Any,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The policy loss ``agg(L)`` of a registered ``kind`` and its metrics.

    Shapes: ``logp`` (B, L) — log π_θ of the response tokens, differentiable; ``old_logp`` (B, L)
    — log π_old (may be None for ``sao``); ``advantages`` (B, L); ``mask`` (B, L) 0/1 action
    tokens; ``turn_ids`` (B, L) int or None (= mask runs); validated on action tokens only — any
    id on a masked position (−1 padding, NaN in a float array) is ignored;
    ``rollout_logp`` (B, L) — the sampler's log-probs, required by ``sao``. Torch or numpy.

    ``clip_low``/``clip_high`` (ε_low, ε_high) and ``agg`` default per kind (None): token_ppo and
    turn_ppo 0.2/0.2 token-mean; gspo 3e-4/4e-4 seq-mean-token-mean; sao 0.3/5.0 token-mean; cispo
    1.0/4.0 token-mean; sapo seq-mean-token-mean (its clip only sets the ``turn_clipfrac`` band).
    ``ratio`` ∈ {"geo_mean", "product"}: the turn ratio of turn_ppo (and gspo's sequence ratio);
    every kind also uses it for the turn-level metrics. ``scale``: see
    :func:`mpo_viz.losses.aggregate`. ``options``: per kind — ``dual_clip`` (c > 1, default None =
    off) for token_ppo, turn_ppo and gspo; ``token_clip`` (c > 1) for turn_ppo (default 2.0, None =
    off) and gspo (default None = off): the token band ``[1/c, c]`` on each token's own ratio (a
    token past it on the side its advantage pushes gets no gradient); ``tau_pos`` (1.0) and
    ``tau_neg`` (1.05) for sapo.

    Returns ``(loss, metrics)``: a 0-d tensor (``agg="none"``: the (B, L) loss matrix, zeros where
    masked), float64 when ``logp`` is float64 else float32; masked tokens get exactly zero
    gradient. ``metrics`` are plain floats (``METRIC_NAMES``), over action tokens / turns:

    * ``clipfrac_low``/``clipfrac_high``: share of action tokens whose clipped branch is active,
      below 1 − ε_low / above 1 + ε_high (sao: outside its band; with ``token_clip``, also the
      tokens its band holds, low / high side); ``clipfrac`` their union;
      ``dual_clipfrac``: share where the dual clip is active;
    * ``turn_clipfrac``: share of turns whose ρ_k lies outside [1 − ε_low, 1 + ε_high];
    * ``approx_kl``: ``mean(r − 1 − log r)`` over action tokens with ``r = π_θ/π_old``
      (``exp(logp − old_logp)``, log clamped to ±20): the k3 estimate of KL(π_old ‖ π_θ), the
      direction PPO implementations report, unbiased because the tokens were sampled from π_old
      (sao without ``old_logp``: against ``rollout_logp``);
    * ``ratio_mean/min/max`` of the token ratios ``exp(logr_t)``, ``turn_ratio_mean/min/max`` of ρ_k;
    * ``within_turn_shift`` = Σ_k Σ_{j∈k} (logr_{k,j} − mean_k logr)² / Σ_k n_k;
    * ``surrogate_gap`` = token-mean(A·exp(logr)) − token-mean(A·ρ_{k(t)}): the unclipped token-ratio
      surrogate minus the unclipped turn-ratio surrogate.

    Turn-level metrics always use the turns, for every kind (gspo's loss uses the sequence ratio,
    its ``turn_*`` metrics still describe turns), with ρ_k formed as ``ratio`` says. For ``sao``
    ``logr`` (hence every ratio metric) is against ``rollout_logp``. With no action token the
    fractions are 0.0 and the other metrics NaN.
    """
    spec = get_loss(kind)
    settings = _settings(spec, dict(options, clip_low=clip_low, clip_high=clip_high, ratio=ratio, agg=agg))
    scale = check_scale(scale, settings["agg"], mode_arg="agg")
    x, old, roll = _policy_inputs(spec, logp, old_logp, advantages, mask, rollout_logp, turn_ids, settings)
    terms = spec.fn(x, **{k: settings[k] for k in spec.options if k in settings})
    loss = reduce_checked(terms.loss, x.mask, settings["agg"], scale=scale, turn_segments=x.turns)
    kl_base = old if old is not None else roll
    metrics = _metrics(x, terms, torch.where(x.mask, kl_base, x.logp.new_zeros(())))
    return loss, metrics


def clip_flags(
    kind: str,
    logp: TensorLike,
    old_logp: TensorLike | None,
    advantages: TensorLike,
    mask: TensorLike,
    *,
    turn_ids: TensorLike | None = None,
    clip_low: float | None = None,
    clip_high: float | None = None,
    ratio: str = "geo_mean",
    agg: str | None = None,
    rollout_logp: TensorLike | None = None,
    **options: Any,
) -> ClipFlags:
    """Which tokens and turns the ``kind`` loss clips at ``logp`` (:class:`ClipFlags`), no gradient.

    The arguments and their checks are :func:`policy_loss`'s (``agg`` is checked and changes no
    flag: nothing is reduced, so the same options serve both calls). The token flags come from the
    kind's own function (the rule beside the loss, :class:`PolicyTerms`), so they are exactly the
    tokens ``policy_loss`` clips at the same log-probs; the turn flags follow the ``turn_clipfrac``
    metric. Shapes as :func:`policy_loss`; float64 when ``logp`` is float64, else float32.
    """
    spec = get_loss(kind)
    settings = _settings(spec, dict(options, clip_low=clip_low, clip_high=clip_high, ratio=ratio, agg=agg))
    with torch.no_grad():
        x, _, _ = _policy_inputs(
            spec, as_tensor(logp, "logp").detach(), old_logp, advantages, mask, rollout_logp, turn_ids, settings
        )
        terms = spec.fn(x, **{k: settings[k] for k in spec.options if k in settings})
        rho = unit_ratio(x.logr, x.turns, x.ratio)
        r = torch.where(x.mask, torch.exp(x.logr), torch.ones((), dtype=x.logr.dtype, device=x.logr.device))
        return ClipFlags(
            ratio=r,
            clipped=terms.clipped & x.mask,
            turn_ratio=rho,
            turn_clipped=_outside_band(rho, x),
            turn_row=x.turns.row,
        )


def _outside_band(rho: torch.Tensor, x: PolicyInputs) -> torch.Tensor:
    """(S,) bool: the turn ratios outside ``[1 − ε_low, 1 + ε_high]`` (``turn_clipfrac``, ``turn_clipped``)."""
    return (rho < 1 - x.clip_low) | (rho > 1 + x.clip_high)


def _settings(spec: LossKind, given: dict) -> dict:
    """Every option of ``spec`` checked against its declaration, None keywords given the kind's
    defaults (``clip_low``, ``clip_high``, ``agg``); an option the kind does not take is refused."""
    unknown = sorted(set(given) - {o.name for o in KEYWORDS} - set(spec.options))
    if unknown:
        raise ValueError(
            f"options: {spec.name} accepts {', '.join(spec.options) or 'none'}; found unknown option(s) "
            f"{', '.join(unknown)} (keywords of every kind: {', '.join(policy_loss.__kwdefaults__ or {})})"
        )
    out = {}
    for o in spec.keywords():
        if o.name not in given and o.default is UNSET:  # an option without a default, not given
            continue
        value = o.check(given.get(o.name, o.default))
        out[o.name] = o.default if value is None and o.name in _KIND_DEFAULTS else value
    for opt, table in spec.presets.items():
        if out.get(opt) is None:
            continue
        for key, v in table[out[opt]].items():  # a preset replaces the kind's default, never a value given
            if given.get(key) is not None and given[key] != v:
                raise OptionError(
                    opt,
                    f"{opt}={out[opt]!r} sets {key}={v!r}, found {key}={given[key]!r} as well; give one or the other",
                )
            out[key] = v
    return out


def _policy_inputs(spec: LossKind, logp, old_logp, advantages, mask, rollout_logp, turn_ids, settings: dict):
    """The checked, sanitized :class:`PolicyInputs` (and the old and rollout log-probs, or None)."""
    lp = as_tensor(logp, "logp")
    if lp.dim() != 2:
        raise ValueError(f"logp: expected a 2-D (B, L) array, found shape {tuple(lp.shape)}")
    dt = result_dtype(lp)
    lp = lp.to(dt)
    dev = lp.device
    m = check_mask(mask, device=dev)
    check_same_shape(lp, "logp", m)

    def other(x, name):
        if x is None:
            return None
        t = as_tensor(x, name, dtype=dt, device=dev).detach()
        check_same_shape(t, name, m)
        check_finite(t, name, m)
        return t

    adv = other(advantages, "advantages")
    given = {"old_logp": other(old_logp, "old_logp"), "rollout_logp": other(rollout_logp, "rollout_logp")}
    for arg in spec.logprobs:
        if given[arg] is None:
            raise ValueError(f"{arg}: the {spec.name!r} loss needs {arg} ({LOGPROB_WHAT[arg]}), found None")
    check_finite(lp.detach(), "logp", m)

    # Sanitize first: whatever sits on masked tokens (padding garbage, -inf) never enters the math,
    # and torch.where routes exactly zero gradient there.
    zero = torch.zeros((), dtype=dt, device=dev)
    lp = torch.where(m, lp, zero)
    adv = torch.where(m, adv, zero)
    base = torch.where(m, given[spec.ratio_against], zero)
    logr = (lp - base).clamp(-LOGR_CLAMP, LOGR_CLAMP)
    x = PolicyInputs(
        logp=lp,
        logr=logr,
        advantages=adv,
        mask=m,
        turns=segments(m, turn_ids),
        clip_low=float(settings["clip_low"]),
        clip_high=float(settings["clip_high"]),
        ratio=settings["ratio"],
    )
    return x, given["old_logp"], given["rollout_logp"]


def _metrics(x: PolicyInputs, terms: PolicyTerms, kl_base: torch.Tensor) -> dict[str, float]:
    with torch.no_grad():
        m = x.mask
        dt = x.logr.dtype
        nan = torch.full((), float("nan"), dtype=dt, device=m.device)
        n = m.sum()
        nf = n.clamp_min(1).to(dt)
        has = n > 0
        lr = x.logr.detach()
        r = torch.exp(lr)
        rho = unit_ratio(lr, x.turns, x.ratio)  # (S,)
        n_turns = rho.numel()
        rho_tok = x.turns.broadcast(rho, fill=0.0)
        mean_lr_tok = x.turns.broadcast(x.turns.mean(lr), fill=0.0)
        # approx_kl: mean of r − 1 − log r with r = π_θ/π_old (k3 of KL(π_old ‖ π_θ), whose samples
        # come from π_old), log r clamped to ±20 like every ratio here
        log_r = torch.where(m, (x.logp.detach() - kl_base).clamp(-LOGR_CLAMP, LOGR_CLAMP), 0.0)
        kl = torch.expm1(log_r) - log_r
        adv = x.advantages

        def frac(b):
            return b.sum().to(dt) / nf

        def masked_mean(v):
            return torch.where(has, (v * m).sum() / nf, nan)

        if n_turns:
            turn_stats = [
                _outside_band(rho, x).to(dt).mean(),
                rho.mean(),
                rho.min(),
                rho.max(),
            ]
        else:
            turn_stats = [torch.zeros((), dtype=dt, device=m.device), nan, nan, nan]
        inf = torch.full((), float("inf"), dtype=dt, device=m.device)
        vals = [
            frac(terms.clipped_low),
            frac(terms.clipped_high),
            frac(terms.clipped_low | terms.clipped_high),
            frac(terms.dual_clipped),
            turn_stats[0],
            masked_mean(kl),
            masked_mean(r),
            torch.where(has, torch.where(m, r, inf).min(), nan) if m.numel() else nan,
            torch.where(has, torch.where(m, r, -inf).max(), nan) if m.numel() else nan,
            turn_stats[1],
            turn_stats[2],
            turn_stats[3],
            masked_mean((lr - mean_lr_tok) ** 2),
            masked_mean(adv * r - adv * rho_tok),
        ]
        out = torch.stack([v.to(dt) for v in vals]).tolist()
    return dict(zip(METRIC_NAMES, out))


# --------------------------------------------------------------------------------------------
# Reference loop
# --------------------------------------------------------------------------------------------


def _ref_turns(mask_row, tid_row):
    """Lists of action-token positions per turn (from ids, or from mask runs when ids are None)."""
    turns: dict[int, list[int]] = {}
    run, prev = -1, 0
    for t, mv in enumerate(mask_row):
        if mv and not prev:
            run += 1
        prev = mv
        if mv:
            k = run if tid_row is None else int(tid_row[t])
            turns.setdefault(k, []).append(t)
    return [turns[k] for k in sorted(turns)]


def _ref_own_ratio(kind: str, a: float, lp: float, d: float, band: tuple, taus: tuple) -> tuple[float, float]:
    """``(L_t, ∂L_t/∂logπ_t)`` of one token of sao, cispo or sapo: advantage ``a``, log-prob ``lp``,
    unclamped log-ratio ``d`` against its base, ``band`` = (1 − ε_low, 1 + ε_high), ``taus`` = sapo's."""
    r = math.exp(min(max(d, -LOGR_CLAMP), LOGR_CLAMP))
    lo, hi = band
    if kind == "sao":
        return (-a * r, -a * r) if lo < r < hi else (0.0, 0.0)
    if kind == "cispo":  # the clipped weight is a constant on the gradient path
        w = min(max(r, lo), hi)
        return -a * w * lp, -a * w
    tau = taus[0] if a > 0 else taus[1]
    sig = 1 / (1 + math.exp(-tau * (r - 1)))
    inside = abs(d) <= LOGR_CLAMP  # the clamp is flat outside
    return -a * sig * 4 / tau, (-a * 4 * sig * (1 - sig) * r if inside else 0.0)


def policy_loss_reference(
    kind: str,
    logp: TensorLike,
    old_logp: TensorLike | None,
    advantages: TensorLike,
    mask: TensorLike,
    *,
    turn_ids: TensorLike | None = None,
    clip_low: float | None = None,
    clip_high: float | None = None,
    ratio: str = "geo_mean",
    rollout_logp: TensorLike | None = None,
    dual_clip: float | None = None,
    token_clip: float | None | str = "default",
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    band: str | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """A plain Python loop for the per-token loss matrix and its derivative ∂L_t/∂logπ_t.

    ``token_clip="default"`` takes the kind's own default (turn_ppo: 2.0; gspo: None); a number or
    None as :func:`policy_loss`.

    ``tau_pos``/``tau_neg``: sapo's temperatures; ``band``: sao's named band (:data:`SAO_BANDS`). In every kind each
    token's loss depends on the policy only through its own log-prob on the
    gradient path (the turn ratio is a constant there), so the gradient of ``Σ_t L_t`` is this
    diagonal. Returns two float64 numpy arrays (B, L), zeros on masked tokens. No turn-id checks.
    """
    spec = get_loss(kind)
    eps_low = spec.clip_low if clip_low is None else clip_low
    eps_high = spec.clip_high if clip_high is None else clip_high
    token_band = (
        next((o.default for o in spec.spec if o.name == "token_clip"), None)
        if isinstance(token_clip, str)
        else token_clip
    )  # "default": the kind's own
    lo, hi = SAO_BANDS[band] if band is not None else (1 - eps_low, 1 + eps_high)
    lp = np.asarray(logp, dtype=np.float64)
    base = np.asarray(rollout_logp if spec.ratio_against == "rollout_logp" else old_logp, dtype=np.float64)
    adv = np.asarray(advantages, dtype=np.float64)
    msk = np.asarray(mask) != 0
    tids = None if turn_ids is None else np.asarray(turn_ids)
    B, L = lp.shape
    loss = np.zeros((B, L))
    grad = np.zeros((B, L))
    for i in range(B):
        turns = _ref_turns(msk[i], None if tids is None else tids[i])
        if kind == "gspo":
            turns = [[t for tt in turns for t in tt]] if turns else []
        for tt in turns:
            logr = {}
            for t in tt:
                d = lp[i, t] - base[i, t]
                logr[t] = min(max(d, -LOGR_CLAMP), LOGR_CLAMP)
            tot = sum(logr.values())
            rho = math.exp(tot / len(tt)) if ratio == "geo_mean" else math.exp(min(max(tot, -LOGR_CLAMP), LOGR_CLAMP))
            for t in tt:
                a = adv[i, t]
                if kind in ("sao", "cispo", "sapo"):  # no clipped objective: one token, its own ratio
                    loss[i, t], grad[i, t] = _ref_own_ratio(
                        kind, a, lp[i, t], lp[i, t] - base[i, t], (lo, hi), (tau_pos, tau_neg)
                    )
                    continue
                if kind == "token_ppo":
                    s = math.exp(logr[t])
                    ds = s if abs(lp[i, t] - base[i, t]) <= LOGR_CLAMP else 0.0  # the clamp is flat outside
                else:  # turn_ppo, gspo: value ρ, gradient ρ·∇logπ_t
                    s, ds = rho, rho
                unclipped = -a * s
                clipped = -a * min(max(s, lo), hi)
                if clipped > unclipped:
                    val, g = clipped, 0.0
                else:
                    val, g = unclipped, -a * ds
                if dual_clip is not None and a < 0 and val > -dual_clip * a:
                    val, g = -dual_clip * a, 0.0
                if token_band is not None:  # the token band: this token's own ratio, on its advantage's side
                    r_tok = math.exp(logr[t])
                    if (a > 0 and r_tok > token_band) or (a < 0 and r_tok < 1 / token_band):
                        g = 0.0
                loss[i, t], grad[i, t] = val, g
    return loss, grad
