"""The rollout: :func:`rollout` plays episodes in batch turns (feed, decode, step; see
:mod:`mpo_viz.rollout`)."""

from __future__ import annotations

import math
import time
import warnings
from collections import deque
from collections.abc import Callable

import torch

from mpo_viz.checks import OptionError, outside_stacklevel
from mpo_viz.data.trajectory import TrajectoryBatch
from mpo_viz.envs.base import TextEnv
from mpo_viz.envs.expert import NoisyExpert
from mpo_viz.envs.protocol import as_env
from mpo_viz.envs.registry import make_env
from mpo_viz.envs.tokenizer import UnknownText, UnknownTextWarning
from mpo_viz.models.critic import values_source_of
from mpo_viz.models.policy import Policy, check_vocabulary, embedding_rows
from mpo_viz.rollout.batch import to_batch
from mpo_viz.rollout.critic import CriticJobs
from mpo_viz.rollout.engine import Engine, grouped_attention, sample_excluding, sample_tokens, spare_cores
from mpo_viz.rollout.episodes import Episode, Turn, make_episodes, step_envs
from mpo_viz.rollout.plan import DEFAULT_ORACLE, RolloutConfig, plan_tasks
from mpo_viz.timer import Timer

#: the estimated seconds from which a rollout whose model writes no stop token says how long it will
#: take (:func:`estimate_notice`)
NOTICE_AFTER_S = 10.0


def rollout(
    policy: Policy,
    env,
    n_episodes: int | None = None,
    *,
    group_size: int = 1,
    critic=None,
    seed: int = 0,
    temperature: float = 1.0,
    top_p: float = 1.0,
    max_turn_tokens: int = 48,
    max_total_tokens: int = 1024,
    batch_size: int = 16,
    seeds=None,
    oracle: NoisyExpert | None = DEFAULT_ORACLE,
    progress: bool | None = None,
    timings: dict | None = None,
    critic_thread: bool | None = None,
    notice: Callable[[str], None] | None = None,
    warn_unknown: bool = True,
) -> TrajectoryBatch:
    """Play ``n_episodes`` episodes of ``env`` with ``policy`` (see the module docstring).

    Args:
        policy: a :class:`~mpo_viz.models.Policy` (``tiny_policy``, ``load_policy``, ``models.load``).
        env: a :class:`~mpo_viz.envs.TextEnv` (copied per episode; its options are kept), an object
            with the protocol's ``reset``/``step`` (:mod:`mpo_viz.envs.protocol`: no oracle columns) or an
            environment name (registered, an entry point's, or ``package.module:factory``).
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
        notice: receives one line after the third batch turn when most turns of the first ran to
            ``max_turn_tokens`` without a stop token (an untrained model) and the rollout will take
            :data:`NOTICE_AFTER_S` or more: how long, and how to make a first look cheaper
            (:func:`estimate_notice`).
        warn_unknown: warn (:class:`~mpo_viz.envs.tokenizer.UnknownTextWarning`) when text of the
            environment's prompts or observations became the tokenizer's unknown token; the counts
            and examples are in the metadata's ``unknown_text`` either way.

    Returns:
        a validated :class:`~mpo_viz.data.trajectory.TrajectoryBatch` (one row per episode, in task then
        sample order), metadata ``values_source="critic"`` when a critic ran (``"untrained_critic"``
        while its value head is as initialized: :func:`mpo_viz.models.critic.values_source_of`).
    """
    env = _check_inputs(policy, env, critic)
    cfg = RolloutConfig(
        group_size=group_size,
        seed=seed,
        temperature=temperature,
        top_p=top_p,
        max_turn_tokens=max_turn_tokens,
        max_total_tokens=max_total_tokens,
        batch_size=batch_size,
        seeds=None if seeds is None else [int(s) for s in seeds],
    )
    cfg.validate()
    plan = plan_tasks(cfg, n_episodes)
    timer = Timer()
    t_start = time.perf_counter()
    model = policy.model
    was_training = model.training
    model.eval()
    jobs = bar = None
    unknown = getattr(policy.layout, "unknown", None)
    mark = unknown.copy() if unknown is not None else None
    try:  # the model goes back to training mode, the bar closes and the critic's thread ends, whatever is raised
        pad_id = policy.tokenizer.pad_token_id
        pad_id = int(pad_id) if pad_id is not None else min(policy.layout.stop_ids)
        episodes = make_episodes(env, plan, cfg, oracle, policy.layout, timer)
        bar = _progress_bar(len(episodes), progress)
        if critic_thread is None:  # a second core, and a critic that shares no module with the policy
            critic_thread = spare_cores() and not getattr(critic, "shared", False)
        if critic is not None:
            jobs = CriticJobs(critic, cfg.batch_size, pad_id, thread=bool(critic_thread))
        with torch.no_grad(), grouped_attention(model):
            _play(
                Engine(model, pad_id),
                episodes,
                cfg,
                policy,
                timer,
                bar,
                on_done=jobs.submit if jobs is not None else None,
                notice=notice,
            )
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
    batch = to_batch(episodes, env, policy.layout, cfg, values, boot, oracle, policy)
    if values is not None:  # "untrained_critic" while the critic's value head is as initialized
        batch.meta["values_source"] = values_source_of(critic)
    if unknown is not None and mark is not None:
        report_unknown(batch, unknown.since(mark), policy, warn=warn_unknown)
    timer.add("batch", t0)
    timer.t["total"] = time.perf_counter() - t_start
    if timings is not None:
        timings.update(timer.t)
    return batch


