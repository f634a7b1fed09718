"""The estimators' one registry: names, what each needs from a batch, its typed options, and
``compute(batch, name, **options)`` on a TrajectoryBatch.

**Options are declared here once.** Each estimator's keyword-only options are
:class:`~mpo_viz.options.Option` objects (the one option type of the package) — name, kind (``float``, ``int``,
``bool``, ``choice``, ``str``), bounds or choices, a
one-line doc, a display label — and the default is the one in the estimator function's signature
(checked at registration). Everything else is derived from this declaration: the ``mpo-viz
advantages``/``report`` flags (:mod:`mpo_viz.cli.advantages`), the explorer's sliders and menus
(:class:`mpo_viz.widgets.ParamControls`), the report's and the annotator's shared ``options``, and
:func:`compute`'s checks (an unknown option, a value of the wrong kind or out of bounds raise
:class:`~mpo_viz.checks.OptionError`, a ``ValueError`` whose ``option`` attribute names it).

The API:

* :func:`register_estimator` ``(name, *, needs=(), inputs=None, bound=(), options=None)`` — a decorator;
* :func:`available_estimators` ``() -> list[str]``; :func:`get_estimator` ``(name) -> Estimator``;
* :func:`estimator_options` ``(name) -> tuple[Option, ...]``, defaults filled in;
* :func:`vocabulary` ``(names=None) -> dict[str, Option]``: every option of these estimators (all
  registered ones by default) by name, the first declaration of each (a name means one thing:
  :func:`register_estimator` refuses a redeclaration of another kind or bounds);
* :func:`takers` ``(option, names=None) -> list[str]``: the estimators that take an option;
* :func:`accepted_options` ``(name, shared) -> dict``: the subset of shared options that estimator
  ``name`` takes; :func:`split_options` ``(names, shared) -> {name: dict}``, refusing an option
  none of them takes;
* :func:`bind` ``(batch, name) -> Bound``: the estimator with the batch's inputs prepared once;
  ``Bound.resolve(**options) -> dict`` (checked, defaults filled in) and
  ``Bound.run(**options) -> (adv, ret, used)`` — the path :func:`compute` and the widgets share;
* :data:`DEFAULT_ESTIMATORS` (mpo, gae, grpo), :func:`default_estimators` ``(batch)`` (those the
  batch supports), :func:`is_group_estimator` ``(name)``, :func:`parse_names` ``("mpo,gae")``;
* the traits the views read: :func:`multiscale_estimator` ``(names)`` (whose within-turn part gets a
  channel of its own) and :func:`returns_source` ``(names)`` (whose returns are the critic's
  targets), from ``register_estimator(..., multiscale=, critic_returns=)``.

Register your own (it then shows up in ``mpo-viz advantages --help`` and in the explorer)::

    @register_estimator("my_est", needs=("values",),
              options=[Option("scale", kind="float", low=0.0, high=2.0, doc="multiplies V")])
    def my_est(batch, *, scale=1.0):
        '''First line: the estimator's ``doc``.'''
        return adv, ret          # (B, L) tensors

Without ``options=`` each keyword-only option takes the registered declaration of its name (γ, λ, β,
...) or is declared from its default's type (a float, an int, a bool or a string; anything else is
``"any"``: accepted from Python, not shown on the command line or in the explorer), with no bounds.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

import pandas as pd
import torch

from mpo_viz.advantages import group as G
from mpo_viz.advantages import token as T
from mpo_viz.advantages.unrewarded import warn_unrewarded
from mpo_viz.checks import OptionError
from mpo_viz.data.trajectory import TrajectoryBatch
from mpo_viz.options import UNSET, Option

__all__ = [
    "Option",
    "Estimator",
    "Bound",
    "AdvantageResult",
    "register_estimator",
    "available_estimators",
    "get_estimator",
    "estimator_options",
    "vocabulary",
    "accepted_options",
    "split_options",
    "takers",
    "bind",
    "missing",
    "compute",
    "is_group_estimator",
    "multiscale_estimator",
    "returns_source",
    "critic_returns_estimators",
    "default_estimators",
    "parse_names",
    "DEFAULT_ESTIMATORS",
]

#: the estimators shown when none are named (each where the batch supports it)
DEFAULT_ESTIMATORS = ("mpo", "gae", "grpo")


def _kind_of(default) -> str | None:
    if isinstance(default, bool):
        return "bool"
    if isinstance(default, int):
        return "int"
    if isinstance(default, float):
        return "float"
    if isinstance(default, str):
        return "str"
    return None


# ----------------------------------------------------------------------------- the shared vocabulary
# Every option of the built-in estimators, once. Defaults come from each function's signature.

GAMMA = Option(
    "gamma",
    kind="float",
    low=0.0,
    high=1.0,
    label="γ",
    doc="token discount γ (gae, vapo, reinforce_pp; mae, turn_gae and bilevel_gae inside turns)",
)
LAM = Option(
    "lam",
    kind="float",
    low=0.0,
    high=1.0,
    label="λ",
    doc="token λ (gae; mae's within-turn signal; bilevel_gae at both levels)",
)
TURN_GAMMA = Option(
    "turn_gamma",
    kind="float",
    low=0.0,
    high=1.0,
    label="γ_T",
    doc="turn discount γ_T, from a turn's last token to the next turn's first (mae, turn_gae); "
    "bilevel_gae: from one turn's last token to the next one's (RAGEN's high_level_gamma)",
)
TURN_LAM = Option("turn_lam", kind="float", low=0.0, high=1.0, label="λ_T", doc="turn λ_T (mae, turn_gae)")
BETA = Option(
    "beta",
    kind="float",
    low=0.0,
    span=(0.0, 3.0),
    label="β",
    doc="weight β of mae's centred within-turn signal (0 = turn GAE)",
)
WITHIN = Option(
    "within",
    kind="choice",
    choices=("intra", "local", "global", "td", "baseline"),
    label="within",
    doc="mae's within-turn signal u (baseline: V(s_k) − γ^j·V_t, not centred; unbiased with exact values, "
    "does not keep the turn mean)",
)
VALUE_AT = Option(
    "value_at",
    kind="choice",
    choices=("first", "last", "mean"),
    label="V(s_k) at",
    doc="which token's value is the turn value V(s_k)",
)
CRITIC_TARGET = Option(
    "critic_target",
    kind="choice",
    choices=("mc", "turn"),
    label="target",
    advanced=True,
    doc="mae's returns: Monte-Carlo (mc) or the turn return broadcast (turn: flat inside "
    "turns, it switches the within-turn signal off; warns once)",
)
WHITEN = Option(
    "whiten", kind="bool", label="whiten", advanced=True, doc="whiten the advantages over the batch's action tokens"
)
LAM_RULE = Option(
    "lam_rule",
    kind="choice",
    choices=T.LAM_RULES,
    label="λ rule",
    doc="λ per trajectory: fixed (lam, or turn_lam for the turn λ_T), vapo (1 − 1/(α·ℓ)), "
    "relative_position (q^(1/(ℓ−1))); ℓ = the row's action tokens (gae) or turns (turn_gae, "
    "mpo/mae's λ_T)",
)
ALPHA = Option(
    "alpha",
    kind="float",
    low=0.0,
    low_open=True,
    span=(0.01, 2.0),
    label="α",
    doc="length-adaptive λ = 1 − 1/(α·ℓ) (vapo; lam_rule='vapo'; SAO: gae with α = 1.5)",
)
Q = Option(
    "q",
    kind="float",
    low=0.0,
    high=1.0,
    low_open=True,
    label="q",
    doc="lam_rule='relative_position': λ = q^(1/(ℓ−1)), the share of a final reward left at the first step",
)
EPS = Option(
    "eps",
    kind="float",
    low=0.0,
    label="ε",
    advanced=True,
    doc="added to the group std (grpo, gigpo, empg; mt_grpo's turn_baseline='index')",
)
NORM_BY_STD = Option(
    "norm_by_std",
    kind="bool",
    label="÷ std",
    advanced=True,
    doc="grpo, empg: divide by the group std (False = Dr. GRPO)",
)
OMEGA = Option("omega", kind="float", span=(0.0, 3.0), label="ω", doc="gigpo: weight ω of the step-level advantage")
STEP_GAMMA = Option(
    "step_gamma", kind="float", low=0.0, high=1.0, label="γ_step", doc="gigpo: discount of the step return"
)
NORM = Option(
    "norm",
    kind="choice",
    choices=G.GIGPO_NORMS,
    label="norm",
    advanced=True,
    doc="gigpo: which levels divide by their std — mean_std_norm both, mean_norm neither (verl-agent's "
    "gigpo.mode names; mean_norm is its config default), step_mean_norm the episode level only",
)
EPISODE_STATS = Option(
    "episode_stats",
    kind="choice",
    choices=G.GIGPO_EPISODE_STATS,
    label="episode stats",
    advanced=True,
    doc="gigpo: the episode-level mean and std over the group's turns (steps: a trajectory "
    "counts once per turn, as verl-agent) or its trajectories (GRPO, the paper's Eq. 3)",
)
TURN_COEF = Option(
    "turn_coef",
    kind="float",
    low=0.0,
    span=(0.0, 2.0),
    label="λ_turn",
    doc="mt_grpo: weight λ of the turn-reward advantage (MT-GRPO's turn_advantage_coef)",
)
TURN_BASELINE = Option(
    "turn_baseline",
    kind="choice",
    choices=G.TURN_BASELINES,
    label="turn baseline",
    doc="mt_grpo: loo (leave-one-out per turn index over the whole group, a missing turn "
    "counting 0: unbiased when the policy decides when to stop), index (MT-GRPO's code: "
    "the turn reward normalised over the whole group, a one-turn row gets GRPO of its "
    "score) or index_present (the turn reward normalised over the rows that have turn k)",
)
ENTROPY_K = Option(
    "entropy_k",
    kind="float",
    low=0.0,
    span=(0.0, 3.0),
    label="k",
    doc="empg: step scale g = exp(−k·Ĥ), divided by its batch mean",
)
CLARITY_K = Option(
    "clarity_k",
    kind="float",
    low=0.0,
    span=(0.0, 3.0),
    label="k_f",
    doc="empg: future clarity f = exp(−k_f·Ĥ) of the next step",
)
ZETA = Option(
    "zeta", kind="float", low=0.0, span=(0.0, 1.0), label="ζ", doc="empg: weight ζ of the future-clarity bonus"
)
CENTER = Option(
    "center",
    kind="bool",
    label="centre",
    advanced=True,
    doc="empg: subtract the batch mean of the modulated step advantages",
)
TURN_ENDS = Option(
    "turn_ends",
    kind="choice",
    choices=T.TURN_ENDS,
    label="turn ends",
    advanced=True,
    doc="bilevel_gae: the turns' last tokens (turns) or RAGEN's rule, every action token with a "
    "non-zero reward and the row's last (rewards)",
)

_VOCAB: dict[str, Option] = {
    o.name: o
    for o in (
        GAMMA,
        LAM,
        TURN_GAMMA,
        TURN_LAM,
        BETA,
        WITHIN,
        VALUE_AT,
        CRITIC_TARGET,
        WHITEN,
        LAM_RULE,
        ALPHA,
        Q,
        EPS,
        NORM_BY_STD,
        OMEGA,
        STEP_GAMMA,
        NORM,
        EPISODE_STATS,
        TURN_COEF,
        TURN_BASELINE,
        ENTROPY_K,
        CLARITY_K,
        ZETA,
        CENTER,
        TURN_ENDS,
    )
}

# What each kind of need means and how to check it on a batch.
NEED_TEXT = {
    "values": "critic values per token (field 'values')",
    "groups": "group ids (field 'group_id') so trajectories of the same task can be compared",
    "turns": "turn structure (field 'turn_ids', or derived from loss_mask runs)",
    "prompt_ids": "prompt token ids (field 'prompt_ids')",
    "response_ids": "response token ids (field 'response_ids')",
    "entropy": "the policy's per-token entropy (field 'entropy')",
}

#: needs that are per-token fields every row must carry (checked row by row by :func:`bind`)
_ROW_FIELDS = {"values": "critic values", "entropy": "per-token entropies"}


def _has(batch: TrajectoryBatch, need: str) -> bool:
    if need == "values":
        return batch.has("values")
    if need == "groups":
        return batch.has("group_id")
    if need == "turns":
        return batch.has("loss_mask") or batch.has("turn_ids")
    return batch.has(need)


@dataclass(frozen=True)
class Estimator:
    """A registered estimator.

    Attributes:
        name: the registry name.
        fn: the callable doing the work, called as ``fn(*inputs(batch)[0], **inputs(batch)[1], **options)``.
        inputs: maps a batch to the ``(args, kwargs)`` taken from it (tensors, ids, ...).
        needs: what the batch must carry (see :data:`NEED_TEXT`).
        spec: the declared options (:class:`Option`, defaults filled in), in signature order.
        doc: the first line of ``fn``'s docstring.
        multiscale: its advantage is a turn-level part plus a centred within-turn part (MAE): the
            views show the within-turn part (``A − turn mean``) as a channel of its own.
        critic_returns: its returns are targets for the critic (value-based estimators): the views
            draw them beside the values and the report measures the critic against them
            (:func:`returns_source`).
    """

    name: str
    fn: Callable
    inputs: Callable
    needs: tuple[str, ...]
    spec: tuple[Option, ...]
    doc: str = ""
    multiscale: bool = False
    critic_returns: bool = False

    @property
    def options(self) -> dict:
        """Option name -> default."""
        return {o.name: o.default for o in self.spec}


_REGISTRY: dict[str, Estimator] = {}


def _declare(name: str, fn: Callable, bound: tuple[str, ...], declared) -> tuple[Option, ...]:
    """The options of ``fn`` (keyword-only, minus ``bound``) as :class:`Option` s with defaults."""
    given = {}
    for o in declared or ():
        if not isinstance(o, Option):
            raise ValueError(f"options: estimator {name!r}: expected Option objects, found {o!r}")
        given[o.name] = o
    params = {
        p.name: p
        for p in inspect.signature(fn).parameters.values()
        if p.kind == inspect.Parameter.KEYWORD_ONLY and p.name not in bound
    }
    extra = [n for n in given if n not in params]
    if extra:
        raise ValueError(
            f"options: estimator {name!r} declares {', '.join(map(repr, extra))}, which "
            f"{fn.__qualname__} does not take as a keyword-only argument"
        )
    out = []
    for pname, p in params.items():
        if p.default is inspect.Parameter.empty:
            raise ValueError(f"options: estimator {name!r}: option {pname!r} of {fn.__qualname__} has no default")
        o = given.get(pname) or _VOCAB.get(pname)
        if o is None:
            # e.g. a None default: "any", callable from Python, not shown on the CLI or the sliders
            o = Option(pname, kind=_kind_of(p.default) or "any")
        if o.default is not UNSET and o.default != p.default:
            raise ValueError(
                f"options: estimator {name!r}: option {pname!r} declares default {o.default!r} but "
                f"{fn.__qualname__} has {p.default!r}; the signature's default is the one"
            )
        known = _VOCAB.get(pname)
        if known is not None and not known.same_meaning(o):
            raise ValueError(
                f"options: estimator {name!r}: option {pname!r} ({o.kind} {o.bounds_text()}) means "
                f"something else than the registered {pname!r} ({known.kind} {known.bounds_text()}); "
                "one name, one meaning: pick another name"
            )
        out.append(replace(o, default=p.default))
    return tuple(out)


def register_estimator(
    name: str,
    *,
    needs: tuple[str, ...] = (),
    inputs: Callable | None = None,
    bound: tuple[str, ...] = (),
    options: Iterable[Option] | None = None,
    multiscale: bool = False,
    critic_returns: bool | None = None,
):
    """Decorator registering ``fn`` under ``name``; raises ``ValueError`` if the name is taken.

    Without ``inputs`` the function is called as ``fn(batch, **options)``. With ``inputs``, a
    callable ``batch -> (args, kwargs)``, it is called as ``fn(*args, **kwargs, **options)``;
    ``bound`` lists the keyword names ``inputs`` supplies (they are not options).

    ``options``: :class:`Option` declarations of ``fn``'s keyword-only options (defaults from the
    signature). An undeclared option takes the registered declaration of its name (γ, λ, β, ...)
    or, for a new name, one inferred from its default's type.

    Traits the views read (:class:`Estimator`): ``multiscale`` (a centred within-turn part, shown as
    a channel of its own), ``critic_returns`` (its returns are critic targets; default: when it
    needs ``values``).
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"name: expected a non-empty string, found {name!r}")

    def deco(fn: Callable) -> Callable:
        if name in _REGISTRY:
            raise ValueError(
                f"estimator {name!r} is already registered (by {_REGISTRY[name].fn.__module__}."
                f"{_REGISTRY[name].fn.__qualname__}); pick another name"
            )
        spec = _declare(name, fn, tuple(bound), options)
        get_inputs: Callable = inputs if inputs is not None else (lambda b: ((b,), {}))
        doc = (inspect.getdoc(fn) or "").split("\n", 1)[0]
        returns = "values" in needs if critic_returns is None else bool(critic_returns)
        _REGISTRY[name] = Estimator(name, fn, get_inputs, tuple(needs), spec, doc, bool(multiscale), returns)
        for o in spec:
            _VOCAB.setdefault(o.name, replace(o, default=UNSET))
        return fn

    return deco


