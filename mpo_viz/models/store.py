"""A model folder: ``DIR/policy`` (standard Hugging Face, tokenizer included) and ``DIR/critic`` — or,
for loading, a plain Hugging Face causal-LM folder."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

from mpo_viz.models.critic import load_critic, save_critic
from mpo_viz.models.policy import Policy, load_policy, save_policy

__all__ = ["save", "load", "quiet_progress", "is_plain", "LAYOUTS"]


@contextmanager
def quiet_progress():
    """No transformers progress bars ("Loading weights", "Writing model shards") inside; the previous
    setting is restored after."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


def save(path, policy: Policy, critic=None) -> Path:
    """Write ``path/policy`` and, when given, ``path/critic``. Returns ``path``."""
    path = Path(path)
    with quiet_progress():
        save_policy(policy, path / "policy")
        if critic is not None:
            save_critic(critic, path / "critic", policy)
    return path


#: what each accepted layout of a model folder needs (for the error on a folder that is neither)
LAYOUTS = ("a model folder written by mpo_viz (policy/: a Hugging Face causal LM with its tokenizer; critic/: "
           "optional, from mpo_viz.models.save or --save-model), or a plain Hugging Face causal-LM folder "
           "(config.json with a *ForCausalLM architecture, weights *.safetensors or pytorch_model.bin, and a tokenizer: "
           "tokenizer.json or tokenizer_config.json; a GGUF file first becomes one with mpo-viz get-model)")


def is_plain(path) -> bool:
    """Whether ``path`` is a plain Hugging Face folder (``config.json`` at its top, no ``policy/``)."""
    path = Path(path)
    return not (path / "policy").is_dir() and (path / "config.json").is_file()


def load(path, *, device="cpu", dtype=None, trust_remote_code: bool = False):
    """``(policy, critic or None)`` from a model folder: one written by :func:`save` (``policy/``, and
    the critic when ``critic/`` exists), or a plain Hugging Face causal-LM folder (the policy; no
    critic — :func:`~mpo_viz.models.make_critic` builds one). Reloading gives bit-identical outputs.
    A folder that is neither raises, saying what each layout needs (:data:`LAYOUTS`)."""
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: expected {LAYOUTS}; found no such folder")
    plain = is_plain(path)
    if not plain and not (path / "policy").is_dir():
        raise ValueError(f"{path}: expected {LAYOUTS}; found neither (contents: "
                         f"{sorted(p.name for p in path.iterdir())[:8]})")
    with quiet_progress():
        if plain:
            return load_policy(path, device=device, dtype=dtype, trust_remote_code=trust_remote_code), None
        policy = load_policy(path / "policy", device=device, dtype=dtype, trust_remote_code=trust_remote_code)
        critic = load_critic(path / "critic", policy) if (path / "critic").exists() else None
    return policy, critic
