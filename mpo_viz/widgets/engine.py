"""Recomputing advantages fast when a slider moves, and the shared parameter controls.

:class:`AdvantageEngine` prepares each estimator's inputs once per batch (``Estimator.inputs``) and
then calls only the estimator kernel (``Estimator.fn``) with the estimator's defaults overridden
by the shared options — the same call :func:`mpo_viz.advantages.compute` makes, minus its per-turn
table, so a slider change on a 100k-token batch costs a few milliseconds. The tests check the
result equals ``compute`` exactly.

:class:`ParamControls` holds the sliders γ, λ, γ_T, λ_T, β and the menus ``within`` / ``value_at``;
each estimator receives only the options it accepts (:func:`mpo_viz.analysis.estimator_options`).
"""

from __future__ import annotations

import time

import ipywidgets as W

from mpo_viz import analysis as an

__all__ = ["AdvantageEngine", "ParamControls", "default_estimators", "PARAM_DEFAULTS"]

#: initial slider values: MAE's defaults (DESIGN §3.4). GAE shares γ and λ with MAE here.
PARAM_DEFAULTS = {"gamma": 1.0, "lam": 0.95, "turn_gamma": 1.0, "turn_lam": 0.9, "beta": 1.0,
                  "within": "intra", "value_at": "first"}

_SLIDERS = [  # option, label, min, max, step, what
    ("gamma", "γ", 0.0, 1.0, 0.01, "token discount γ (gae, mpo inside turns, reinforce_pp)"),
    ("lam", "λ", 0.0, 1.0, 0.01, "token λ (gae; mpo's within-turn signal)"),
    ("turn_gamma", "γ_T", 0.0, 1.0, 0.01, "turn discount γ_T (mpo, turn_gae)"),
    ("turn_lam", "λ_T", 0.0, 1.0, 0.01, "turn λ_T (mpo, turn_gae)"),
    ("beta", "β", 0.0, 3.0, 0.05, "mpo: weight β of the centred within-turn signal (0 = turn GAE)"),
]
_CHOICES = [
    ("within", "within", ("intra", "local", "global", "td"), "mpo's within-turn signal u"),
    ("value_at", "V(s_k) at", ("first", "last", "mean"), "which token's value is the turn value V(s_k)"),
]


def default_estimators(batch) -> list[str]:
    """Those of ``mpo``, ``gae``, ``grpo`` that ``batch`` supports (mpo and gae need values)."""
    from mpo_viz import advantages as adv

    return [n for n in ("mpo", "gae", "grpo") if not adv.missing(batch, n)]


class AdvantageEngine:
    """Advantages and returns of several estimators on one batch, recomputed for new options.

    ``compute(options)`` → ``{name: (advantages, returns)}`` with ``(B, L)`` tensors, equal to
    ``mpo_viz.advantages.compute(batch, name, **estimator_options(name, options))``.
    """

    def __init__(self, batch, estimators):
        from mpo_viz import advantages as adv

        if isinstance(estimators, str):
            estimators = [e.strip() for e in estimators.split(",") if e.strip()]
        if not estimators:
            raise ValueError("estimators: expected at least one estimator name, found none")
        self.batch = batch
        self.names = list(estimators)
        self._est = {}
        self._inputs = {}
        for name in self.names:
            est = adv.get(name)  # unknown names raise, listing the available ones
            lacks = adv.missing(batch, name)
            if lacks:
                raise ValueError(f"estimators: {name!r} needs what this batch lacks ({', '.join(lacks)}); "
                                 f"this batch supports {default_estimators(batch) or 'none of mpo, gae, grpo'}")
            self._est[name] = est
        self.timings: dict = {}

    def _inputs_of(self, name):
        if name not in self._inputs:
            self._inputs[name] = self._est[name].inputs(self.batch)
        return self._inputs[name]

    def options_for(self, name: str, options: dict) -> dict:
        """Every option estimator ``name`` runs with: its defaults, overridden by those it accepts."""
        return {**self._est[name].options, **an.estimator_options(name, options)}

    def compute(self, options: dict) -> dict:
        t0 = time.perf_counter()
        out = {}
        for name in self.names:
            args, kwargs = self._inputs_of(name)
            out[name] = self._est[name].fn(*args, **kwargs, **self.options_for(name, options))
        self.timings["compute"] = time.perf_counter() - t0
        return out


class ParamControls(W.VBox):
    """Sliders γ, λ, γ_T, λ_T, β and menus ``within`` / ``value_at``, shared by the estimators.

    ``options`` (dict) is the current setting; ``on_change(callback)`` calls ``callback(options)``
    after any control changes; ``set(**options)`` sets several controls and fires once.
    Sliders update on release (``continuous_update=False``) so a drag recomputes once.
    """

    def __init__(self, **initial):
        unknown = [k for k in initial if k not in PARAM_DEFAULTS]
        if unknown:
            raise ValueError(f"options: unknown {', '.join(map(repr, unknown))}; valid: {', '.join(PARAM_DEFAULTS)}")
        vals = {**PARAM_DEFAULTS, **{k: v for k, v in initial.items() if v is not None}}
        self.controls: dict[str, W.ValueWidget] = {}
        style = {"description_width": "38px"}
        for key, label, lo, hi, step, what in _SLIDERS:
            self.controls[key] = W.FloatSlider(
                value=float(vals[key]), min=lo, max=hi, step=step, description=label, tooltip=what,
                continuous_update=False, readout_format=".2f", style=style,
                layout=W.Layout(width="250px"),
            )
        for key, label, choices, what in _CHOICES:
            if vals[key] not in choices:
                raise ValueError(f"{key}: expected one of {choices}, found {vals[key]!r}")
            self.controls[key] = W.Dropdown(options=choices, value=vals[key], description=label, tooltip=what,
                                            style={"description_width": "62px"}, layout=W.Layout(width="170px"))
        self._callbacks: list = []
        self._muted = False
        for c in self.controls.values():
            c.observe(self._changed, names="value")
        row1 = W.HBox([self.controls[k] for k in ("gamma", "lam", "beta")])
        row2 = W.HBox([self.controls[k] for k in ("turn_gamma", "turn_lam", "within", "value_at")])
        super().__init__([row1, row2])
        self.add_class("mpo-params")

    @property
    def options(self) -> dict:
        return {k: (float(c.value) if isinstance(c, W.FloatSlider) else c.value) for k, c in self.controls.items()}

    def on_change(self, callback) -> None:
        self._callbacks.append(callback)

    def _changed(self, _change=None) -> None:
        if self._muted:
            return
        opts = self.options
        for cb in self._callbacks:
            cb(opts)

    def set(self, **options) -> None:
        unknown = [k for k in options if k not in self.controls]
        if unknown:
            raise ValueError(f"options: unknown {', '.join(map(repr, unknown))}; valid: {', '.join(self.controls)}")
        self._muted = True
        try:
            for k, v in options.items():
                self.controls[k].value = v
        finally:
            self._muted = False
        self._changed()
