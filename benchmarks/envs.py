"""Benchmark: the exact models of the literature's testbeds (sokoban, frozenlake) — step overhead, oracle
build time, expert episodes per second.

Run:  .venv/bin/python benchmarks/envs.py            (every cell)
      .venv/bin/python benchmarks/envs.py --quick    (make bench: a few seconds)

Three tables, one torch thread, the load (1-minute average) before and after each row:

* **step**: µs per ``env.step(text)`` (parse the reply, the exact outcomes, draw one, the chat
  messages) against the bare dynamics of the same turn (``env.outcomes(task, state, action)``, the
  finite model's move alone: what a game without the text layer does), over the turns of noisy-expert
  episodes; the overhead is their difference (target ≤ 50 µs per step).
* **oracle**: seconds to build the exact oracle of one task under the noisy expert (p = 0.25), from
  a fresh model to ``V(s_0)`` (every reachable ``(turn, state)`` enumerated): median and max over
  rooms/lakes, with the states enumerated (target ≤ 1 s per 6×6 room with 2 boxes).
* **generate**: episodes per second of ``mpo-viz generate --policy expert``
  (:func:`mpo_viz.envs.generate.generate`: expert play, oracle, tokens and the batch); also on the
  adapters' Sokoban (``gem:game:Sokoban-v0-easy``, ``textarena:Sokoban-v0``: the exact solver, no
  oracle, byte tokens).
* **adapters** (the ``gem`` / ``textarena`` extras; a cell whose library is missing says so): µs per
  ``env.step(text)`` of ``make_env("gem:<id>")`` / ``make_env("textarena:<id>")`` against the bare
  call of the library on the same replies (gem: ``game.step(text)``; textarena: ``game.step(text)``
  and ``game.get_observation()``, which the text needs), over episodes of uniformly random
  well-formed replies; the overhead is their difference (target ≤ 50 µs per step: the private
  global-RNG swap, the text, the chat messages). Episodes per second of the same play, through the
  adapter (reset included) and bare.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from mpo_viz.envs import NoisyExpert, Oracle, make_env  # noqa: E402
from mpo_viz.envs.generate import GenerateConfig, generate  # noqa: E402

#: name -> (environment, its options): the cells of every table
CELLS = {
    "sokoban 6x6, 1 box, 3-6 moves": ("sokoban", {"difficulty": (3, 6)}),
    "sokoban 6x6, 2 boxes, 4-10 moves": ("sokoban", {"boxes": 2, "difficulty": (4, 10)}),
    "sokoban 6x6, 2 boxes, 2-21 moves, 20 turns (GEM)": (
        "sokoban",
        {"boxes": 2, "difficulty": (2, 21), "max_turns": 20},
    ),
    "frozenlake 4x4 slippery": ("frozenlake", {}),
    "frozenlake 8x8 slippery, 200 turns (gymnasium)": ("frozenlake", {"size": 8, "max_turns": 200}),
}
#: name -> the replies a random player draws from (well-formed: the library's own action format)
_MOVES = ("up", "down", "left", "right")
ADAPTER_CELLS = {
    "gem:game:Sokoban-v0-easy": tuple(f"\\boxed{{{m}}}" for m in _MOVES),
    "gem:game:Game2048-v0-easy": tuple(f"\\boxed{{{m}}}" for m in _MOVES),
    "gem:game:Minesweeper-v0-easy": tuple(f"\\boxed{{reveal {r} {c}}}" for r in range(5) for c in range(5)),
    "textarena:Sokoban-v0": tuple(f"[{m}]" for m in _MOVES),
    "textarena:FrozenLake-v0": tuple(f"[{m}]" for m in _MOVES),
}
#: adapter environments with an expert (the exact solver), rows of the generate table
EXPERT_ADAPTERS = ("gem:game:Sokoban-v0-easy", "textarena:Sokoban-v0")
STEP_TARGET_US = 50.0
ORACLE_TARGET_S = 1.0


def _load() -> float:
    return os.getloadavg()[0]


def step_cell(name: str, opts: dict, episodes: int, seed: int = 0) -> dict:
    """µs per ``env.step`` and per bare ``env.outcomes`` call over the turns of noisy-expert episodes."""
    env = make_env(name, **opts)
    expert = NoisyExpert(0.25)
    rng = random.Random(seed)
    turns = []  # (task, inner state, action, text) of every turn played
    for ep in range(episodes):
        env.reset(seed=seed + ep)
        while not env.done:
            a, text = expert.act(env, rng)
            turns.append((env.task, env.state, a, text))
            env.step(text)
    # the bare dynamics: the finite model's outcomes of each turn (warm: built once, as a game keeps its map)
    for task, state, a, _ in turns:
        env.outcomes(task, state[1], a)
    t0 = time.perf_counter()
    for task, state, a, _ in turns:
        env.outcomes(task, state[1], a)
    bare = (time.perf_counter() - t0) / len(turns)
    # the full step, replayed from each turn's state (reset to the task, state set, one step)
    env.reset(seed=seed)
    t_step = 0.0
    for task, state, _, text in turns:
        env.task, env.state, env.done, env.turn_limit = task, state, False, env.limit_for(task)
        env.messages = env.messages[:2]
        t0 = time.perf_counter()
        env.step(text)
        t_step += time.perf_counter() - t0
    step = t_step / len(turns)
    return {"turns": len(turns), "step_us": step * 1e6, "bare_us": bare * 1e6, "overhead_us": (step - bare) * 1e6}


def oracle_cell(name: str, opts: dict, tasks: int, seed: int = 0) -> dict:
    """Seconds to build one task's oracle from a fresh model (median, max) and the states it enumerated."""
    env = make_env(name, **opts)
    secs, states = [], []
    for k in range(tasks):
        env.reset(seed=seed + k)
        task = env.make_task(seed + k)  # a fresh task: its room model (BFS, texts) built inside the timing
        env.reset(seed=seed + k, task=task)
        task.cache.clear()
        t0 = time.perf_counter()
        orc = Oracle(env, NoisyExpert(0.25))
        orc.value(env.state)
        secs.append(time.perf_counter() - t0)
        states.append(len(orc._v))
    return {
        "tasks": tasks,
        "median_s": float(np.median(secs)),
        "max_s": float(np.max(secs)),
        "states_median": int(np.median(states)),
        "states_max": int(np.max(states)),
    }


