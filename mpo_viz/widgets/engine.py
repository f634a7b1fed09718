"""Recomputing advantages fast when a slider moves, and the shared parameter controls.

:class:`AdvantageEngine` binds each estimator to the batch once (:func:`mpo_viz.advantages.bind`:
the batch checked, its inputs prepared) and on each change calls ``Bound.run`` — the path
:func:`mpo_viz.advantages.compute` takes, with its option checks, minus the per-turn table — so a
slider change on a 100k-token batch costs a few milliseconds. The tests check the result equals
``compute`` exactly.

:class:`ParamControls` derives its controls from the estimators' declared options
(:func:`mpo_viz.advantages.vocabulary`): a slider for a bounded number, a text box for an
unbounded one, a menu for a choice, a checkbox for a flag; ``advanced`` options sit folded under
"more options". Each estimator receives only the options it accepts
(:func:`mpo_viz.advantages.estimator_options`).

One set of defaults: a control is shared only by estimators for which the option means the same
thing and has the same default (γ of mpo, gae and reinforce_pp: 1). Where defaults differ (λ: 0.95
for mpo's within-turn signal, 1 for gae) each group of estimators gets its own control, labelled
with them ("λ · gae") and keyed ``"lam@gae"`` in :attr:`ParamControls.options`; so every estimator
starts from, and runs with, its own defaults, exactly as :func:`mpo_viz.advantages.compute` and the
report run it. :func:`options_of` turns the controls' setting into one estimator's options.
"""

from __future__ import annotations

import time

import ipywidgets as W

from mpo_viz.advantages import registry
from mpo_viz.data.trajectory import TrajectoryBatch

__all__ = ["AdvantageEngine", "ParamControls", "default_estimators", "options_of"]

default_estimators = registry.default_estimators


def options_of(name: str, options: dict) -> dict:
    """The options estimator ``name`` takes from a controls setting: the shared keys it accepts,
    overridden by the ``"key@a+b"`` keys whose group names it (None values dropped)."""
    plain = {k: v for k, v in options.items() if "@" not in k}
    for k, v in options.items():
        if "@" in k:
            key, group = k.split("@", 1)
            if name in group.split("+"):
                plain[key] = v
    return registry.accepted_options(name, plain)


class AdvantageEngine:
    """Advantages and returns of several estimators on one batch, recomputed for new options.

    ``compute(options)`` → ``{name: (advantages, returns)}`` with ``(B, L)`` tensors, equal to
    ``mpo_viz.advantages.compute(batch, name, **estimator_options(name, options))``.
    """

    def __init__(self, batch: TrajectoryBatch, estimators):
        names = registry.parse_names(estimators)  # unknown names raise, listing the available ones
        self.batch = batch
        self.names = list(names)
        self._bound = {}
        for name in self.names:
            lacks = registry.missing(batch, name)
            if lacks:
                raise ValueError(
                    f"estimators: {name!r} needs what this batch lacks ({', '.join(lacks)}); "
                    f"this batch supports {default_estimators(batch) or 'none of mpo, gae, grpo'}"
                )
            self._bound[name] = registry.bind(batch, name)
        self.timings: dict = {}
        self._last: dict = {}  # name -> (its options as a sorted tuple, its (advantages, returns))
        self.ran: list[str] = []

    def options_for(self, name: str, options: dict) -> dict:
        """Every option estimator ``name`` runs with: its defaults, overridden by those it accepts."""
        return self._bound[name].resolve(**options_of(name, options))

    def compute(self, options: dict) -> dict:
        """``{name: (advantages, returns)}`` for the controls' setting ``options``. An estimator
        whose own options (:func:`options_of`) are those of the previous call is not run again: its
        previous tensors are returned (the same objects), so moving β reruns only the estimators
        that take β. ``ran`` (attribute) lists the estimators this call ran."""
        t0 = time.perf_counter()
        out = {}
        self.ran = []
        for name, b in self._bound.items():
            opts = options_of(name, options)
            key = tuple(sorted(opts.items()))
            last = self._last.get(name)
            if last is None or last[0] != key:
                adv, ret, _ = b.run(**opts)
                last = self._last[name] = (key, (adv, ret))
                self.ran.append(name)
            out[name] = last[1]
        self.timings["compute"] = time.perf_counter() - t0
        return out


