"""The decoding engine: token sampling by CDF inversion, the growing key/value cache shared by the
live rows, grouped-head attention, and the thread helpers (see :mod:`mpo_viz.rollout`)."""

from __future__ import annotations

import inspect
import os
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import torch


def sample_tokens(logits: torch.Tensor, u: torch.Tensor, temperature: float, top_p: float):
    """Sample one token per row by inverting the CDF with the uniforms ``u``.

    ``logits`` ``(n, V)``, ``u`` ``(n,)`` float64 in [0, 1). Returns ``(tokens (n,) int64,
    rollout_logprobs (n,), old_logprobs (n,), entropy (n,))`` (float32): ``old = log softmax(logits)[tok]``,
    ``rollout = log q(tok)`` with ``q = softmax(logits / T)`` on the smallest set of most likely
    tokens whose mass reaches ``top_p`` (ties kept in id order), renormalized; at T = 0
    ``tok = argmax`` (lowest id on ties) and ``rollout = 0``. ``entropy`` is that of the policy's own
    distribution ``p = softmax(logits)`` at T = 1 with no top-p, whatever ``temperature`` and ``top_p``
    the token was sampled with: ``H = −Σ_v p_v log p_v`` with ``0·log 0 = 0`` (a ``−inf`` logit adds
    nothing), computed from the ``log_softmax`` that ``old`` reads (one more reduction over V).
    """
    logits = logits.float()
    lp1 = torch.log_softmax(logits, dim=-1)
    p1 = lp1.exp()
    ent = -(p1 * torch.where(p1 > 0, lp1, 0.0)).sum(-1)  # 0·log 0 = 0 where a logit is -inf
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
    return tok, roll, old, ent


def sampling_probs(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """The distribution :func:`sample_tokens` draws from, ``(n, V)`` float64: ``q = softmax(logits / T)``
    on the smallest set of most likely tokens whose mass reaches ``top_p`` (ties kept in id order),
    renormalized; at T = 0 a point mass on ``argmax`` (the lowest id on ties). ``q[a]`` is the policy's
    probability of writing token ``a`` next, as its continuations sample (the token truth's
    ``π(a_t | h_t)``, :mod:`mpo_viz.rollout.inturn`)."""
    logits = logits.float()
    if temperature == 0:
        q = torch.zeros(logits.shape, dtype=torch.float64, device=logits.device)
        q[torch.arange(len(logits), device=logits.device), torch.argmax(logits, dim=-1)] = 1.0
        return q
    lp = torch.log_softmax(logits if temperature == 1 else logits / temperature, dim=-1)
    if top_p >= 1:
        p = lp.double().exp()
        return p / p.sum(-1, keepdim=True)
    slp, order = torch.sort(lp, dim=-1, descending=True, stable=True)
    p = slp.double().exp()
    keep = (torch.cumsum(p, dim=-1) - p) < top_p
    keep[:, 0] = True
    p = p * keep
    q = torch.zeros_like(p).scatter_(1, order, p)
    return q / q.sum(-1, keepdim=True)


def sample_excluding(logits: torch.Tensor, u: torch.Tensor, exclude: torch.Tensor, temperature: float, top_p: float):
    """Sample one token per row from :func:`sampling_probs` with token ``exclude[b]`` removed and the rest
    renormalized (``q(·)/(1 − q(exclude))`` off it; a row with ``exclude[b] < 0`` removes nothing), by
    inverting the CDF in id order with the uniforms ``u``. Returns what :func:`sample_tokens` returns;
    ``rollout_logprobs`` are those of the renormalized distribution. ``ValueError`` when a row's
    excluded token holds all of its mass (there is nothing else to sample)."""
    lp1 = torch.log_softmax(logits.float(), dim=-1)
    p1 = lp1.exp()
    ent = -(p1 * torch.where(p1 > 0, lp1, 0.0)).sum(-1)
    q = sampling_probs(logits, temperature, top_p)
    rows = torch.arange(len(q), device=q.device)
    ex = exclude.to(device=q.device, dtype=torch.long)
    has = ex >= 0
    q[rows[has], ex[has]] = 0.0
    mass = q.sum(-1)
    if bool((mass <= 0).any()):
        b = int(torch.nonzero(mass <= 0)[0, 0])
        raise ValueError(
            f"row {b}: the excluded token {int(ex[b])} holds all of the sampling distribution's mass; "
            "there is no other token to sample"
        )
    cdf = torch.cumsum(q, dim=-1)
    u = u.to(device=q.device, dtype=torch.float64)
    k = torch.searchsorted(cdf, (u * mass)[:, None], right=True)[:, 0]
    last = q.shape[1] - 1 - torch.argmax(torch.flip(q > 0, [1]).to(torch.int8), dim=1)
    tok = torch.minimum(k, last)
    roll = (q.gather(1, tok[:, None])[:, 0] / mass).log().float()
    return tok, roll, lp1.gather(1, tok[:, None])[:, 0], ent


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
            self._k[..., n : n + q, :] = key_states
            self._v[..., n : n + q, :] = value_states
            self._n = n + q
            self.keys, self.values = self._k[..., : self._n, :], self._v[..., : self._n, :]
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
        query,
        key,
        value,
        attn_mask=attention_mask,
        dropout_p=dropout,
        scale=scaling,
        is_causal=causal,
        enable_gqa=query.shape[1] != key.shape[1],
    )
    return out.transpose(1, 2).contiguous(), None