def generate_cell(name: str, opts: dict, episodes: int, seed: int = 0) -> dict:
    """Episodes per second of the expert's ``generate`` (groups of 4)."""
    opts = dict(opts)
    difficulty = opts.pop("difficulty", None)
    kw = {"difficulty": difficulty} if difficulty is not None else {}
    if name == "frozenlake" and difficulty is None:
        kw = {"difficulty": (2 * (opts.get("size", 4) - 1), opts.get("size", 4) ** 2)}
    t0 = time.perf_counter()
    batch = generate(GenerateConfig(env=name, episodes=episodes, group_size=4, seed=seed, env_options=opts, **kw))
    dt = time.perf_counter() - t0
    return {"episodes": len(batch), "eps_per_s": len(batch) / dt, "tokens_per_ep": float(batch.mask.shape[1])}


def _bare_game(name: str):
    """The library's own game for an adapter name, built as the adapter builds it (no wrappers),
    and its step: ``(game, reset(seed), step(text) -> done)``."""
    library, _, game_id = name.partition(":")
    if library == "gem":
        import gem

        game = gem.make(game_id)

        def step(text):
            out = game.step(text)
            return out[2] or out[3]

        return game, lambda seed: game.reset(seed=seed), step
    from textarena.envs.registration import ENV_REGISTRY

    spec = ENV_REGISTRY[game_id]
    module, _, attr = spec.entry_point.partition(":")
    game = getattr(__import__(module, fromlist=[attr]), attr)(**spec.kwargs)

    def ta_step(text):
        done, _ = game.step(text)
        game.get_observation()
        return done

    def ta_reset(seed):
        game.reset(num_players=1, seed=seed)
        game.get_observation()

    return game, ta_reset, ta_step


def adapter_cell(name: str, episodes: int, seed: int = 0) -> dict:
    """µs per adapter step and per bare library step on the same random replies, and episodes per
    second of both (reset included). The bare game replays each adapter episode's replies from the
    same task seed until its own episode ends (its dynamics draw from the global RNGs as they
    stand, so a stochastic game may end elsewhere: each side is averaged over its own steps)."""
    replies = ADAPTER_CELLS[name]
    env = make_env(name)
    _, bare_reset, bare_step = _bare_game(name)
    rng = random.Random(seed)
    t_env = t_bare = t_env_reset = t_bare_reset = 0.0
    turns = bare_turns = 0
    outer = random.getstate(), np.random.get_state()
    for ep in range(episodes):
        t0 = time.perf_counter()
        env.reset(seed=seed + ep)
        t_env_reset += time.perf_counter() - t0
        texts = []
        while not env.done:
            texts.append(rng.choice(replies))
            t0 = time.perf_counter()
            env.step(texts[-1])
            t_env += time.perf_counter() - t0
        turns += len(texts)
        t0 = time.perf_counter()
        bare_reset(seed + ep)
        t_bare_reset += time.perf_counter() - t0
        for text in texts:
            t0 = time.perf_counter()
            done = bare_step(text)
            t_bare += time.perf_counter() - t0
            bare_turns += 1
            if done:
                break
    random.setstate(outer[0])  # the bare library reseeded the globals: put them back
    np.random.set_state(outer[1])
    step, bare = t_env / turns, t_bare / bare_turns
    return {
        "turns": turns,
        "step_us": step * 1e6,
        "bare_us": bare * 1e6,
        "overhead_us": (step - bare) * 1e6,
        "eps_per_s": episodes / (t_env + t_env_reset),
        "bare_eps_per_s": episodes / (t_bare + t_bare_reset),
    }