def report_unknown(batch: TrajectoryBatch, lost: UnknownText, policy: Policy, *, warn: bool = True) -> None:
    """Record in ``batch.meta["unknown_text"]`` the text of the rollout's prompts and observations that
    the policy's tokenizer mapped to its unknown token (per source, with examples), and warn with
    one line (:class:`~mpo_viz.envs.tokenizer.UnknownTextWarning`) when ``warn``."""
    if not lost:
        return
    batch.meta["unknown_text"] = lost.summary()
    if warn:
        warnings.warn(
            lost.line(f"the tokenizer of policy {policy.name}"), UnknownTextWarning, stacklevel=outside_stacklevel()
        )


def estimate_notice(
    cfg: RolloutConfig,
    n_episodes: int,
    seconds: tuple[float, float],
    rows: int,
    cut: int,
    turns: int | None,
    prompt_len: int,
) -> tuple[float, str]:
    """``(seconds, line)``: how long a rollout whose model does not end its turns (an untrained one)
    takes, and how to make a first look cheaper. Every turn runs to ``max_turn_tokens`` and every
    episode to its turn limit (``turns``; None: as many turns as ``max_total_tokens`` holds), in
    ``ceil(n_episodes / batch_size)`` rounds of ``T`` batch turns, each costing at least the mean of
    ``seconds`` (the second and third batch turns; the first also fed the prompts): a lower bound, as
    every later turn reads a longer context (measured: about half the real time at 20 turns; the
    growth is too noisy to extrapolate from two turns on a busy machine). ``cut``: of the first batch
    turn's ``rows`` turns, those that ran to ``max_turn_tokens``."""
    if turns is None:
        turns = max(1, (cfg.max_total_tokens - prompt_len) // max(cfg.max_turn_tokens, 1))
    t2, t3 = seconds
    rounds = math.ceil(n_episodes / max(min(cfg.batch_size, n_episodes), 1))
    secs = rounds * turns * (t2 + t3) / 2
    line = (
        f"rollout: {cut} of the first {rows} turns ran to max_turn_tokens={cfg.max_turn_tokens} without a stop "
        f"token (an untrained model does not end its turns), so every episode runs to its turn limit ({turns} "
        f"turns): {n_episodes} episodes take {secs:.0f} s at least ({rounds} x {turns} batch turns of "
        f"{(t2 + t3) / 2:.2f} s or more: each later turn reads a longer context). A cheaper first look: fewer "
        f"tokens per turn (--max-turn-tokens 8), fewer episodes (--episodes 8), or a lower turn limit "
        f"(--max-turns 3); or start from a trained model (--model)"
    )
    return secs, line


def _check_inputs(policy: Policy, env, critic) -> TextEnv:
    """The environment (a name made into one, a protocol object wrapped); ``OptionError`` for a wrong
    policy, environment or critic, ``ValueError`` for a tokenizer that does not fit the environment
    or the model."""
    if not isinstance(policy, Policy):
        raise OptionError(
            "policy",
            f"expected a mpo_viz.models.Policy (tiny_policy, load_policy, models.load), found {type(policy).__name__}",
        )
    if isinstance(env, str):
        env = make_env(env)
    try:
        env = as_env(env)
    except TypeError as exc:
        raise OptionError("env", str(exc).partition(": ")[2]) from None
    if critic is not None and not callable(critic):
        raise OptionError("critic", f"expected a mpo_viz.models.Critic or None, found {type(critic).__name__}")
    check_vocabulary(policy.tokenizer, env.vocabulary(), where=f"policy {policy.name} for env {env.name!r}")
    vocab = embedding_rows(policy.model)
    if len(policy.tokenizer) > vocab:
        raise ValueError(
            f"policy {policy.name}: the tokenizer has {len(policy.tokenizer)} tokens, the model embeds {vocab}"
        )
    return env


def _play(
    engine: Engine,
    episodes: list[Episode],
    cfg: RolloutConfig,
    policy: Policy,
    timer: Timer,
    bar,
    on_done=None,
    notice=None,
) -> None:
    """Play every episode to its end: batch turns of up to ``batch_size`` live episodes, queued
    ones joining as others finish (the module docstring's feed / decode / step); ``on_done`` gets
    the episodes that ended in each batch turn; ``notice`` the estimate of :func:`estimate_notice`
    after the third batch turn when most turns of the first ran to ``max_turn_tokens``."""
    queue = deque(episodes)
    live: list[Episode] = []
    stop = torch.tensor(sorted(policy.layout.stop_ids), dtype=torch.long, device=policy.device)
    first: list[tuple[float, int, int]] = []  # (seconds, turns cut by max_turn_tokens, rows) of the first batch turns
    while queue or live:
        t_turn = time.perf_counter()
        n_new = min(cfg.batch_size - len(live), len(queue))  # admit queued episodes into free rows
        engine.add_rows(n_new)
        live += [queue.popleft() for _ in range(n_new)]
        logits = feed(engine, live, timer)
        turn = decode_turn(engine, live, logits, cfg, stop, timer)
        keep = step_envs(live, turn, cfg, policy.layout, timer, bar)
        if notice is not None and len(first) < 3:
            first.append((time.perf_counter() - t_turn, _cut(turn, cfg, policy), len(live)))
            if len(first) == 3:
                _notice_untrained(notice, first, live, episodes, cfg)
        if on_done is not None and len(keep) < len(live):
            kept = set(keep)
            on_done([ep for b, ep in enumerate(live) if b not in kept])
        t0 = time.perf_counter()
        engine.keep_rows(keep)
        live = [live[b] for b in keep]
        timer.add("model", t0)


def _cut(turn, cfg: RolloutConfig, policy: Policy) -> int:
    """The turns of a batch turn that ran to ``max_turn_tokens`` without a stop token."""
    stops = policy.layout.stop_ids
    return sum(
        1 for b, n in enumerate(turn.counts) if n >= cfg.max_turn_tokens and int(turn.tokens[b, n - 1]) not in stops
    )


def _notice_untrained(notice, first, live: list[Episode], episodes: list[Episode], cfg: RolloutConfig) -> None:
    """Say :func:`estimate_notice`'s line after the third batch turn when most turns of the first ran
    to ``max_turn_tokens`` and the estimate reaches :data:`NOTICE_AFTER_S`."""
    (_, cut, rows), (t2, _, _), (t3, _, _) = first
    if 2 * cut < rows:
        return
    limits = [ep.env.turn_limit for ep in live]
    turns = max(limits) if limits and all(isinstance(x, int) for x in limits) else None
    secs, line = estimate_notice(cfg, len(episodes), (t2, t3), rows, cut, turns, max(len(ep.prompt) for ep in live))
    if secs >= NOTICE_AFTER_S:
        notice(line)


def feed(engine: Engine, live: list[Episode], timer: Timer) -> torch.Tensor:
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
        ids[b, width - n :] = torch.tensor(ep.pending)
        msk[b, width - n :] = 1
        pos[b, width - n :] = start[b] + torch.arange(n)
        ep.pending = []
    dev = engine.device
    engine.next_pos = engine.next_pos + msk.sum(1).to(dev)
    logits = engine.forward(ids.to(dev), msk.to(dev), pos.to(dev))
    timer.add("model", t0)
    return logits


def decode_turn(
    engine: Engine,
    live: list[Episode],
    logits: torch.Tensor,
    cfg: RolloutConfig,
    stop: torch.Tensor,
    timer: Timer,
    *,
    used: list[int] | None = None,
    exclude: torch.Tensor | None = None,
) -> Turn:
    """2. Sample one turn for every row at once: one-token forwards with the cache until every row
    hit its stop token or budget (a row whose turn ended feeds padding).

    Inside a turn (the token truth's continuations, :mod:`mpo_viz.rollout.inturn`): ``used[b]`` tokens
    of row ``b``'s turn are already written (fed, not in ``ep.ids`` yet), so its budget is
    ``min(max_turn_tokens − used, max_total_tokens − length − used)``; ``exclude[b] >= 0``: the row's
    first token is drawn without that token (:func:`~mpo_viz.rollout.engine.sample_excluding`).
    ``Turn.budget_total`` is the total budget left when decoding starts."""
    t0 = time.perf_counter()
    dev = engine.device
    budget_total = torch.tensor([cfg.max_total_tokens - ep.length for ep in live])
    if used is None:
        budget = torch.clamp(budget_total, max=cfg.max_turn_tokens).to(dev)
    else:
        u_t = torch.tensor(used, dtype=torch.long)
        budget_total = budget_total - u_t
        budget = torch.minimum(budget_total, cfg.max_turn_tokens - u_t).to(dev)
    active = torch.ones(len(live), dtype=torch.bool, device=dev)
    count = torch.zeros(len(live), dtype=torch.long, device=dev)
    toks, rlps, olps, ents = [], [], [], []
    while True:
        u = torch.tensor([ep.uniform() if a else 0.0 for ep, a in zip(live, active.tolist())], dtype=torch.float64)
        tok, rlp, olp, ent = sample_tokens(logits, u, cfg.temperature, cfg.top_p)
        if exclude is not None and bool((exclude >= 0).any()):  # those rows alone: the others' draws are unchanged
            sel = torch.nonzero(exclude >= 0)[:, 0]
            t2, r2, o2, _ = sample_excluding(
                logits[sel.to(logits.device)], u[sel], exclude[sel], cfg.temperature, cfg.top_p
            )
            sel = sel.to(tok.device)
            tok, rlp, olp = tok.clone(), rlp.clone(), olp.clone()
            tok[sel], rlp[sel], olp[sel] = t2.to(tok.device), r2.to(rlp.device), o2.to(olp.device)
        exclude = None
        toks.append(tok)
        rlps.append(rlp)
        olps.append(olp)
        ents.append(ent)
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
    return Turn(
        torch.stack(toks, 1).cpu(),
        torch.stack(rlps, 1).float().cpu(),
        torch.stack(olps, 1).float().cpu(),
        torch.stack(ents, 1).float().cpu(),
        count.cpu().tolist(),
        budget_total.tolist(),
    )


def _progress_bar(n: int, progress: bool | None):
    from tqdm.auto import tqdm

    disable = (not progress) if progress is not None else (True if n < 64 else None)
    return tqdm(total=n, desc="rollout", unit="ep", disable=disable, leave=False)
