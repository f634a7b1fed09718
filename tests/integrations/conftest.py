"""verl-environment tests (``make test-verl``): the plugin against verl's own code, on CPU.

Collected only where verl is importable (tests/conftest.py leaves the folder out elsewhere and says
so in the run's header). Every test here runs the real verl 0.9.1 functions.
"""

import pytest


@pytest.fixture(autouse=True)
def _no_ambient_run_dir(monkeypatch):
    """A developer's MPO_VIZ_* settings must not leak into the tests."""
    for key in (
        "MPO_VIZ_RUN_DIR",
        "MPO_VIZ_EVERY",
        "MPO_VIZ_MAX_ROWS",
        "MPO_VIZ_MAX_MB",
        "MPO_VIZ_COMPARE",
        "MPO_VIZ_SEED",
    ):
        monkeypatch.delenv(key, raising=False)
