"""Batched multi-turn rollout of a policy in a text environment: token in, token out, honest log-probs.

``rollout(policy, env, n_episodes, group_size=G, critic=critic, seed=0)`` plays ``n_episodes``
episodes (``n_episodes / G`` tasks, G samples each) and returns a trajectory/v1
:class:`~mpo_viz.trajectory.TrajectoryBatch`.

**One batch turn.** Up to ``batch_size`` live episodes share one key/value cache (rows = episodes,
columns = cache slots; a 0/1 ``attention_mask`` marks the slots each row really uses, and
``position_ids`` carry each row's own positions, so a padded row computes what it would alone):

1. *feed* — every row's pending tokens (a new episode's prompt; otherwise the last sampled token
   of its previous turn and the observation after it) go through the model in one forward,
   left-padded to the longest; only the last position's logits are kept;
2. *decode* — all rows sample their next token at once from those logits, then one-token forwards
   with the cache follow; a row whose turn ended (the stop token, ``max_turn_tokens``, or the
   ``max_total_tokens`` budget) feeds padding until every row is done;
3. *step* — each environment reads the decoded text of its turn (the ids stay exactly as sampled),
   its observation is laid out by the policy's chat layout (``loss_mask`` 0) and becomes the row's
   pending tokens; finished episodes leave, the cache is compacted, queued episodes join.

Earlier turns are never recomputed (see ``benchmarks/rollout.py`` for the cost against
``model.generate``). Once an episode ended, the critic runs once over its ``prompt + response`` (on
the CPU one unpadded sequence at a time: see ``_critic_values``), in a second thread while the
policy decodes the other episodes when a core is free (``critic_thread``), else after the last.

**Log-probs per action token.** ``old_logprobs``: ``log softmax(logits)[token]`` (temperature 1, no
top-p: the policy's own log-prob, what the losses use as π_old). ``rollout_logprobs``: the log-prob
under the distribution actually sampled from — ``softmax(logits / T)`` restricted to the top-p
nucleus and renormalized; at T = 1, top-p = 1 both are the same numbers; at ``temperature=0``
(greedy) the sampled distribution is a point mass and ``rollout_logprobs`` are 0.
Observation tokens carry 0 in both.

**Episode ends.** ``stop_reason``: ``"terminated"`` (the task ended), ``"turn_limit"`` (the
environment's turn limit — part of the environment, whose values are 0 there; not bootstrapped),
``"max_total_tokens"`` (the rollout's token budget cut the episode: ``truncated`` and
``bootstrap_value`` = the critic's output at the last position). A turn cut by ``max_turn_tokens`` is
given to the environment as written; a turn cut by the total budget is not (the episode ends).
An observation is always appended whole, so a row may exceed ``max_total_tokens`` by one
observation.

**Determinism.** Every episode draws its sampling noise from its own stream (seeded by the rollout
seed, its task and sample), and each token is sampled by inversion of the CDF with one uniform
number, so the same seed gives the same tokens whatever ``batch_size`` (float log-probs agree to
rounding: batch composition changes summation order by ~1e-7).
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import json
import os
import random
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import torch

from mpo_viz.checks import OptionError
from mpo_viz.envs.base import TextEnv
from mpo_viz.envs.expert import NoisyExpert
from mpo_viz.envs.oracle import Oracle
from mpo_viz.envs.registry import make_env
from mpo_viz.models.critic import values_source_of
from mpo_viz.models.policy import Policy, check_vocabulary, embedding_rows
from mpo_viz.options import check_fields, setting
from mpo_viz.trajectory import TrajectoryBatch

__all__ = ["rollout", "RolloutConfig", "task_seeds", "STOP_REASONS", "ORACLE_TOKEN_FIELDS"]

STOP_REASONS = ("terminated", "turn_limit", "max_total_tokens")
#: the oracle's per-token columns (as in files of ``mpo-viz generate``)
ORACLE_TOKEN_FIELDS = ("oracle_values", "oracle_token_adv", "decisive")
_UBLOCK = 64  # uniforms drawn per episode at a time
#: the default oracle: exact values under the noisy expert of ``mpo-viz generate`` (noise 0.25)
DEFAULT_ORACLE = NoisyExpert()


@dataclass
class RolloutConfig:
    """Options of :func:`rollout` (recorded in the file metadata as ``generator``); each field is
    declared as an :class:`~mpo_viz.options.Option` and checked by :meth:`validate`."""

    group_size: int = setting(1, kind="int", low=1, doc="samples per task (G); tasks are groups (one group_id)")
    seed: int = setting(0, kind="any", doc="master seed: tasks (unless seeds), environment dynamics and sampling noise")
    temperature: float = setting(1.0, low=0, expect="a finite number >= 0 (0 = greedy)",
                                 doc="sampling temperature; 0 = greedy (argmax)")
    top_p: float = setting(1.0, low=0, high=1, low_open=True, expect="a number in (0, 1]",
                           doc="nucleus sampling mass in (0, 1]; 1 = the whole distribution")
    max_turn_tokens: int = setting(48, kind="int", low=1,
                                   doc="at most this many tokens per assistant turn (the stop token included)")
    max_total_tokens: int = setting(1024, kind="int", low=1,
                                    doc="the episode's token budget (prompt + response, see the module docstring)")
    batch_size: int = setting(16, kind="int", low=1, doc="live episodes decoded together")
    seeds: list[int] | None = None
    """explicit task seeds (one group of G episodes each) instead of tasks drawn from ``seed``"""

    def validate(self) -> None:
        check_fields(self)
        for s in self.seeds or ():
            if isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s < 0:
                raise OptionError("seeds", f"expected task seeds (ints >= 0), found {s!r}")


def task_seeds(seed: int, n_tasks: int) -> list[int]:
    """The task seeds :func:`rollout` draws from ``seed`` when ``seeds`` is not given (the same
    tasks ``mpo-viz generate --seed`` plays with the expert)."""
    return [t for t, _ in _plan_from_seed(seed, n_tasks, 1)]


def _plan_from_seed(seed: int, n_tasks: int, g: int) -> list[tuple[int, list[int]]]:
    # the draw order of envs/generate.py: a task seed, then the G sample seeds of that task
    master = random.Random(seed)
    out = []
    for _ in range(n_tasks):
        ts = master.randrange(2**31)
        out.append((ts, [master.randrange(2**31) for _ in range(g)]))
    return out


def _plan_from_list(seed: int, seeds, g: int) -> list[tuple[int, list[int]]]:
    out = []
    for ts in seeds:
        r = random.Random(f"rollout-{seed}-{int(ts)}")
        out.append((int(ts), [r.randrange(2**31) for _ in range(g)]))
    return out


@dataclass
class _Episode:
    """One episode's state during the rollout (internal)."""

    index: int
    group: int
    sample: int
    task_seed: int
    seed: int
    env: TextEnv
    oracle: Oracle | None
    prompt: list[int]
    rng: np.random.Generator
    pending: list[int] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    turn_ids: list[int] = field(default_factory=list)
    old_lp: list[float] = field(default_factory=list)
    roll_lp: list[float] = field(default_factory=list)
    o_values: list[float] = field(default_factory=list)
    o_adv: list[float] = field(default_factory=list)
    o_dec: list[int] = field(default_factory=list)
    o_turn: dict = field(default_factory=lambda: {"turn_v": [], "turn_q": [], "turn_adv": [], "turn_actions": []})
    rewards: list[float] = field(default_factory=list)
    success: bool = False
    stop_reason: str | None = None
    _ubuf: np.ndarray = field(default_factory=lambda: np.zeros(0))
    _upos: int = 0

    @property
    def length(self) -> int:
        return len(self.prompt) + len(self.ids)

    def uniform(self) -> float:
        if self._upos >= len(self._ubuf):
            self._ubuf = self.rng.random(_UBLOCK)
            self._upos = 0
        u = self._ubuf[self._upos]
        self._upos += 1
        return float(u)


