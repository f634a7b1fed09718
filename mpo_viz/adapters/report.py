"""Deprecated: this module is :mod:`mpo_viz.adapters.conversion` (what a conversion did), renamed so
that it is not mistaken for the offline HTML report (:mod:`mpo_viz.report`)."""

import warnings

from mpo_viz.adapters.conversion import ConversionReport

__all__ = ["ConversionReport"]

warnings.warn("mpo_viz.adapters.report is deprecated: import from mpo_viz.adapters.conversion", DeprecationWarning,
              stacklevel=2)