def available_estimators() -> list[str]:
    """Registered estimator names, sorted."""
    return sorted(_REGISTRY)


def get_estimator(name: str) -> Estimator:
    """The :class:`Estimator` registered as ``name`` (``ValueError`` listing the names if unknown)."""
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise ValueError(f"name: unknown estimator {name!r}; available: {', '.join(available_estimators())}") from None


def estimator_options(name: str) -> tuple[Option, ...]:
    """The declared options of estimator ``name``, defaults filled in."""
    return get_estimator(name).spec


def vocabulary(names: Iterable[str] | None = None) -> dict[str, Option]:
    """Every option of ``names`` (default: every registered estimator) by option name, in order of
    declaration; each carries the default of the first of ``names`` that takes it."""
    out: dict[str, Option] = {}
    for n in available_estimators() if names is None else names:
        for o in get_estimator(n).spec:
            out.setdefault(o.name, o)
    order = {k: i for i, k in enumerate(_VOCAB)}  # declaration order: γ, λ, γ_T, ... then users' options
    return dict(sorted(out.items(), key=lambda kv: order[kv[0]]))


def takers(option: str, names: Iterable[str] | None = None) -> list[str]:
    """The estimators among ``names`` (default: all registered) that take ``option``."""
    return [n for n in (available_estimators() if names is None else names) if option in get_estimator(n).options]


