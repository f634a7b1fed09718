"""Honest colour scales for the strips of the widgets.

The strip on its own saturates each channel at that channel's 99th percentile on the trajectory
shown, so two strips (or one strip before and after a slider move) colour the same number
differently. :class:`ColourScale` fixes the advantage channels (``adv_*``) on one number and MAE's
within-turn channel of the multiscale estimator (``micro_*``, :func:`mpo_viz.advantages.multiscale_estimator`) on
another, by mode (:data:`mpo_viz.render.strip.SCALE_MODES`):

* ``"absolute"`` — computed once from the whole batch under the options the view opened with (the
  99th percentile of ``|A|`` over every action token, the largest over the estimators): the same
  value has the same colour across trajectories, strips and slider moves; values beyond it are
  clipped, marked and counted by the strip;
* ``"shared"`` — recomputed for the trajectory shown: the largest of the estimators' 99th
  percentiles on it, shared by all advantage channels;
* ``"own"`` — each channel its own 99th percentile (the bare strip's behaviour);
* a positive number — that fixed scale for the advantage channels.
"""

from __future__ import annotations

import math

import ipywidgets as W
import numpy as np

from mpo_viz.advantages import registry
from mpo_viz.data.trajectory import TrajectoryBatch
from mpo_viz.render.strip import SCALE_MODES, robust_scale, set_scale, within_turn_part

__all__ = ["ColourScale"]

_LABELS = {"absolute": "absolute (whole batch)", "shared": "shared (this trajectory)", "own": "own (per channel)"}


class ColourScale:
    """Colour-scale state of a view: ``mode``, the batch-wide numbers, and a menu (``control``).

    ``batch``, ``results`` (``{name: (adv, ret)}``, ``(B, L)``): what the absolute numbers are
    taken from. ``on_change(callback)``: called with no argument when the menu changes.
    """

    def __init__(self, mode, batch: TrajectoryBatch, results: dict):
        fixed = None
        if isinstance(mode, (int, float)) and not isinstance(mode, bool):
            if not (math.isfinite(mode) and mode > 0):
                raise ValueError(f"scale: expected one of {SCALE_MODES} or a number > 0, found {mode!r}")
            fixed, mode = float(mode), "absolute"
        if mode not in SCALE_MODES:
            raise ValueError(f"scale: expected one of {SCALE_MODES} or a number > 0, found {mode!r}")
        mask = batch.mask
        advs = {k: a for k, (a, _) in results.items()}
        self.absolute_adv = (
            fixed if fixed is not None else (max((robust_scale(a, mask) for a in advs.values()), default=1.0))
        )
        micro = registry.multiscale_estimator(advs)
        self.absolute_micro = robust_scale(within_turn_part(advs[micro], mask, batch.turn_ids), mask) if micro else 1.0
        self.fixed = fixed is not None
        self.control = W.Dropdown(
            options=[(_LABELS[m], m) for m in SCALE_MODES],
            value=mode,
            description="colours",
            tooltip="colour scale of the advantage channels",
            style={"description_width": "48px"},
            layout=W.Layout(width="250px"),
        )

    @property
    def mode(self) -> str:
        return self.control.value

    def on_change(self, callback) -> None:
        self.control.observe(lambda _: callback(), names="value")

    def apply(self, payloads) -> None:
        """Set the scales of the ``adv_*`` and ``micro_*`` channels of ``payloads`` (one payload or
        several stacked strips of one trajectory), in place."""
        if isinstance(payloads, dict):
            payloads = [payloads]
        adv_names = sorted({k for p in payloads for k in p["channels"] if k.startswith("adv_")})
        micro_names = sorted({k for p in payloads for k in p["channels"] if k.startswith("micro_")})
        mode = self.mode
        if mode == "own":
            for p in payloads:
                set_scale(p, adv_names + micro_names, None)
            return
        if mode == "absolute":
            s_adv, s_micro = self.absolute_adv, self.absolute_micro
            note = "fixed" if self.fixed else "absolute: whole batch"
            note_micro = "absolute: whole batch"
        else:
            p0 = payloads[0]
            mask = np.asarray(p0["mask"])

            def col(k):  # a channel as float64 (an array as is; a list's None as NaN)
                return np.asarray(p0["channels"][k], dtype=np.float64)

            s_adv = max((robust_scale(col(k), mask) for k in adv_names), default=1.0)
            s_micro = max((robust_scale(col(k), mask) for k in micro_names), default=1.0)
            note = note_micro = "shared by the estimators"
        for p in payloads:
            set_scale(p, adv_names, s_adv, note)
            set_scale(p, micro_names, s_micro, note_micro)
