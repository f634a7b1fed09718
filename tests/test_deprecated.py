"""Names that moved keep working from their old place, with a DeprecationWarning that says where they are now."""

from __future__ import annotations

import importlib
import sys

import pytest


@pytest.mark.parametrize("old, new, name", [
    ("mpo_viz.tokens", "mpo_viz.token_text", "tokenizer_decoder"),
    ("mpo_viz.adapters.report", "mpo_viz.adapters.conversion", "ConversionReport"),
    ("mpo_viz.widgets.export", "mpo_viz.widgets.export_bar", "ExportBar"),
])
def test_a_moved_module_warns_and_works(old, new, name):
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=new.replace(".", r"\.")):
        mod = importlib.import_module(old)
    assert getattr(mod, name) is getattr(importlib.import_module(new), name)


def test_moved_names_keep_their_objects():
    from mpo_viz.advantages import Option as A
    from mpo_viz.advantages.registry import Option as R
    from mpo_viz.options import Option

    assert A is R is Option
    from mpo_viz.widgets import explorer

    with pytest.warns(DeprecationWarning, match="returns_source"):
        assert explorer.RETURN_SOURCES[:5] == ("mpo", "mae", "gae", "turn_gae", "vapo")  # then users' own
