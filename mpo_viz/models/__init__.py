"""Policies and critics: a tiny Llama from a config, any local Hugging Face causal LM, a value head.

* :func:`tiny_policy` — a Llama ``*ForCausalLM`` built from a config (sizes ``"1m"``, ``"3m"``,
  ``"10m"``) over an environment's word-level tokenizer; nothing is downloaded.
* :func:`load_policy` — any local Hugging Face causal-LM folder, offline.
* :func:`tiny_instruct_folder` — a tiny Hugging Face folder laid out like SmolLM2-135M-Instruct's
  (byte-level BPE, ChatML template) for smoke runs of that path; nothing is downloaded.
* :class:`Critic` — a causal-LM trunk with a scalar head; its output at position ``P + t − 1`` is
  the value of response token ``t`` (the state before the token is generated). Built by
  :func:`make_critic` (for a policy), :func:`vocab_critic` / :func:`compact_critic` (a tiny trunk
  over a batch's ids) or :func:`trunk_critic` (the pretrained trunk of a model folder).
* :func:`save` / :func:`load` — a model folder ``DIR/policy`` (standard Hugging Face, tokenizer
  included) and ``DIR/critic`` (safetensors plus a small JSON config); :func:`load` also takes a
  plain Hugging Face causal-LM folder (the policy, no critic).
* :mod:`mpo_viz.models.gguf` — a GGUF file (e.g. SmolLM2-135M-Instruct from the package index) made
  into a plain Hugging Face folder (``mpo-viz get-model``).

See docs/models.md.
"""

from mpo_viz.models.critic import (
    COMPACT_MIN_VOCAB,
    UNTRAINED_CRITIC,
    Critic,
    RemappedCritic,
    compact_critic,
    load_critic,
    make_critic,
    save_critic,
    values_source_of,
    vocab_critic,
)
from mpo_viz.models.layout import TemplateLayout, layout_for
from mpo_viz.models.policy import Policy, check_vocabulary, load_policy, resolve_device, save_policy
from mpo_viz.models.store import is_plain, load, quiet_progress, save, trunk_critic
from mpo_viz.models.tiny import CHATML, SIZES, tiny_config, tiny_instruct_folder, tiny_policy

__all__ = [
    "COMPACT_MIN_VOCAB",
    "Critic",
    "Policy",
    "RemappedCritic",
    "SIZES",
    "compact_critic",
    "trunk_critic",
    "vocab_critic",
    "TemplateLayout",
    "check_vocabulary",
    "is_plain",
    "layout_for",
    "load",
    "load_critic",
    "load_policy",
    "make_critic",
    "UNTRAINED_CRITIC",
    "values_source_of",
    "quiet_progress",
    "resolve_device",
    "save",
    "save_critic",
    "save_policy",
    "tiny_config",
    "tiny_policy",
    "tiny_instruct_folder",
    "CHATML",
]