class _Timer:
    def __init__(self):
        self.t: dict[str, float] = {}

    def add(self, name: str, t0: float) -> float:
        now = time.perf_counter()
        self.t[name] = self.t.get(name, 0.0) + now - t0
        return now


def sample_tokens(logits: torch.Tensor, u: torch.Tensor, temperature: float, top_p: float):
    """Sample one token per row by inverting the CDF with the uniforms ``u``.

    ``logits`` ``(n, V)``, ``u`` ``(n,)`` float64 in [0, 1). Returns ``(tokens (n,) int64,
    rollout_logprobs (n,), old_logprobs (n,))`` (float32): ``old = log softmax(logits)[tok]``,
    ``rollout = log q(tok)`` with ``q = softmax(logits / T)`` on the smallest set of most likely
    tokens whose mass reaches ``top_p`` (ties kept in id order), renormalized; at T = 0
    ``tok = argmax`` (lowest id on ties) and ``rollout = 0``.
    """
    logits = logits.float()
    lp1 = torch.log_softmax(logits, dim=-1)
    if temperature == 0:
        tok = torch.argmax(logits, dim=-1)
        roll = torch.zeros(len(tok), dtype=torch.float32, device=logits.device)
    else:
        lp = lp1 if temperature == 1 else torch.log_softmax(logits / temperature, dim=-1)
        u = u.to(device=logits.device, dtype=torch.float64)
        if top_p < 1:
            slp, order = torch.sort(lp, dim=-1, descending=True, stable=True)
            p = slp.double().exp()
            before = torch.cumsum(p, dim=-1) - p
            keep = before < top_p
            keep[:, 0] = True
            p = p * keep
            mass = p.sum(-1)
            k = torch.searchsorted(torch.cumsum(p, -1), (u * mass)[:, None], right=True)[:, 0]
            k = torch.minimum(k, keep.sum(-1) - 1)
            tok = order.gather(1, k[:, None])[:, 0]
            roll = (slp.gather(1, k[:, None])[:, 0].double() - mass.log()).float()
        else:
            p = lp.double().exp()
            cdf = torch.cumsum(p, dim=-1)
            k = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True)[:, 0]
            last = p.shape[1] - 1 - torch.argmax(torch.flip(p > 0, [1]).to(torch.int8), dim=1)
            tok = torch.minimum(k, last)
            roll = lp.gather(1, tok[:, None])[:, 0]
    old = lp1.gather(1, tok[:, None])[:, 0]
    if temperature == 1 and top_p == 1:
        roll = old
    return tok, roll, old


