"""Fixtures of the trainer and critic tests."""

import pytest

from mpo_viz.envs import make_env
from tests.models.model_helpers import make_instruct_folder


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    """A tiny Hugging Face causal-LM folder (byte-level BPE, ChatML template) over the search words."""
    return make_instruct_folder(tmp_path_factory.mktemp("hf") / "model", make_env("search"), seed=3)