def accepted_options(name: str, shared: dict) -> dict:
    """The subset of ``shared`` that estimator ``name`` takes, ``None`` values dropped (the shared
    options of the CLI, the report and the sliders: each estimator takes the ones it accepts)."""
    accepted = get_estimator(name).options
    return {k: v for k, v in shared.items() if k in accepted and v is not None}


def split_options(names: Iterable[str], shared: dict) -> dict[str, dict]:
    """``{name: accepted_options(name, shared)}``; an option (not None) that none of ``names``
    takes raises :class:`OptionError` naming it and the estimators that would."""
    names = list(names)
    for k, v in shared.items():
        if v is not None and not takers(k, names):
            who = takers(k) if k in _VOCAB else []
            raise OptionError(
                k,
                f"none of the estimators {', '.join(names)} takes this option"
                + (
                    f" ({', '.join(who)} {'does' if len(who) == 1 else 'do'})"
                    if who
                    else "; no registered estimator does"
                ),
            )
    return {n: accepted_options(n, shared) for n in names}


def multiscale_estimator(names: Iterable[str]) -> str | None:
    """The first of ``names`` (in their order) whose advantage has a within-turn part of its own
    (:attr:`Estimator.multiscale`: mpo); names not registered are skipped."""
    return next((n for n in names if n in _REGISTRY and _REGISTRY[n].multiscale), None)


