"""The critic: a causal-LM trunk with a scalar value head, how one is built, and its checkpoint format.

Built for a policy (:func:`make_critic`: a fresh trunk of its architecture, a copy of its trunk, or
its trunk itself), or over a batch's own ids (:func:`vocab_critic`, a tiny Llama trunk;
:func:`compact_critic`, which embeds only the ids the batch uses: :class:`RemappedCritic`); a
critic on the pretrained trunk of a model folder is :func:`mpo_viz.models.store.trunk_critic`.

Alignment (trajectory/v1): for a sequence ``prompt_ids (P) + response_ids (L)``, the critic's output
at position ``P + t − 1`` is ``values[t]``, the value of the state *before* response token ``t`` is
generated; its output at the last position ``P + L − 1`` is the value after the whole response
(the ``bootstrap_value`` of a truncated episode).

A saved critic is a folder: ``config.json`` (``format: "mpo_viz.critic/v1"``, ``shared_trunk``,
``hidden_size``, the tokenizer's ``vocab_size`` and ``vocab_sha256``, the trunk's Hugging Face
config unless the trunk is shared, and a fingerprint of the policy's trunk when it is) and
``model.safetensors`` (``head.*``, plus ``trunk.*`` unless shared).

Invariant: every critic here, however built, is called the same way and aligned the same way
(the alignment above), and its new value head is drawn from its ``seed`` alone (the global RNG is
left as it was).
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path

import numpy as np
import torch
from torch import nn
from transformers import LlamaConfig, LlamaModel

from mpo_viz.checks import OptionError
from mpo_viz.data.trajectory import TrajectoryBatch
from mpo_viz.models.tiny import MAX_POSITIONS
from mpo_viz.models.tiny import SIZES as TINY_SIZES

__all__ = [
    "Critic",
    "RemappedCritic",
    "make_critic",
    "vocab_critic",
    "compact_critic",
    "used_ids",
    "COMPACT_MIN_VOCAB",
    "save_critic",
    "load_critic",
    "vocab_sha256",
    "CRITIC_FORMAT",
]

CRITIC_FORMAT = "mpo_viz.critic/v1"
_INITS = ("fresh", "policy", "shared")


def _config(model):
    """A Hugging Face model's ``config`` (untyped here: torch types module attributes as modules)."""
    return model.config


def _hidden_size(model) -> int:
    return int(_config(model).hidden_size)


class Critic(nn.Module):
    """``V = head(trunk(ids).last_hidden_state)``: ``(B, T)`` float32 values, one per position.

    ``trunk`` is a Hugging Face base model (e.g. ``LlamaModel``: ids -> hidden states ``(B, T, H)``);
    ``head`` is ``nn.Linear(H, 1)``. ``shared=True`` marks a trunk that is the policy's own module
    (its parameters are then the policy's; only the head is the critic's own — see
    :meth:`own_parameters`).
    """

    def __init__(self, trunk: nn.Module, *, shared: bool = False):
        super().__init__()
        self.trunk = trunk
        self.shared = bool(shared)
        self.head = nn.Linear(_hidden_size(trunk), 1)
        self.head.to(device=next(trunk.parameters()).device, dtype=next(trunk.parameters()).dtype)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        past_key_values=None,
    ) -> torch.Tensor:
        """``input_ids`` ``(B, T)`` (with ``attention_mask`` 0 on padding) -> values ``(B, T)`` float32.

        ``past_key_values``: a Hugging Face cache (``transformers.DynamicCache``) holding the keys
        and values of the positions before ``input_ids``, which it reads and extends (give
        ``position_ids`` then); None: the sequence starts at ``input_ids``, nothing is cached."""
        h = self.trunk(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            use_cache=past_key_values is not None,
        ).last_hidden_state
        return self.head(h).squeeze(-1).float()

    def own_parameters(self):
        """The parameters that belong to the critic alone (all of them, or the head when shared)."""
        return list(self.head.parameters()) if self.shared else list(self.parameters())


