"""A model folder: ``DIR/policy`` (standard Hugging Face, tokenizer included) and ``DIR/critic``."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

from mpo_viz.models.critic import load_critic, save_critic
from mpo_viz.models.policy import Policy, load_policy, save_policy

__all__ = ["save", "load", "quiet_progress"]


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


def load(path, *, device="cpu", dtype=None, trust_remote_code: bool = False):
    """``(policy, critic or None)`` from a folder written by :func:`save` (the critic when
    ``path/critic`` exists). Reloading gives bit-identical outputs."""
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: expected a model folder (policy/ and critic/), found no such folder")
    if not (path / "policy").is_dir():
        raise ValueError(f"{path}: expected a model folder with policy/ (and critic/), found "
                         f"{sorted(p.name for p in path.iterdir())[:8]}")
    with quiet_progress():
        policy = load_policy(path / "policy", device=device, dtype=dtype, trust_remote_code=trust_remote_code)
        critic = load_critic(path / "critic", policy) if (path / "critic").exists() else None
    return policy, critic