def critic_returns_estimators() -> list[str]:
    """The estimators whose returns are critic targets (:attr:`Estimator.critic_returns`), in order
    of preference: registration order (mpo, gae, turn_gae, vapo, bilevel_gae, then your own)."""
    return [n for n, e in _REGISTRY.items() if e.critic_returns]


def returns_source(names: Iterable[str]) -> str | None:
    """The estimator among ``names`` whose returns the views draw beside the values and the report
    measures the critic against: the first of :func:`critic_returns_estimators` among them; None
    when there is none."""
    names = set(names)
    return next((n for n in critic_returns_estimators() if n in names), None)


def is_group_estimator(name: str) -> bool:
    """True when estimator ``name`` compares trajectories of a group (it needs ``groups``)."""
    return "groups" in get_estimator(name).needs


def default_estimators(batch: TrajectoryBatch) -> list[str]:
    """Those of :data:`DEFAULT_ESTIMATORS` that ``batch`` supports (mpo and gae need values)."""
    return [n for n in DEFAULT_ESTIMATORS if not missing(batch, n)]


def parse_names(names) -> tuple[str, ...]:
    """``"mpo, gae"`` or a sequence of names -> a tuple of registered names; :class:`OptionError`
    (option ``estimators``) for an empty list or an unknown name."""
    if isinstance(names, str):
        names = names.split(",")
    out = tuple(str(n).strip() for n in names if str(n).strip())
    if not out:
        raise OptionError("estimators", "expected at least one estimator name, found none")
    for n in out:
        if n not in _REGISTRY:
            hint = f" (names are lower case: {n.lower()!r})" if n.lower() in _REGISTRY else ""
            raise OptionError(
                "estimators", f"unknown estimator {n!r}{hint}; available: {', '.join(available_estimators())}"
            )
    return out


