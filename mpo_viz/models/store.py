"""A model folder: ``DIR/policy`` (standard Hugging Face, tokenizer included) and ``DIR/critic`` — or,
for loading, a plain Hugging Face causal-LM folder — and :func:`trunk_critic`, a critic on the
pretrained trunk of such a folder (here, not in :mod:`mpo_viz.models.critic`: it loads a folder,
and this module imports that one).

Invariant: :func:`load` gives back what :func:`save` wrote — the policy with its tokenizer and the
critic that was saved for it (refused when it was saved for another tokenizer or trunk).
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import numpy as np

from mpo_viz.checks import OptionError
from mpo_viz.data.trajectory import TrajectoryBatch
from mpo_viz.models.critic import Critic, load_critic, make_critic, save_critic
from mpo_viz.models.policy import Policy, embedding_rows, load_policy, save_policy

__all__ = ["save", "load", "quiet_progress", "is_plain", "trunk_critic", "LAYOUTS"]


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
LAYOUTS = (
    "a model folder written by mpo_viz (policy/: a Hugging Face causal LM with its tokenizer; critic/: "
    "optional, from mpo_viz.models.save or --save-model), or a plain Hugging Face causal-LM folder "
    "(config.json with a *ForCausalLM architecture, weights *.safetensors or pytorch_model.bin, and a tokenizer: "
    "tokenizer.json or tokenizer_config.json; a GGUF file first becomes one with mpo-viz get-model)"
)


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
        raise ValueError(
            f"{path}: expected {LAYOUTS}; found neither (contents: {sorted(p.name for p in path.iterdir())[:8]})"
        )
    with quiet_progress():
        if plain:
            return load_policy(path, device=device, dtype=dtype, trust_remote_code=trust_remote_code), None
        policy = load_policy(path / "policy", device=device, dtype=dtype, trust_remote_code=trust_remote_code)
        critic = load_critic(path / "critic", policy) if (path / "critic").exists() else None
    return policy, critic


def trunk_critic(
    path, batch: TrajectoryBatch, *, seed: int = 0, device="cpu", source: str = "batch", extra_ids=None
) -> Critic:
    """A critic on a pretrained trunk: the causal LM in folder ``path`` (a plain Hugging Face folder,
    e.g. SmolLM2's, or a model folder with ``policy/``: the policy that wrote the logs), its trunk's
    weights copied, a fresh value head drawn from ``seed`` (:func:`~mpo_viz.models.critic.make_critic`
    ``init="policy"``). The batch's ids must be ids of that model: an id past its embedding, or
    ``response_tokens`` that its tokenizer does not give back (more than half of a row's tokens
    differ), is an ``OptionError`` naming ``source`` and the folder. ``extra_ids``: more ids the
    critic must read (a whole file's, when ``batch`` is a sample of it), checked the same way."""
    try:
        policy, _ = load(path, device=device)
    except (OSError, ValueError) as exc:
        raise OptionError(
            "trunk",
            f"expected a Hugging Face causal-LM folder (or a model folder with policy/), "
            f"found {str(path)!r} that does not load ({str(exc)[:160]})",
        ) from None
    rows = embedding_rows(policy.model)
    top = max((int(x.max()) for f in ("prompt_ids", "response_ids") for x in batch.field(f) if len(x)), default=-1)
    if extra_ids is not None and len(extra_ids):
        top = max(top, int(np.max(extra_ids)))
    if top >= rows:
        raise OptionError(
            "trunk",
            f"expected a model whose vocabulary covers {source}'s token ids, found id {top} "
            f"in {source} but {rows} embedding rows in {path} (the logs were tokenized by another model)",
        )
    _check_same_tokenizer(policy, batch, path, source)
    return make_critic(policy, "policy", seed=seed)


def _check_same_tokenizer(policy, batch: TrajectoryBatch, path, source: str) -> None:
    """Refuse a trunk whose tokenizer decodes the first row's ids to other text than its ``response_tokens``."""
    if not batch.has("response_tokens") or batch.field("response_tokens")[0] is None or not len(batch):
        return
    ids = [int(i) for i in batch.field("response_ids")[0]]
    stored = ["" if t is None else str(t) for t in batch.field("response_tokens")[0]]
    tok = policy.tokenizer
    shown = [tok.decode([i], skip_special_tokens=False, clean_up_tokenization_spaces=False) for i in ids]
    raw = [str(t) for t in tok.convert_ids_to_tokens(ids)]
    differ = sum(1 for s, a, b in zip(stored, shown, raw) if s.strip() not in (a.strip(), b.strip()) and s != "")
    if ids and differ > len(ids) / 2:
        raise OptionError(
            "trunk",
            f"expected the tokenizer that wrote {source}, found {path}'s tokenizer decodes "
            f"{differ} of {len(ids)} tokens of {batch.traj_ids[0]} to other text than its "
            "response_tokens",
        )