def _grow_cache():
    """A ``DynamicCache`` whose layers keep keys/values in buffers with spare room (capacity doubles),
    so appending one token writes in place instead of copying the whole cache (``torch.cat`` in
    ``DynamicLayer``). ``layer.keys``/``values`` are views of the used part, as the model expects."""
    from transformers.cache_utils import Cache, DynamicCache, DynamicLayer

    class GrowLayer(DynamicLayer):
        def set_kv(self, keys: torch.Tensor, values: torch.Tensor) -> None:
            self._k, self._v, self._n = keys, values, keys.shape[-2]
            self.keys, self.values = keys, values

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
                self.set_kv(key_states[..., :0, :], value_states[..., :0, :])
            n, q = self._n, key_states.shape[-2]
            if n + q > self._k.shape[-2]:
                cap = max(2 * self._k.shape[-2], n + q, 64)
                k = key_states.new_empty(*key_states.shape[:-2], cap, key_states.shape[-1])
                v = value_states.new_empty(*value_states.shape[:-2], cap, value_states.shape[-1])
                k[..., :n, :] = self._k[..., :n, :]
                v[..., :n, :] = self._v[..., :n, :]
                self._k, self._v = k, v
            self._k[..., n:n + q, :] = key_states
            self._v[..., n:n + q, :] = value_states
            self._n = n + q
            self.keys, self.values = self._k[..., :self._n, :], self._v[..., :self._n, :]
            return self.keys, self.values

    class GrowCache(DynamicCache):
        def __init__(self):
            Cache.__init__(self, layer_class_to_replicate=GrowLayer)

    return GrowCache()


#: the name under which :func:`_sdpa_grouped` is registered with transformers (during a rollout only)
SDPA_GROUPED = "mpo_viz_sdpa_grouped"


def _sdpa_grouped(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """transformers' SDPA attention (``integrations.sdpa_attention``), except that grouped key/value
    heads go to the kernel as they are (``enable_gqa``): transformers copies them out to every query
    head (``repeat_kv``) whenever a mask is passed, which on the CPU is every step of a padded batch.
    The same numbers; at 9 query / 3 key/value heads, 16 rows and 400 cached slots, 1.3 ms per layer
    instead of 4.9. ``query`` ``(B, Hq, q, D)``, ``key``/``value`` ``(B, Hkv, S, D)`` -> ``(B, q, Hq, D)``."""
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    causal = query.shape[2] > 1 and attention_mask is None and causal
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, is_causal=causal,
        enable_gqa=query.shape[1] != key.shape[1])
    return out.transpose(1, 2).contiguous(), None


@contextmanager
def _grouped_attention(model):
    """While the rollout decodes: a CPU model under SDPA whose key/value heads are fewer than its query
    heads runs :func:`_sdpa_grouped` (``set_attn_implementation``; set back to ``"sdpa"`` after)."""
    cfg = getattr(model, "config", None)
    heads, kv = getattr(cfg, "num_attention_heads", None), getattr(cfg, "num_key_value_heads", None)
    dev = next(model.parameters()).device
    if (getattr(cfg, "_attn_implementation", None) != "sdpa" or not heads or not kv or kv >= heads
            or dev.type != "cpu" or not hasattr(model, "set_attn_implementation")):
        yield
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(SDPA_GROUPED, _sdpa_grouped)
    AttentionMaskInterface.register(SDPA_GROUPED, sdpa_mask)
    model.set_attn_implementation(SDPA_GROUPED)
    try:
        yield
    finally:
        model.set_attn_implementation("sdpa")


def usable_cores() -> int:
    """The CPUs this process may run on (its affinity, which container limits set), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no sched_getaffinity (macOS, Windows)
        return os.cpu_count() or 1


def spare_cores() -> bool:
    """Whether a second thread with torch's thread count fits beside this one: at least twice
    ``torch.get_num_threads()`` usable cores (else two threads' torch work would share cores, which
    on a busy machine runs several times slower)."""
    return usable_cores() >= 2 * torch.get_num_threads()


def side_pool() -> ThreadPoolExecutor:
    """A one-worker thread pool for work beside this thread (the rollout's critic, the trainer's
    critic update). Its thread runs with this thread's torch thread count: a new thread would get
    OpenMP's default (every core)."""
    return ThreadPoolExecutor(1, initializer=torch.set_num_threads, initargs=(torch.get_num_threads(),))


def uses_sliding_window(config) -> bool:
    """Whether some attention layer of a Hugging Face ``config`` sees only a window of past tokens
    (Mistral's ``sliding_window``, Qwen2's with ``use_sliding_window``, Gemma 2/3's
    ``"sliding_attention"`` layers)."""
    if config is None:
        return False
    if "sliding_attention" in (getattr(config, "layer_types", None) or ()):
        return True
    return bool(getattr(config, "sliding_window", None)) and getattr(config, "use_sliding_window", True) is not False