def _check_batch(batch: TrajectoryBatch) -> None:
    if not isinstance(batch, TrajectoryBatch):
        raise ValueError(
            f"batch: expected a TrajectoryBatch (mv.load(...) or TrajectoryBatch.from_rows), found "
            f"{type(batch).__name__}; on plain (B, L) tensors call the estimator function itself, "
            f"e.g. mpo_viz.advantages.mae(rewards, values, mask, turn_ids=...)"
        )


def missing(batch: TrajectoryBatch, name: str) -> list[str]:
    """What the batch lacks for estimator ``name`` (empty when it can run)."""
    _check_batch(batch)
    return [n for n in get_estimator(name).needs if not _has(batch, n)]


class Bound:
    """Estimator ``name`` bound to a batch: the batch is checked and its inputs are prepared once;
    :meth:`run` checks the options and calls the estimator. :func:`compute` is ``bind`` + ``run`` +
    the per-turn table; the widgets keep a ``Bound`` per estimator and call ``run`` when a slider
    moves."""

    def __init__(self, batch: TrajectoryBatch, name: str):
        est = get_estimator(name)
        lacks = missing(batch, name)
        if lacks:
            what = "; ".join(f"{n}: {NEED_TEXT.get(n, f'field {n!r}')}" for n in lacks)
            alt = [e for e in available_estimators() if not [n for n in _REGISTRY[e].needs if not _has(batch, n)]]
            raise ValueError(
                f"estimator {name!r} needs what this batch lacks — {what}. "
                f"Estimators this batch supports: {', '.join(alt) or 'none'}"
            )
        for need in (n for n in est.needs if n in _ROW_FIELDS):
            lacking = [i for i, v in enumerate(batch.field(need)) if v is None]
            if lacking:
                i = lacking[0]
                raise ValueError(
                    f"{need}: row {i} (traj_id {batch.traj_ids[i]!r}) has no {_ROW_FIELDS[need]}; estimator "
                    f"{name!r} needs them on every row ({len(lacking)} rows lack them)"
                )
        self.name = name
        self.estimator = est
        self.batch = batch
        self._spec = {o.name: o for o in est.spec}
        self._inputs: tuple[tuple, dict] | None = None

    def inputs(self) -> tuple[tuple, dict]:
        """The ``(args, kwargs)`` taken from the batch (prepared on the first call)."""
        if self._inputs is None:
            self._inputs = self.estimator.inputs(self.batch)
        return self._inputs

    def resolve(self, **options) -> dict:
        """Every option the estimator runs with: its defaults, overridden by ``options`` (each
        checked against its declaration; an unknown one raises :class:`OptionError`)."""
        unknown = [o for o in options if o not in self._spec]
        if unknown:
            raise OptionError(
                "options",
                f"estimator {self.name!r} has no option {', '.join(map(repr, unknown))}; "
                f"valid options: {', '.join(self._spec) or 'none'}",
            )
        for k, v in options.items():
            self._spec[k].check(v)
        return {**self.estimator.options, **options}

    def run(self, **options):
        """``(advantages, returns, used_options)`` for these options (see :meth:`resolve`)."""
        used = self.resolve(**options)
        args, kwargs = self.inputs()
        adv, ret = self.estimator.fn(*args, **kwargs, **used)
        return adv, ret, used