class RemappedCritic(nn.Module):
    """A :class:`Critic` that reads ids through a lookup table: ``V = inner(lut[ids])``.

    A critic fitted to logs of a large vocabulary (49k byte-level ids) of which the logs use a few
    thousand needs an embedding row per id *used*, not per id of the vocabulary: ``lut`` ``(n,)``
    int64 maps each id below ``n`` to its row of ``inner``'s embedding; ids the table does not know
    (``lut`` = -1, or ``>= n``) read the row ``unseen``. Same call, outputs and
    :meth:`own_parameters` as the critic it wraps (``trunk``, ``head``, ``shared`` are ``inner``'s)."""

    def __init__(self, inner: Critic, lut: torch.Tensor, unseen: int):
        super().__init__()
        self.inner = inner
        self.register_buffer("lut", torch.as_tensor(lut, dtype=torch.int64), persistent=False)
        self.unseen = int(unseen)

    @property
    def trunk(self) -> nn.Module:
        return self.inner.trunk

    @property
    def head(self) -> nn.Linear:
        return self.inner.head

    @property
    def shared(self) -> bool:
        return self.inner.shared

    def rows(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The embedding rows of ``input_ids`` (same shape)."""
        lut: torch.Tensor = self.lut  # type: ignore[assignment]  # a buffer
        n = int(lut.shape[0])
        rows = lut[input_ids.clamp(min=0, max=n - 1)]
        return torch.where((input_ids < n) & (rows >= 0), rows, torch.full_like(rows, self.unseen))

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        past_key_values=None,
    ) -> torch.Tensor:
        return self.inner(
            self.rows(input_ids),
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
        )

    def own_parameters(self):
        return self.inner.own_parameters()


def _trunk_of(policy) -> nn.Module:
    model = policy.model
    trunk = getattr(model, "base_model", None)
    if trunk is None or trunk is model:
        raise ValueError(
            f"policy {policy.name}: expected a *ForCausalLM with a base model to use as the trunk, "
            f"found {type(model).__name__}"
        )
    return trunk


def make_critic(policy, init: str = "fresh", seed: int = 0) -> Critic:
    """A critic for ``policy``: ``init="fresh"`` — a new trunk of the policy's architecture
    (randomly initialized from ``seed``); ``"policy"`` — a copy of the policy's trunk weights;
    ``"shared"`` — the policy's trunk module itself. The head is ``N(0, 0.02²)`` weights, zero bias,
    drawn from ``seed`` (the global RNG is left untouched). Same device and dtype as the policy."""
    if init not in _INITS:
        raise OptionError("init", f"expected one of {list(_INITS)}, found {init!r}")
    from transformers import AutoModel

    base = _trunk_of(policy)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if init == "fresh":
            # its own config object: a setting changed on the policy (the rollout's attention) stays there
            trunk = AutoModel.from_config(copy.deepcopy(base.config)).to(device=policy.device, dtype=policy.dtype)
        elif init == "policy":
            trunk = copy.deepcopy(base)
        else:
            trunk = base
        critic = Critic(trunk, shared=init == "shared")
        with torch.no_grad():
            critic.head.weight.normal_(0.0, 0.02)
            critic.head.bias.zero_()
    # the head as initialized (not a buffer: never saved): values_source_of tells an untrained critic by it
    critic.initial_head = tuple(t.detach().clone() for t in (critic.head.weight, critic.head.bias))  # type: ignore[assignment]
    return critic.eval()


def vocab_critic(vocab_size: int, *, size: str = "1m", seed: int = 0, max_positions: int = MAX_POSITIONS) -> Critic:
    """A fresh critic whose trunk is a tiny Llama of ``size`` (``1m``, ``3m``, ``10m``) over ids
    ``0 .. vocab_size − 1`` (built from a config, nothing downloaded; weights fixed by ``seed``)."""
    if size not in TINY_SIZES:
        raise OptionError("size", f"expected one of {', '.join(TINY_SIZES)}, found {size!r}")
    s = TINY_SIZES[size]
    cfg = LlamaConfig(
        vocab_size=int(vocab_size),
        **s,
        num_key_value_heads=s["num_attention_heads"],
        max_position_embeddings=int(max_positions),
        tie_word_embeddings=False,
        pad_token_id=0,
        bos_token_id=None,
        eos_token_id=None,
        rms_norm_eps=1e-5,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        critic = Critic(LlamaModel(cfg))
        with torch.no_grad():
            critic.head.weight.normal_(0.0, 0.02)
            critic.head.bias.zero_()
    return critic.eval()


#: a fresh critic over a vocabulary larger than this gets embedding rows for the ids the batch uses
#: only (:func:`compact_critic`): a 49k byte-level vocabulary's embedding and its AdamW update
#: otherwise outweigh a tiny trunk several times over
COMPACT_MIN_VOCAB = 4096


def used_ids(batch: TrajectoryBatch) -> np.ndarray:
    """The distinct token ids of ``batch``'s prompts and responses, ascending (int64)."""
    return np.unique(
        np.concatenate(
            [np.asarray(x, dtype=np.int64) for f in ("prompt_ids", "response_ids") for x in batch.field(f)]
            or [np.zeros(0, np.int64)]
        )
    )


def compact_critic(
    batch: TrajectoryBatch,
    *,
    size: str = "1m",
    seed: int = 0,
    max_positions: int = MAX_POSITIONS,
    used: np.ndarray | None = None,
) -> torch.nn.Module:
    """A fresh critic for the ids of ``batch``: :func:`vocab_critic` over ``0 .. max id``, or — when
    that vocabulary is larger than :data:`COMPACT_MIN_VOCAB` and the batch uses fewer ids — a
    :class:`RemappedCritic` whose embedding has one row per id the batch
    uses (in id order) and one for ids it does not. The same model on the batch's sequences,
    without the embedding rows (and their optimizer state) that no token of the batch reads.
    ``used``: the ids to serve instead of the batch's own (:func:`used_ids` of a whole file, when the
    critic is fitted on a sample of it and then applied to every row)."""
    used = used_ids(batch) if used is None else np.asarray(used, dtype=np.int64)
    vocab = int(used[-1]) + 1 if len(used) else 1
    if vocab <= COMPACT_MIN_VOCAB or len(used) + 1 >= vocab:
        return vocab_critic(vocab, size=size, seed=seed, max_positions=max_positions)
    lut = torch.full((vocab,), -1, dtype=torch.int64)
    lut[torch.from_numpy(used)] = torch.arange(len(used))
    inner = vocab_critic(len(used) + 1, size=size, seed=seed, max_positions=max_positions)
    return RemappedCritic(inner, lut, unseen=len(used)).eval()


#: ``values_source`` of values from a critic whose value head is still as :func:`make_critic` drew it
UNTRAINED_CRITIC = "untrained_critic"


def values_source_of(critic) -> str:
    """The ``values_source`` metadata of values computed by ``critic``: :data:`UNTRAINED_CRITIC`
    while its value head is exactly as :func:`make_critic` initialized it (no update has moved it:
    its values are a random projection, not estimates), else ``"critic"`` (trained, or loaded)."""
    init = getattr(critic, "initial_head", None)
    head = getattr(critic, "head", None)
    if init is None or head is None:
        return "critic"
    now = (head.weight.detach(), head.bias.detach())
    same = all(a.shape == b.shape and torch.equal(a.to(b.device, b.dtype), b) for a, b in zip(init, now))
    return UNTRAINED_CRITIC if same else "critic"


def vocab_sha256(tokenizer) -> str:
    """A fingerprint of the token -> id map (a critic reads the policy's ids)."""
    items = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    return hashlib.sha256(json.dumps(items, ensure_ascii=False).encode()).hexdigest()


def _fingerprint(module: nn.Module) -> str:
    """Names, shapes and the first/last 512 values of every tensor (cheap on large trunks)."""
    h = hashlib.sha256()
    for name, t in sorted(module.state_dict().items()):
        flat = t.detach().reshape(-1)
        sample = torch.cat([flat[:512], flat[-512:]]).float().cpu().numpy()
        h.update(f"{name}{tuple(t.shape)}".encode())
        h.update(sample.tobytes())
    return h.hexdigest()


def save_critic(critic: Critic, path, policy) -> Path:
    """Write ``critic`` (for ``policy``) to the folder ``path``: ``config.json`` + ``model.safetensors``."""
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    cfg = {
        "format": CRITIC_FORMAT,
        "shared_trunk": critic.shared,
        "hidden_size": _hidden_size(critic.trunk),
        "vocab_size": len(policy.tokenizer),
        "vocab_sha256": vocab_sha256(policy.tokenizer),
        "trunk_config": None if critic.shared else _config(critic.trunk).to_dict(),
        "policy_trunk_fingerprint": _fingerprint(critic.trunk) if critic.shared else None,
    }
    state = critic.head.state_dict(prefix="head.")
    if not critic.shared:
        state.update(critic.trunk.state_dict(prefix="trunk."))
    save_file(
        {k: v.detach().contiguous().cpu() for k, v in state.items()},
        str(path / "model.safetensors"),
        metadata={"format": "pt"},
    )
    (path / "config.json").write_text(json.dumps(cfg, indent=1))
    return path


def load_critic(path, policy) -> Critic:
    """Load the critic saved at ``path`` for ``policy`` (same device and dtype). Refuses, naming the
    folder, a critic saved for another tokenizer, or one whose shared trunk is not this policy's."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModel

    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: expected a critic folder, found no such folder")
    try:
        cfg = json.loads((path / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(
            f"{path / 'config.json'}: expected the critic's JSON config, found none readable ({exc})"
        ) from None
    if not isinstance(cfg, dict) or cfg.get("format") != CRITIC_FORMAT:
        raise ValueError(
            f"{path / 'config.json'}: expected format {CRITIC_FORMAT!r}, "
            f"found {cfg.get('format') if isinstance(cfg, dict) else type(cfg).__name__!r}"
        )
    if cfg.get("vocab_size") != len(policy.tokenizer) or cfg.get("vocab_sha256") != vocab_sha256(policy.tokenizer):
        raise ValueError(
            f"{path}: expected a critic for the tokenizer of the policy {policy.name} "
            f"({len(policy.tokenizer)} tokens), found one saved for another tokenizer "
            f"({cfg.get('vocab_size')} tokens)"
        )
    base = _trunk_of(policy)
    if cfg.get("shared_trunk"):
        if cfg.get("policy_trunk_fingerprint") != _fingerprint(base):
            raise ValueError(
                f"{path}: expected a critic whose shared trunk is the policy {policy.name}, found one "
                "saved with a trunk of different weights"
            )
        trunk = base
    else:
        try:
            tcfg = dict(cfg["trunk_config"])
            trunk = AutoModel.from_config(AutoConfig.for_model(tcfg.pop("model_type"), **tcfg))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(
                f"{path / 'config.json'}: expected trunk_config (a Hugging Face model config), "
                f"found an unusable one ({type(exc).__name__}: {exc})"
            ) from None
        trunk.to(device=policy.device, dtype=policy.dtype)
    critic = Critic(trunk, shared=bool(cfg.get("shared_trunk")))
    try:
        state = load_file(str(path / "model.safetensors"))
    except (OSError, SafetensorError) as exc:
        raise ValueError(
            f"{path / 'model.safetensors'}: expected the critic's weights, found none readable ({exc})"
        ) from None
    own = critic.head.state_dict(prefix="head.")
    if not critic.shared:
        own.update(critic.trunk.state_dict(prefix="trunk."))
    missing, extra = sorted(set(own) - set(state)), sorted(set(state) - set(own))
    bad = [k for k in own if k in state and tuple(state[k].shape) != tuple(own[k].shape)]
    if missing or extra or bad:
        raise ValueError(
            f"{path / 'model.safetensors'}: expected the tensors of a critic with hidden size "
            f"{cfg.get('hidden_size')}, found missing {missing[:3]}, unexpected {extra[:3]}, "
            f"wrong shapes {bad[:3]}"
        )
    with torch.no_grad():
        for k, v in own.items():
            v.copy_(state[k])
    return critic.eval()