class _Engine:
    """The shared cache of the live rows and the forward calls (internal)."""

    def __init__(self, model, pad_id: int):
        self.model = model
        self.device = next(model.parameters()).device
        self.pad_id = pad_id
        self.cache = _grow_cache()
        self.attn = torch.zeros(0, 0, dtype=torch.long, device=self.device)
        self.next_pos = torch.zeros(0, dtype=torch.long, device=self.device)
        self._keep = "logits_to_keep" in inspect.signature(model.forward).parameters
        # a one-token step under SDPA gets its 4-D mask made here: (B, 1, 1, S) bool, True = attend, i.e.
        # the 2-D padding mask itself (a one-token query sees every earlier slot; HF passes a 4-D mask
        # through as it is). HF's own mask builder costs ~5% of a decode step of a small model. Not for a
        # model with sliding-window layers: their window is part of the mask HF builds.
        config = getattr(model, "config", None)
        self._mask4 = (getattr(config, "_attn_implementation", None) in ("sdpa", SDPA_GROUPED)
                       and not uses_sliding_window(config))

    def _layers(self):
        return [layer for layer in getattr(self.cache, "layers", []) if getattr(layer, "is_initialized", False)
                and layer.keys is not None and layer.keys.numel()]

    def forward(self, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Append ``ids`` ``(B, W)`` (mask 0/1, positions) to the cache; the logits of the last column."""
        self.attn = torch.cat([self.attn, mask], dim=1)
        kw = {"logits_to_keep": 1} if self._keep else {}
        attn = self.attn[:, None, None, :].bool() if self._mask4 and ids.shape[1] == 1 else self.attn
        out = self.model(input_ids=ids, attention_mask=attn, position_ids=pos, past_key_values=self.cache,
                         use_cache=True, **kw)
        self.cache = out.past_key_values
        return out.logits[:, -1]

    def add_rows(self, n: int) -> None:
        """``n`` empty rows at the end (every slot masked)."""
        if n == 0:
            return
        self.attn = torch.cat([self.attn, self.attn.new_zeros(n, self.attn.shape[1])], 0)
        self.next_pos = torch.cat([self.next_pos, self.next_pos.new_zeros(n)])
        for layer in self._layers():
            z = layer.keys.new_zeros(n, *layer.keys.shape[1:])
            layer.set_kv(torch.cat([layer.keys, z], 0), torch.cat([layer.values, z], 0))

    def keep_rows(self, idx: list[int]) -> None:
        """Keep the rows ``idx`` (in that order), then drop the slots no row uses, moving each row's
        used slots to the right (left padding; the order of a row's slots is kept)."""
        ix = torch.tensor(idx, dtype=torch.long, device=self.device)
        self.attn = self.attn[ix]
        self.next_pos = self.next_pos[ix]
        if not len(idx):  # every row left: start over with an empty cache
            self.cache = _grow_cache()
            self.attn = self.attn[:, :0]
            return
        layers = self._layers()
        used = self.attn.sum(1)
        width = int(used.max())
        if width == self.attn.shape[1]:
            for layer in layers:
                layer.set_kv(layer.keys[ix], layer.values[ix])
            return
        # slot s of row b moves to width - used_b + (rank of s among b's used slots)
        S = self.attn.shape[1]
        rank = torch.cumsum(self.attn, 1) - 1
        dest = torch.where(self.attn.bool(), width - used[:, None] + rank, torch.full_like(rank, -1))
        src = torch.zeros(len(idx), width, dtype=torch.long, device=self.device)
        rows, cols = torch.nonzero(dest >= 0, as_tuple=True)
        src[rows, dest[rows, cols]] = cols
        new_attn = (torch.arange(width, device=self.device)[None, :] >= (width - used)[:, None]).long()
        for layer in layers:
            k, v = layer.keys[ix], layer.values[ix]
            g = src[:, None, :, None].expand(-1, k.shape[1], -1, k.shape[3])
            keep = new_attn[:, None, :, None].to(k.dtype)
            layer.set_kv(torch.gather(k, 2, g) * keep, torch.gather(v, 2, g) * keep)
        assert S >= width
        self.attn = new_attn


def rollout(policy: Policy, env, n_episodes: int | None = None, *, group_size: int = 1, critic=None,
            seed: int = 0, temperature: float = 1.0, top_p: float = 1.0, max_turn_tokens: int = 48,
            max_total_tokens: int = 1024, batch_size: int = 16, seeds=None,
            oracle: NoisyExpert | None = DEFAULT_ORACLE, progress: bool | None = None,
            timings: dict | None = None, critic_thread: bool | None = None) -> TrajectoryBatch:
    """Play ``n_episodes`` episodes of ``env`` with ``policy`` (see the module docstring).

    Args:
        policy: a :class:`~mpo_viz.models.Policy` (``tiny_policy``, ``load_policy``, ``models.load``).
        env: a :class:`~mpo_viz.envs.TextEnv` (copied per episode; its options are kept) or a
            registered environment name.
        n_episodes: trajectories in all, a multiple of ``group_size``; may be omitted with ``seeds``.
        group_size, seed, temperature, top_p, max_turn_tokens, max_total_tokens, batch_size, seeds:
            see :class:`RolloutConfig`. With ``seeds``, the same task seed and ``seed`` always give the
            same episodes, whatever else is in the list (reproducible, resumable evaluation sets).
        critic: a :class:`~mpo_viz.models.Critic`; its ``values`` are recorded (``values[t]`` = the
            critic's output at position ``P + t − 1``) and ``bootstrap_value`` on truncation.
        oracle: the noisy expert whose exact values are recorded beside (``oracle_values``,
            ``oracle_token_adv``, ``decisive``, ``extra_json.oracle``); None to skip.
        progress: a tqdm.auto bar over episodes (None: only on long rollouts in a terminal/notebook).
        timings: a dict that receives seconds per phase (``model``, ``sampling``, ``env``,
            ``tokenize``, ``oracle``, ``critic``, ``total``). ``critic``: the seconds the rollout
            waited for the critic after the last episode ended (with ``critic_thread``, the rest of
            the critic's forwards ran while the policy decoded).
        critic_thread: run the critic's forwards in a second thread, on the episodes of each batch
            turn as they finish, while the policy decodes the others (None: when the process may use
            at least twice torch's thread count in cores, :func:`spare_cores`, and the critic's
            trunk is not the policy's). The values are the same numbers either way (each sequence's
            forward is the same call); the CPU time is the same, the wall time shorter by what the
            two threads overlap.

    Returns:
        a validated :class:`~mpo_viz.trajectory.TrajectoryBatch` (one row per episode, in task then
        sample order), metadata ``values_source="critic"`` when a critic ran (``"untrained_critic"``
        while its value head is as initialized: :func:`mpo_viz.models.critic.values_source_of`).
    """
    env = _check_inputs(policy, env, critic)
    cfg = RolloutConfig(group_size=group_size, seed=seed, temperature=temperature, top_p=top_p,
                        max_turn_tokens=max_turn_tokens, max_total_tokens=max_total_tokens,
                        batch_size=batch_size, seeds=None if seeds is None else [int(s) for s in seeds])
    cfg.validate()
    plan = _plan(cfg, n_episodes)
    timer = _Timer()
    t_start = time.perf_counter()
    model = policy.model
    was_training = model.training
    model.eval()
    jobs = bar = None
    try:  # the model goes back to training mode, the bar closes and the critic's thread ends, whatever is raised
        pad_id = policy.tokenizer.pad_token_id
        pad_id = int(pad_id) if pad_id is not None else min(policy.layout.stop_ids)
        episodes = _episodes(env, plan, cfg, oracle, policy.layout, timer)
        bar = _progress_bar(len(episodes), progress)
        if critic_thread is None:  # a second core, and a critic that shares no module with the policy
            critic_thread = spare_cores() and not getattr(critic, "shared", False)
        if critic is not None:
            jobs = _CriticJobs(critic, cfg.batch_size, pad_id, thread=bool(critic_thread))
        with torch.no_grad(), _grouped_attention(model):
            _play(_Engine(model, pad_id), episodes, cfg, policy, timer, bar,
                  on_done=jobs.submit if jobs is not None else None)
        bar.close()
        bar = None
        values = boot = None
        if jobs is not None:
            t0 = time.perf_counter()
            values, boot = jobs.result(episodes)
            timer.add("critic", t0)
    finally:
        if bar is not None:
            bar.close()
        if jobs is not None:
            jobs.close()
        if was_training:
            model.train()
    t0 = time.perf_counter()
    batch = _to_batch(episodes, env, policy.layout, cfg, values, boot, oracle, policy)
    if values is not None:  # "untrained_critic" while the critic's value head is as initialized
        batch.meta["values_source"] = values_source_of(critic)
    timer.add("batch", t0)
    timer.t["total"] = time.perf_counter() - t_start
    if timings is not None:
        timings.update(timer.t)
    return batch


def _check_inputs(policy: Policy, env, critic) -> TextEnv:
    """The environment (a name made into one); ``OptionError`` for a wrong policy, environment or
    critic, ``ValueError`` for a tokenizer that does not fit the environment or the model."""
    if not isinstance(policy, Policy):
        raise OptionError("policy", f"expected a mpo_viz.models.Policy (tiny_policy, load_policy, models.load), "
                                    f"found {type(policy).__name__}")
    if isinstance(env, str):
        env = make_env(env)
    if not isinstance(env, TextEnv):
        raise OptionError("env", f"expected a TextEnv or an environment name, found {type(env).__name__}")
    if critic is not None and not callable(critic):
        raise OptionError("critic", f"expected a mpo_viz.models.Critic or None, found {type(critic).__name__}")
    check_vocabulary(policy.tokenizer, env.vocabulary(), where=f"policy {policy.name} for env {env.name!r}")
    vocab = embedding_rows(policy.model)
    if len(policy.tokenizer) > vocab:
        raise ValueError(f"policy {policy.name}: the tokenizer has {len(policy.tokenizer)} tokens, the model "
                         f"embeds {vocab}")
    return env


def _plan(cfg: RolloutConfig, n_episodes: int | None) -> list[tuple[int, list[int]]]:
    """``[(task seed, [sample seeds])]``: the tasks drawn from ``cfg.seed``, or ``cfg.seeds``."""
    g = cfg.group_size
    if cfg.seeds is None:
        if n_episodes is None or isinstance(n_episodes, bool) or n_episodes < 1 or n_episodes % g:
            raise OptionError("n_episodes", f"expected a positive multiple of group_size={g}, found {n_episodes!r}")
        return _plan_from_seed(cfg.seed, n_episodes // g, g)
    if n_episodes is not None and n_episodes != len(cfg.seeds) * g:
        raise OptionError("n_episodes", f"expected len(seeds) * group_size = {len(cfg.seeds) * g} with seeds, "
                                        f"found {n_episodes}")
    return _plan_from_list(cfg.seed, cfg.seeds, g)


def _episodes(env: TextEnv, plan, cfg: RolloutConfig, oracle, layout, timer: _Timer) -> list[_Episode]:
    """The episodes of the plan, reset and prompted, in task then sample order."""
    episodes: list[_Episode] = []
    # each episode plays a deep copy of the environment's options: not of the episode the caller's
    # instance last played (its task, state and messages are replaced by reset, and copying them cost
    # ~30 ms per episode after a trainer's SFT)
    blank = copy.copy(env)
    blank.task, blank.state, blank.messages = None, None, []
    for gi, (ts, sample_seeds) in enumerate(plan):
        task = env.make_task(ts)
        orc = None
        for j, es in enumerate(sample_seeds):
            e = copy.deepcopy(blank)
            e.reset(seed=es, task=task)
            if oracle is not None and orc is None:
                orc = _make_oracle(e, oracle, layout)
            t0 = time.perf_counter()
            prompt = layout.prompt(e.messages)
            timer.add("tokenize", t0)
            if len(prompt) >= cfg.max_total_tokens:
                raise OptionError("max_total_tokens", f"expected more than the prompt of task {ts} "
                                                      f"({len(prompt)} tokens), found {cfg.max_total_tokens}")
            rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([cfg.seed, ts, es, 0x6D706F])))
            episodes.append(_Episode(index=len(episodes), group=gi, sample=j, task_seed=ts, seed=es, env=e,
                                     oracle=orc, prompt=prompt, rng=rng, pending=list(prompt)))
    return episodes


def _play(engine: _Engine, episodes: list[_Episode], cfg: RolloutConfig, policy: Policy, timer: _Timer, bar,
          on_done=None) -> None:
    """Play every episode to its end: batch turns of up to ``batch_size`` live episodes, queued
    ones joining as others finish (the module docstring's feed / decode / step); ``on_done`` gets
    the episodes that ended in each batch turn."""
    queue = deque(episodes)
    live: list[_Episode] = []
    stop = torch.tensor(sorted(policy.layout.stop_ids), dtype=torch.long, device=policy.device)
    while queue or live:
        n_new = min(cfg.batch_size - len(live), len(queue))  # admit queued episodes into free rows
        engine.add_rows(n_new)
        live += [queue.popleft() for _ in range(n_new)]
        logits = _feed(engine, live, timer)
        turn = _decode_turn(engine, live, logits, cfg, stop, timer)
        keep = _step_envs(live, turn, cfg, policy.layout, timer, bar)
        if on_done is not None and len(keep) < len(live):
            kept = set(keep)
            on_done([ep for b, ep in enumerate(live) if b not in kept])
        t0 = time.perf_counter()
        engine.keep_rows(keep)
        live = [live[b] for b in keep]
        timer.add("model", t0)


def _feed(engine: _Engine, live: list[_Episode], timer: _Timer) -> torch.Tensor:
    """1. Every row's pending tokens through the model in one forward, left-padded to the longest;
    the logits of the last position."""
    t0 = time.perf_counter()
    width = max(len(ep.pending) for ep in live)
    ids = torch.full((len(live), width), engine.pad_id, dtype=torch.long)
    msk = torch.zeros((len(live), width), dtype=torch.long)
    pos = torch.zeros((len(live), width), dtype=torch.long)
    start = engine.next_pos.cpu()
    for b, ep in enumerate(live):
        n = len(ep.pending)
        ids[b, width - n:] = torch.tensor(ep.pending)
        msk[b, width - n:] = 1
        pos[b, width - n:] = start[b] + torch.arange(n)
        ep.pending = []
    dev = engine.device
    engine.next_pos = engine.next_pos + msk.sum(1).to(dev)
    logits = engine.forward(ids.to(dev), msk.to(dev), pos.to(dev))
    timer.add("model", t0)
    return logits


@dataclass
class _Turn:
    """One batch turn as decoded: per row the sampled tokens, their rollout and old log-probs (row
    ``b``'s first ``counts[b]`` columns), and the total budget left before it."""

    tokens: torch.Tensor
    rollout_logp: torch.Tensor
    old_logp: torch.Tensor
    counts: list
    budget_total: list


def _decode_turn(engine: _Engine, live: list[_Episode], logits: torch.Tensor, cfg: RolloutConfig,
                 stop: torch.Tensor, timer: _Timer) -> _Turn:
    """2. Sample one turn for every row at once: one-token forwards with the cache until every row
    hit its stop token or budget (a row whose turn ended feeds padding)."""
    t0 = time.perf_counter()
    dev = engine.device
    budget_total = torch.tensor([cfg.max_total_tokens - ep.length for ep in live])
    budget = torch.clamp(budget_total, max=cfg.max_turn_tokens).to(dev)
    active = torch.ones(len(live), dtype=torch.bool, device=dev)
    count = torch.zeros(len(live), dtype=torch.long, device=dev)
    toks, rlps, olps = [], [], []
    while True:
        u = torch.tensor([ep.uniform() if a else 0.0 for ep, a in zip(live, active.tolist())], dtype=torch.float64)
        tok, rlp, olp = sample_tokens(logits, u, cfg.temperature, cfg.top_p)
        toks.append(tok)
        rlps.append(rlp)
        olps.append(olp)
        count = count + active.long()
        now_active = active & ~(torch.isin(tok, stop) | (count >= budget))
        t0 = timer.add("sampling", t0)
        if not bool(now_active.any()):
            break
        col = now_active.long()[:, None]
        step_ids = torch.where(now_active, tok, torch.full_like(tok, engine.pad_id))[:, None]
        step_pos = engine.next_pos[:, None].clone()
        engine.next_pos = engine.next_pos + col[:, 0]
        logits = engine.forward(step_ids, col, step_pos)
        active = now_active
        t0 = timer.add("model", t0)
    return _Turn(torch.stack(toks, 1).cpu(), torch.stack(rlps, 1).float().cpu(), torch.stack(olps, 1).float().cpu(),
                 count.cpu().tolist(), budget_total.tolist())


def _step_envs(live: list[_Episode], turn: _Turn, cfg: RolloutConfig, layout, timer: _Timer, bar) -> list[int]:
    """3. Each environment reads its row's turn; the rows whose episode goes on (their pending
    tokens set: the last sampled token and the observation), the finished ones counted."""
    keep = []
    for b, ep in enumerate(live):
        n, bt = turn.counts[b], turn.budget_total[b]
        ids = turn.tokens[b, :n].tolist()
        ended_by_stop = ids[-1] in layout.stop_ids
        cut_by_total = (not ended_by_stop) and n >= bt and bt <= cfg.max_turn_tokens
        _record_turn(ep, ids, turn.rollout_logp[b, :n].tolist(), turn.old_logp[b, :n].tolist(), layout, timer,
                     final_cut=cut_by_total)
        ep.pending = [ids[-1]]  # the last sampled token was never fed
        if ep.stop_reason is None and ep.length >= cfg.max_total_tokens:
            ep.stop_reason = "max_total_tokens"
        if ep.stop_reason is None:
            ep.pending += ep.ids[len(ep.ids) - _obs_len(ep):]
            keep.append(b)
        else:
            bar.update(1)
    return keep


def _progress_bar(n: int, progress: bool | None):
    from tqdm.auto import tqdm

    disable = (not progress) if progress is not None else (True if n < 64 else None)
    return tqdm(total=n, desc="rollout", unit="ep", disable=disable, leave=False)


def _make_oracle(env: TextEnv, expert: NoisyExpert, layout) -> Oracle | None:
    try:
        orc = Oracle(env, expert, gamma=1.0, encode=layout.action)
        orc.value(env.state)
        return orc
    except NotImplementedError:  # an environment without an exact model: no oracle columns
        return None


def _obs_len(ep: _Episode) -> int:
    n = 0
    for m in reversed(ep.mask):
        if m:
            break
        n += 1
    return n


def _record_turn(ep: _Episode, turn: list[int], rlp: list[float], olp: list[float], layout, timer: _Timer,
                 *, final_cut: bool) -> None:
    """Append one sampled turn (and, unless cut by the total budget, the environment's reply)."""
    k = len(ep.rewards)
    t0 = time.perf_counter()
    text = layout.text(turn)
    t0 = timer.add("tokenize", t0)
    env = ep.env
    state = env.state
    ep.ids += turn
    ep.mask += [1] * len(turn)
    ep.turn_ids += [k] * len(turn)
    ep.roll_lp += rlp
    ep.old_lp += olp
    if final_cut:  # the total budget cut this turn: the environment never sees it
        if ep.oracle is not None:
            to = ep.oracle.turn(state, turn, None)
            ep.o_values += to.values.tolist()
            ep.o_adv += to.token_adv.tolist()
            ep.o_dec += to.decisive.astype(int).tolist()
            timer.add("oracle", t0)
        ep.rewards.append(0.0)
        ep.stop_reason = "max_total_tokens"
        return
    obs, r, term, trunc, info = env.step(text)
    t0 = timer.add("env", t0)
    ep.rewards.append(float(r))
    ep.success = bool(info["success"])
    if term:
        ep.stop_reason = "terminated"
    elif trunc:
        ep.stop_reason = "turn_limit"
    otoks = layout.observation(env.obs_role, obs, final=env.done)
    t0 = timer.add("tokenize", t0)
    ep.ids += otoks
    ep.mask += [0] * len(otoks)
    ep.turn_ids += [k] * len(otoks)
    ep.roll_lp += [0.0] * len(otoks)
    ep.old_lp += [0.0] * len(otoks)
    if ep.oracle is not None:
        to = ep.oracle.turn(state, turn, info["action"])
        v_next = 0.0 if env.done else ep.oracle.value(env.state)
        ep.o_values += to.values.tolist() + [v_next] * len(otoks)
        ep.o_adv += to.token_adv.tolist() + [0.0] * len(otoks)
        ep.o_dec += to.decisive.astype(int).tolist() + [0] * len(otoks)
        o = ep.o_turn
        o["turn_v"].append(to.v)
        o["turn_q"].append(to.q)
        o["turn_adv"].append(to.q - to.v)
        o["turn_actions"].append(info["action"])
        timer.add("oracle", t0)


class _CriticJobs:
    """The critic's values of finished episodes: with ``thread``, computed in one worker thread as
    each batch turn's finished episodes are handed in (:meth:`submit`), while the policy decodes the
    rest; otherwise (or for episodes never handed in) all at the end, in :meth:`result` (internal).
    The worker runs in a :func:`side_pool`."""

    def __init__(self, critic, batch_size: int, pad_id: int, *, thread: bool):
        self.critic, self.batch_size, self.pad_id = critic, batch_size, pad_id
        self.pool = side_pool() if thread else None
        self.jobs: list = []

    def submit(self, finished: list[_Episode]) -> None:
        if self.pool is not None and finished:
            self.jobs.append((finished, self.pool.submit(self._values, finished)))

    def _values(self, eps: list[_Episode]):
        return _critic_values(self.critic, eps, self.batch_size, self.pad_id)

    def result(self, episodes: list[_Episode]):
        """``(values, last)`` per episode index, as :func:`_critic_values` gives them."""
        vals: list = [None] * len(episodes)
        last: list = [None] * len(episodes)
        for eps, fut in self.jobs:
            for ep, v, b in zip(eps, *fut.result()):
                vals[ep.index], last[ep.index] = v, b
        rest = [ep for ep in episodes if vals[ep.index] is None]
        if rest:
            for ep, v, b in zip(rest, *self._values(rest)):
                vals[ep.index], last[ep.index] = v, b
        return vals, last

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)