def bind(batch: TrajectoryBatch, name: str) -> Bound:
    """:class:`Bound`: estimator ``name`` with ``batch`` checked and its inputs prepared once."""
    return Bound(batch, name)


@dataclass
class AdvantageResult:
    """What :func:`compute` returns.

    Attributes:
        name: the estimator's registry name.
        advantages: float32/float64 tensor ``(B, L)``, 0 on masked positions.
        returns: critic targets ``(B, L)`` (the estimator's ``returns``, docs/concepts.md §4), 0 on
            masked positions.
        turns: the per-turn table (``batch.turns``, columns in docs/concepts.md) with this
            estimator's ``adv_<name>`` and ``ret_<name>``: the mean advantage over the turn's action
            tokens *before whitening* — A^T_k for mae and turn_gae whatever ``whiten`` is, in the
            units of ``reward`` and ``value_first``; with ``whiten=True`` the token ``advantages``
            are whitened and a turn's mean of them is ``(adv_<name> − μ)/σ``, μ and σ the mean and
            std of the unwhitened advantages over the batch's action tokens — and the return at the
            turn's first action token.
        options: every option used, defaults filled in.
        wall_time_s: seconds for the whole call.
        timings: seconds per phase: ``inputs`` (batch → tensors), ``estimate``, ``turn_table``
            (with ``whiten=True`` it includes a second, unwhitened estimate for ``turns``).
        traj_ids: the batch's trajectory ids, row order.
    """

    name: str
    advantages: torch.Tensor
    returns: torch.Tensor
    turns: pd.DataFrame
    options: dict
    wall_time_s: float
    timings: dict = field(default_factory=dict)
    traj_ids: list = field(default_factory=list)

    def attach(self, batch: TrajectoryBatch, *, advantages: str = "advantages", returns: str = "returns"):
        """``batch.with_token_fields`` with these advantages and returns under the given names."""
        return batch.with_token_fields(**{advantages: self.advantages, returns: self.returns})

    def __repr__(self) -> str:
        B, L = tuple(self.advantages.shape)
        return (
            f"AdvantageResult({self.name!r}, B={B}, L={L}, turns={len(self.turns)}, "
            f"wall_time_s={self.wall_time_s:.4f}, options={self.options})"
        )