def _library_missing(name: str) -> str | None:
    """Why the cell cannot run (its extra is not installed), or None."""
    library = name.partition(":")[0]
    try:
        __import__(library)
    except ImportError:
        return f"{library} is not installed: pip install 'mpo_viz[{library}]'"
    return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=64, help="expert episodes per cell (step and generate)")
    ap.add_argument("--tasks", type=int, default=40, help="rooms/lakes per cell whose oracle is built")
    ap.add_argument("--cells", nargs="*", default=list(CELLS), choices=list(CELLS))
    ap.add_argument("--adapters", nargs="*", default=list(ADAPTER_CELLS), choices=list(ADAPTER_CELLS))
    ap.add_argument("--quick", action="store_true", help="a few seconds' smoke run (make bench): 8 episodes, 4 tasks")
    args = ap.parse_args(argv)
    if args.quick:
        args.episodes, args.tasks = 8, 4
    torch.set_num_threads(1)

    print(f"step: µs per env.step against the bare dynamics (env.outcomes), {args.episodes} expert episodes per cell")
    print("| cell | turns | step µs | bare µs | overhead µs (target ≤ 50) | load before → after |")
    print("|---|---|---|---|---|---|")
    for cell in args.cells:
        name, opts = CELLS[cell]
        before = _load()
        r = step_cell(name, opts, args.episodes)
        flag = "" if r["overhead_us"] <= STEP_TARGET_US else " (over)"
        print(
            f"| {cell} | {r['turns']} | {r['step_us']:.1f} | {r['bare_us']:.1f} | **{r['overhead_us']:.1f}**{flag} | "
            f"{before:.1f} → {_load():.1f} |",
            flush=True,
        )

    print(f"\noracle: seconds to build one task's exact oracle (p = 0.25), {args.tasks} tasks per cell")
    print("| cell | median s | max s (target ≤ 1 at 6x6, 2 boxes) | states median | states max | load before → after |")
    print("|---|---|---|---|---|---|")
    for cell in args.cells:
        name, opts = CELLS[cell]
        before = _load()
        r = oracle_cell(name, opts, args.tasks)
        print(
            f"| {cell} | {r['median_s']:.3f} | **{r['max_s']:.3f}** | {r['states_median']} | {r['states_max']} | "
            f"{before:.1f} → {_load():.1f} |",
            flush=True,
        )

    print(f"\ngenerate: episodes per second of the expert's generate, {args.episodes} episodes (groups of 4)")
    print("| cell | episodes | episodes/s | padded tokens per episode | load before → after |")
    print("|---|---|---|---|---|")
    for cell in args.cells:
        name, opts = CELLS[cell]
        before = _load()
        r = generate_cell(name, opts, args.episodes)
        print(
            f"| {cell} | {r['episodes']} | **{r['eps_per_s']:.1f}** | {r['tokens_per_ep']:.0f} | "
            f"{before:.1f} → {_load():.1f} |",
            flush=True,
        )
    for name in (n for n in EXPERT_ADAPTERS if n in args.adapters):
        missing = _library_missing(name)
        if missing:
            print(f"| {name} (the solver) | — | {missing} | — | |", flush=True)
            continue
        before = _load()
        r = generate_cell(name, {}, args.episodes)
        print(
            f"| {name} (the solver) | {r['episodes']} | **{r['eps_per_s']:.1f}** | {r['tokens_per_ep']:.0f} | "
            f"{before:.1f} → {_load():.1f} |",
            flush=True,
        )

    print(
        f"\nadapters: µs per env.step of gem:/textarena: environments against the bare library step, "
        f"{args.episodes} episodes of random well-formed replies per cell; episodes/s of the same play"
    )
    print(
        "| environment | turns | step µs | bare µs | overhead µs (target ≤ 50) | episodes/s | bare episodes/s "
        "| load before → after |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name in args.adapters:
        missing = _library_missing(name)
        if missing:
            print(f"| {name} | — | — | — | {missing} | — | — | |", flush=True)
            continue
        before = _load()
        r = adapter_cell(name, args.episodes)
        flag = "" if r["overhead_us"] <= STEP_TARGET_US else " (over)"
        print(
            f"| {name} | {r['turns']} | {r['step_us']:.1f} | {r['bare_us']:.1f} | **{r['overhead_us']:.1f}**{flag} | "
            f"{r['eps_per_s']:.0f} | {r['bare_eps_per_s']:.0f} | {before:.1f} → {_load():.1f} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