class ParamControls(W.VBox):
    """One control per option of ``estimators`` (default mpo, gae, grpo), shared by them.

    Derived from the declarations (:func:`mpo_viz.advantages.vocabulary`): a float with a slider
    range gets a slider, other numbers a text box, a choice a menu, a flag a checkbox; an option's
    initial value is its estimators' default unless given in ``initial`` — by option name
    (``beta=0.5``) or, for an option that is a separate control per estimator, by control key
    (``**{"lam@mpo": 0.9}``; a plain ``lam=`` is refused there, as in :meth:`set`).
    ``options`` (dict) is the current setting; ``on_change(callback)`` calls ``callback(options)``
    after any control changes; ``set(**options)`` sets several controls and fires once (a split
    option needs ``estimator=``, see :meth:`set`); ``reset(*names)`` puts controls back to their
    estimators' defaults.
    Sliders update on release (``continuous_update=False``) so a drag recomputes once.
    """

    def __init__(self, estimators=None, **initial):
        names = registry.parse_names(estimators if estimators is not None else registry.DEFAULT_ESTIMATORS)
        vocab = {k: o for k, o in registry.vocabulary(names).items() if o.kind != "any"}
        # one control per (option, group of estimators that give it the same meaning and default)
        self.spec: dict[str, registry.Option] = {}
        self.groups: dict[str, tuple[str, ...]] = {}
        for key in vocab:
            groups: list[tuple[registry.Option, list[str]]] = []
            for n in registry.takers(key, names):
                o = next(x for x in registry.estimator_options(n) if x.name == key)
                for g in groups:
                    if g[0].same_meaning(o) and g[0].default == o.default:
                        g[1].append(n)
                        break
                else:
                    groups.append((o, [n]))
            for o, members in groups:
                ck = key if len(groups) == 1 else f"{key}@{'+'.join(members)}"
                self.spec[ck] = o
                self.groups[ck] = tuple(members)
        unknown = [k for k in initial if k not in vocab and k not in self.spec]
        if unknown:
            raise ValueError(
                f"options: unknown {', '.join(map(repr, unknown))}; valid: {', '.join(vocab)} "
                f"(or a control key: {', '.join(k for k in self.spec if '@' in k) or 'none here'})"
            )
        for k in initial:  # a plain name that is a separate control per estimator: the same rule as set()
            split = [c for c in self.spec if "@" in c and c.split("@")[0] == k]
            if split and k not in self.spec:
                raise ValueError(
                    f"options: {k!r} is a separate control per estimator here "
                    f"({', '.join(split)}); give the control key, e.g. **{{{split[0]!r}: …}}"
                )
        self.controls: dict[str, W.ValueWidget] = {}
        for ck, o in self.spec.items():
            value = initial.get(ck, initial.get(ck.split("@")[0]))
            value = o.default if value is None else o.check(value)
            label = o.display if "@" not in ck else f"{o.display} · {'+'.join(self.groups[ck])}"
            self.controls[ck] = _control(o, value, label, f"{o.doc} — used by {', '.join(self.groups[ck])}")
        self._callbacks: list = []
        self._muted = False
        for c in self.controls.values():
            c.observe(self._changed, names="value")
        main = [self.controls[k] for k, o in self.spec.items() if not o.advanced]
        more = [self.controls[k] for k, o in self.spec.items() if o.advanced]
        rows: list = [W.HBox(main[i : i + 4]) for i in range(0, len(main), 4)]
        if more:
            fold = W.Accordion(
                children=[W.VBox([W.HBox(more[i : i + 4]) for i in range(0, len(more), 4)])], selected_index=None
            )
            fold.set_title(0, "more options")
            rows.append(fold)
        super().__init__(rows)
        self.add_class("mpo-params")

    @property
    def options(self) -> dict:
        return {k: (float(c.value) if self.spec[k].kind == "float" else c.value) for k, c in self.controls.items()}

    def on_change(self, callback) -> None:
        self._callbacks.append(callback)

    def off(self, callback) -> None:
        """Stop calling ``callback`` (a view that is closed while its controls live on)."""
        self._callbacks = [cb for cb in self._callbacks if cb != callback]

    def _changed(self, _change=None) -> None:
        if self._muted:
            return
        opts = self.options
        for cb in self._callbacks:
            cb(opts)

    def keys_of(self, name: str, estimator: str | None = None) -> list[str]:
        """The control keys of option ``name`` (``["lam@mpo", "lam@gae"]``, ``["beta"]``); with
        ``estimator``, only the one whose group of estimators includes it."""
        keys = [c for c in self.controls if c == name or c.split("@")[0] == name]
        return [c for c in keys if estimator in self.groups[c]] if estimator is not None else keys

    def set(self, *, estimator: str | None = None, **options) -> None:
        """Set controls and fire once.

        A plain option name sets its control when one control holds it for every estimator taking
        it (``beta``; ``gamma``, shared by mpo and gae). Where the estimators split an option (λ:
        mpo's within-turn λ, default 0.95, and gae's token λ, default 1, are two controls), a plain
        name is ambiguous: say which with ``estimator="mpo"`` (the control of mpo's group) or with the
        key itself, ``set(**{"lam@gae": 0.9})``; a plain split name alone raises ``ValueError``.
        ``estimator`` applies to every plain name given; a shared control (γ) still moves every
        estimator of its group."""
        if estimator is not None and estimator not in {n for g in self.groups.values() for n in g}:
            raise ValueError(
                f"estimator: expected one of {', '.join(dict.fromkeys(n for g in self.groups.values() for n in g))}, "
                f"found {estimator!r}"
            )
        keys = {k: self.keys_of(k, estimator if "@" not in k else None) for k in options}
        unknown = [k for k, cs in keys.items() if not cs]
        if unknown:
            whose = f" for {estimator}" if estimator is not None else ""
            raise ValueError(
                f"options: unknown{whose} {', '.join(map(repr, unknown))}; valid: {', '.join(self.controls)}"
            )
        split = {k: cs for k, cs in keys.items() if len(cs) > 1}
        if split:
            k, cs = next(iter(split.items()))
            groups = "; ".join(
                f"{c}: {'+'.join(self.groups[c])}, default {self.spec[c].default:g}"
                if isinstance(self.spec[c].default, float)
                else f"{c}: {'+'.join(self.groups[c])}"
                for c in cs
            )
            raise ValueError(
                f"options: {k!r} is a separate control per estimator here ({groups}); say which: "
                f"set({k}=…, estimator={self.groups[cs[0]][0]!r}) or set(**{{{cs[0]!r}: …}})"
            )
        self._muted = True
        try:
            for k, v in options.items():
                self.controls[keys[k][0]].value = v
        finally:
            self._muted = False
        self._changed()

    def reset(self, *names: str) -> None:
        """Put the controls of ``names`` (option names or control keys; none: every control) back to
        their estimators' own defaults (``lam@mpo`` to 0.95, ``lam@gae`` to 1) and fire once."""
        keys = [c for n in names for c in self.keys_of(n)] if names else list(self.controls)
        unknown = [n for n in names if not self.keys_of(n)]
        if unknown:
            raise ValueError(f"options: unknown {', '.join(map(repr, unknown))}; valid: {', '.join(self.controls)}")
        self._muted = True
        try:
            for c in keys:
                self.controls[c].value = self.spec[c].default
        finally:
            self._muted = False
        self._changed()


def _control(o: registry.Option, value, label: str | None = None, tooltip: str | None = None) -> W.ValueWidget:
    """The widget for one declared option, set to ``value``."""
    common = {"description": label or o.display, "tooltip": tooltip or o.doc, "style": {"description_width": "initial"}}
    if o.kind == "choice":
        return W.Dropdown(options=o.choices, value=value, layout=W.Layout(width="170px"), **common)
    if o.kind == "bool":
        return W.Checkbox(value=bool(value), indent=False, layout=W.Layout(width="110px"), **common)
    if o.kind == "int":
        return W.IntText(value=int(value), layout=W.Layout(width="150px"), **common)
    if o.kind == "str":
        return W.Text(value=value, layout=W.Layout(width="170px"), **common)
    rng = o.slider
    if rng is None:
        return W.FloatText(value=float(value), layout=W.Layout(width="150px"), **common)
    lo, hi = rng
    return W.FloatSlider(
        value=float(value),
        min=lo,
        max=hi,
        step=(hi - lo) / 100,
        continuous_update=False,
        readout_format=".2f",
        layout=W.Layout(width="250px"),
        **common,
    )