def compute(batch: TrajectoryBatch, name: str, **options) -> AdvantageResult:
    """Run estimator ``name`` on a TrajectoryBatch; returns an :class:`AdvantageResult`.

    Checks up front that the batch carries what the estimator needs (``ValueError`` naming what is
    missing) and every option against its declaration (:class:`OptionError`: an unknown option
    lists the valid ones; a value of the wrong kind or out of bounds names the expected range). A
    group estimator warns when rows have no reward (:mod:`mpo_viz.advantages.unrewarded`).
    """
    t0 = time.perf_counter()
    b = bind(batch, name)
    b.resolve(**options)  # bad options fail before the inputs are prepared
    b.inputs()
    if is_group_estimator(name):  # a row without a reward would silently score 0 against its group
        warn_unrewarded(batch, name)
    t1 = time.perf_counter()
    adv, ret, used = b.run(**options)
    t2 = time.perf_counter()
    raw = adv
    if used.get("whiten"):  # the per-turn table keeps the estimator's own units (A^T_k), not whitened ones
        raw, _, _ = b.run(**{**options, "whiten": False})
    turns = batch.turns(advantages={name: raw}, returns={name: ret})
    t3 = time.perf_counter()
    return AdvantageResult(
        name=name,
        advantages=adv,
        returns=ret,
        turns=turns,
        options=used,
        wall_time_s=t3 - t0,
        timings={"inputs": t1 - t0, "estimate": t2 - t1, "turn_table": t3 - t2},
        traj_ids=list(batch.traj_ids),
    )