@contextmanager
def grouped_attention(model):
    """While the rollout decodes: a CPU model under SDPA whose key/value heads are fewer than its query
    heads runs :func:`_sdpa_grouped` (``set_attn_implementation``; set back to ``"sdpa"`` after)."""
    cfg = getattr(model, "config", None)
    heads, kv = getattr(cfg, "num_attention_heads", None), getattr(cfg, "num_key_value_heads", None)
    dev = next(model.parameters()).device
    if (
        getattr(cfg, "_attn_implementation", None) != "sdpa"
        or not heads
        or not kv
        or kv >= heads
        or dev.type != "cpu"
        or not hasattr(model, "set_attn_implementation")
    ):
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


class Engine:
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
        self._mask4 = getattr(config, "_attn_implementation", None) in (
            "sdpa",
            SDPA_GROUPED,
        ) and not uses_sliding_window(config)

    def _layers(self):
        return [
            layer
            for layer in getattr(self.cache, "layers", [])
            if getattr(layer, "is_initialized", False) and layer.keys is not None and layer.keys.numel()
        ]

    def forward(self, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Append ``ids`` ``(B, W)`` (mask 0/1, positions) to the cache; the logits of the last column."""
        self.attn = torch.cat([self.attn, mask], dim=1)
        kw = {"logits_to_keep": 1} if self._keep else {}
        attn = self.attn[:, None, None, :].bool() if self._mask4 and ids.shape[1] == 1 else self.attn
        out = self.model(
            input_ids=ids, attention_mask=attn, position_ids=pos, past_key_values=self.cache, use_cache=True, **kw
        )
        self.cache = out.past_key_values
        return out.logits[:, -1]

    def forward_tail(self, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor, n: int) -> torch.Tensor:
        """:meth:`forward`, but the logits of the last ``n`` columns, ``(B, n, V)`` (column ``j`` of the
        result is input column ``W − n + j``): the next-token logits after each of a row's last tokens."""
        self.attn = torch.cat([self.attn, mask], dim=1)
        kw = {"logits_to_keep": n} if self._keep else {}
        out = self.model(
            input_ids=ids, attention_mask=self.attn, position_ids=pos, past_key_values=self.cache, use_cache=True, **kw
        )
        self.cache = out.past_key_values
        return out.logits[:, -n:]

    def add_rows(self, n: int) -> None:
        """``n`` empty rows at the end (every slot masked)."""
        if n == 0:
            return
        self.attn = torch.cat([self.attn, self.attn.new_zeros(n, self.attn.shape[1])], 0)
        self.next_pos = torch.cat([self.next_pos, self.next_pos.new_zeros(n)])
        for layer in self._layers():
            z = layer.keys.new_zeros(n, *layer.keys.shape[1:])
            layer.set_kv(torch.cat([layer.keys, z], 0), torch.cat([layer.values, z], 0))

    def append(self, other: Engine) -> None:
        """The rows of ``other`` (an engine of the same model) placed below this one's: the shorter
        side's slots padded on the left (masked), so every row keeps its slots, positions and cache."""
        if self.attn.shape[0] == 0:
            self.cache, self.attn, self.next_pos = other.cache, other.attn, other.next_pos
            return
        a, b = self.attn.shape[1], other.attn.shape[1]
        w = max(a, b)
        pad = torch.nn.functional.pad
        self.attn = torch.cat([pad(self.attn, (w - a, 0)), pad(other.attn, (w - b, 0))], 0)
        self.next_pos = torch.cat([self.next_pos, other.next_pos])
        for mine, theirs in zip(self._layers(), other._layers(), strict=True):
            mine.set_kv(
                torch.cat([pad(mine.keys, (0, 0, w - a, 0)), pad(theirs.keys, (0, 0, w - b, 0))], 0),
                torch.cat([pad(mine.values, (0, 0, w - a, 0)), pad(theirs.values, (0, 0, w - b, 0))], 0),
            )

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