def _critic_values(critic, episodes: list[_Episode], batch_size: int, pad_id: int, per_sequence: bool | None = None):
    """Per episode: ``values`` (L,) with ``values[t]`` = critic output at ``P + t − 1``, and the output
    at the last position ``P + L − 1`` (the value after the response).

    On the CPU each finished sequence goes through the critic alone, unpadded: the trunk's matmuls
    then cost the real tokens only, and without an attention mask the causal attention skips the
    masked upper triangle (a padded batch pays for the padding and for the full ``(T, T)`` mask:
    twice the time at 64 episodes of 300–540 tokens). On an accelerator, where one sequence leaves
    the device idle, batches of ``batch_size`` sequences of similar lengths (right padding,
    positions 0..). Both give the direct forward's numbers (``critic(prompt + response)``).
    ``per_sequence``: force one way (None: unpadded on the CPU).
    """
    dev = next(critic.parameters()).device
    vals: list = [None] * len(episodes)
    last: list = [None] * len(episodes)
    step = 1 if (dev.type == "cpu" if per_sequence is None else per_sequence) else batch_size
    order = sorted(range(len(episodes)), key=lambda i: episodes[i].length)  # similar lengths together
    for s in range(0, len(order), step):
        chunk = order[s:s + step]
        width = max(episodes[i].length for i in chunk)
        ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
        att = torch.zeros((len(chunk), width), dtype=torch.long)
        for b, i in enumerate(chunk):
            seq = episodes[i].prompt + episodes[i].ids
            ids[b, :len(seq)] = torch.tensor(seq)
            att[b, :len(seq)] = 1
        with torch.no_grad():  # one unpadded row: no mask at all (the causal kernel)
            out = critic(ids.to(dev), attention_mask=None if len(chunk) == 1 else att.to(dev)).float().cpu()
        for b, i in enumerate(chunk):
            p, n = len(episodes[i].prompt), len(episodes[i].ids)
            vals[i] = out[b, p - 1:p + n - 1].numpy().astype(np.float32)
            last[i] = float(out[b, p + n - 1])
    return vals, last