# ----------------------------------------------------------------------------- built-in estimators


def _critic_inputs(b):
    return (b.token_rewards, b.values, b.mask), {"bootstrap_value": b.bootstrap_value}


def _turn_inputs(b):
    return (b.token_rewards, b.values, b.mask), {"bootstrap_value": b.bootstrap_value, "turn_ids": b.turn_ids}


def _group_inputs(b):
    return (b.token_rewards, b.mask, b.group_ids), {}


def _turn_group_inputs(b):
    return (b.token_rewards, b.mask, b.group_ids), {"turn_ids": b.turn_ids}


def _empg_inputs(b):
    return (b.token_rewards, b.mask, b.group_ids), {"turn_ids": b.turn_ids, "entropy": b.padded("entropy")}


def _gigpo_inputs(b):
    return (b.token_rewards, b.mask, b.group_ids), {
        "turn_ids": b.turn_ids,
        "prompt_ids": b.field("prompt_ids"),
        "response_ids": b.field("response_ids"),
    }


_TURN_BOUND = ("bootstrap_value", "turn_ids")
# The built-ins take their option declarations from the vocabulary above by name. The order of
# registration is the order of preference of returns_source: mpo, mae, gae, turn_gae, vapo, bilevel_gae.
register_estimator("mpo", needs=("values", "turns"), inputs=_turn_inputs, bound=_TURN_BOUND, multiscale=True)(T.mae)
register_estimator("gae", needs=("values",), inputs=_critic_inputs, bound=("bootstrap_value",))(T.gae)
register_estimator("turn_gae", needs=("values", "turns"), inputs=_turn_inputs, bound=_TURN_BOUND)(T.turn_gae)
register_estimator("vapo", needs=("values",), inputs=_critic_inputs, bound=("bootstrap_value",))(T.vapo)
register_estimator("bilevel_gae", needs=("values", "turns"), inputs=_turn_inputs, bound=_TURN_BOUND)(T.bilevel_gae)
register_estimator("grpo", needs=("groups",), inputs=_group_inputs)(G.grpo)
register_estimator("drgrpo", needs=("groups",), inputs=_group_inputs)(G.drgrpo)
register_estimator("rloo", needs=("groups",), inputs=_group_inputs)(G.rloo)
register_estimator("reinforce_pp", inputs=lambda b: ((b.token_rewards, b.mask), {}))(G.reinforce_pp)
register_estimator("reinforce_pp_baseline", needs=("groups",), inputs=_group_inputs)(G.reinforce_pp_baseline)
register_estimator(
    "gigpo",
    needs=("groups", "turns", "prompt_ids", "response_ids"),
    inputs=_gigpo_inputs,
    bound=("turn_ids", "prompt_ids", "response_ids"),
)(G.gigpo)
register_estimator("mt_grpo", needs=("groups", "turns"), inputs=_turn_group_inputs, bound=("turn_ids",))(G.mt_grpo)
register_estimator("empg", needs=("groups", "turns", "entropy"), inputs=_empg_inputs, bound=("turn_ids", "entropy"))(
    G.empg
)
