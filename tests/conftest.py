"""Shared test fixtures. Hypothesis runs with a modest, deterministic profile to fit the CI budget."""

import importlib.util
import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    max_examples=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("dev", max_examples=200, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# tests/integrations runs verl's own code: it needs verl, which lives in its own environment
# (`make test-verl` builds .venv-verl). Where verl is missing the folder is not collected, and the
# header of every run says so, so a green default suite never looks like it covered the plugin.
HAVE_VERL = importlib.util.find_spec("verl") is not None
collect_ignore = [] if HAVE_VERL else ["integrations"]


def pytest_report_header(config):
    if not HAVE_VERL:
        return "tests/integrations: not collected (verl is not installed here; run `make test-verl`)"
    return None


@pytest.fixture(scope="session")
def load_script():
    """``load_script(path, name)``: a repository script that is not a package module
    (``benchmarks/*.py``, ``trajectories/**/make_*.py``) imported from its path as module ``name``
    (registered in ``sys.modules``, so that its dataclasses resolve their module)."""
    import sys

    def load(path, name):
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
        return mod

    return load


@pytest.fixture(scope="module")
def one_thread():
    """Torch on one thread for the module: tiny models are overhead-bound, and a second thread only
    spin-waits in OpenMP on a shared 2-core machine. Use with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