def _to_batch(episodes, env, layout, cfg: RolloutConfig, values, boot, oracle, policy) -> TrajectoryBatch:
    shaped = env.shaping != 0.0
    rows: list[dict] = []
    extra: dict[str, list] = {name: [] for name in ORACLE_TOKEN_FIELDS}
    has_oracle = oracle is not None and all(ep.oracle is not None for ep in episodes)
    for ep in episodes:
        gid = f"{env.name}-s{cfg.seed}-t{ep.group:04d}"
        truncated = ep.stop_reason in ("turn_limit", "max_total_tokens")
        info = {"env": env.name, "task_seed": ep.task_seed, "seed": ep.seed, "success": ep.success,
                "needed_turns": env.needed_turns(ep.env.task), "turn_limit": ep.env.turn_limit}
        if has_oracle:
            info["oracle"] = {k: ([round(x, 9) for x in v] if k != "turn_actions" else v)
                              for k, v in ep.o_turn.items()}
        row = {
            "traj_id": f"{gid}-{ep.sample}",
            "group_id": gid,
            "sample_idx": ep.sample,
            "prompt_ids": ep.prompt,
            "response_ids": ep.ids,
            "loss_mask": ep.mask,
            "turn_ids": ep.turn_ids,
            "rollout_logprobs": np.asarray(ep.roll_lp, dtype=np.float32),
            "old_logprobs": np.asarray(ep.old_lp, dtype=np.float32),
            "response_tokens": layout.tokens(ep.ids),
            "messages_json": json.dumps(ep.env.messages),
            "reward": float("nan") if shaped else float(sum(ep.rewards)),
            "num_turns": len(ep.rewards),
            "stop_reason": ep.stop_reason,
            "truncated": truncated,
            "extra_json": json.dumps(info),
        }
        if shaped:
            row["turn_rewards"] = ep.rewards
        if values is not None:
            row["values"] = values[ep.index]
            row["bootstrap_value"] = boot[ep.index] if ep.stop_reason == "max_total_tokens" else float("nan")
        if has_oracle:
            extra["oracle_values"].append(np.asarray(ep.o_values, dtype=np.float32))
            extra["oracle_token_adv"].append(np.asarray(ep.o_adv, dtype=np.float32))
            extra["decisive"].append(np.asarray(ep.o_dec, dtype=np.float32))
        rows.append(row)
    meta = {
        "tokenizer": policy.path or f"mpo_viz.envs.build_tokenizer({env.name!r})",
        "source_framework": "mpo_viz.rollout",
        "policy": policy.name,
        "generator": {"env": env.name, **dataclasses.asdict(cfg),
                      "oracle_noise": oracle.noise if oracle is not None else None},
    }
    if values is not None:
        meta["values_source"] = "critic"
    batch = TrajectoryBatch.from_rows(rows, meta=meta)
    return batch.with_token_fields(**extra) if has_oracle else batch
