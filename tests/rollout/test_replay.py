"""Turn states by replay: every recorded observation reproduced on all three environments (expert
files and policy rollouts), and a record that was changed, or that lacks its seeds, refused with
an error naming the trajectory, the turn and what differs."""

import json

import numpy as np
import pytest

from mpo_viz import models as M
from mpo_viz.data.trajectory import TrajectoryBatch
from mpo_viz.envs import build_tokenizer, make_env
from mpo_viz.envs.generate import GenerateConfig, generate
from mpo_viz.rollout import rollout
from mpo_viz.rollout.replay import ReplayError, env_of, replay, word_layout_of

pytestmark = pytest.mark.usefixtures("one_thread")
ENVS = ("search", "tooluse", "automation")


def _rows(batch):
    return [batch.row(i) for i in range(len(batch))]


@pytest.mark.parametrize("name", ENVS)
def test_replay_reproduces_every_turn_of_expert_files(name):
    batch = generate(GenerateConfig(env=name, episodes=12, group_size=3, seed=2, difficulty=(3, 5)))
    env = env_of(batch)
    assert env.difficulty == (3, 5)
    states = replay(batch, word_layout_of(env))
    assert [len(s) for s in states] == batch.num_turns.tolist()
    for r, row in zip(states, _rows(batch)):
        for st in r:
            resp = list(row["response_ids"])
            assert st.prefix == list(row["prompt_ids"]) + resp[: st.start]
            assert st.action_ids == resp[st.start : st.end] and set(row["loss_mask"][st.start : st.end]) == {1}
            assert st.env.state[0] == st.turn  # the state before turn k has taken k turns
            # the snapshot holds the recorded conversation up to turn k
            assert st.env.messages == json.loads(row["messages_json"])[: 2 + 2 * st.turn]


@pytest.mark.parametrize("name", ENVS)
def test_replay_reproduces_policy_rollouts(name):
    env = make_env(name, difficulty=(3, 4))
    pol = M.tiny_policy(build_tokenizer(env), "1m", seed=1)
    batch = rollout(pol, env, 6, group_size=2, seed=5, max_turn_tokens=12, max_total_tokens=160, progress=False)
    assert batch.meta["generator"]["env_options"]["difficulty"] == [3, 4]
    states = replay(batch, pol.layout)
    assert [len(s) for s in states] == batch.num_turns.tolist()
    for r, row in zip(states, _rows(batch)):
        # only a last turn the total budget cut (no observation after it) is never stepped
        assert [st.cut for st in r[:-1]] == [False] * (len(r) - 1)
        cut = row["stop_reason"] == "max_total_tokens" and r[-1].end == len(row["response_ids"])
        assert r[-1].cut == cut


def _changed(batch, row, turn, ids):
    rows = _rows(batch)
    r = rows[row]
    tids = np.asarray(r["turn_ids"])
    mask = np.asarray(r["loss_mask"])
    pos = np.flatnonzero((tids == turn) & (mask == 1))
    resp = list(r["response_ids"])
    for p, t in zip(pos, ids):
        resp[p] = t
    r["response_ids"] = resp
    return TrajectoryBatch.from_rows(rows, meta=batch.meta)


def test_a_changed_turn_fails_naming_trajectory_turn_and_texts():
    batch = generate(GenerateConfig(env="search", episodes=4, group_size=2, seed=1, noise=0.0))
    layout = word_layout_of(env_of(batch))
    r = batch.row(0)
    n1 = int(np.sum((np.asarray(r["turn_ids"]) == 1) & (np.asarray(r["loss_mask"]) == 1)))
    filler = layout.encode("the")[0]
    bad = _changed(batch, 0, 1, [filler] * (n1 - 1))  # the command of turn 1 becomes words without a verb
    with pytest.raises(
        ReplayError,
        match=r"trajectory 'search-s1-t0000-0': turn 1: the replayed observation differs "
        r"from the recorded one: recorded '.+', replayed 'invalid action",
    ):
        replay(bad, layout)
    replay(batch, layout)  # the unchanged record replays


def test_rows_without_seeds_or_metadata_are_refused():
    batch = generate(GenerateConfig(env="tooluse", episodes=2, group_size=1, seed=0))
    layout = word_layout_of(env_of(batch))
    rows = _rows(batch)
    info = json.loads(rows[1]["extra_json"])
    del info["seed"]
    rows[1]["extra_json"] = json.dumps(info)
    with pytest.raises(ReplayError, match=r"trajectory 'tooluse-s0-t0001-0': extra_json has no seed"):
        replay(TrajectoryBatch.from_rows(rows, meta=batch.meta), layout)
    with pytest.raises(ReplayError, match="no 'generator'"):
        env_of(TrajectoryBatch.from_rows(_rows(batch), meta={}))
    other = make_env("tooluse", difficulty=6)  # another environment's options: the prompt differs
    with pytest.raises(ReplayError, match="turn 0: the replayed prompt differs"):
        replay(batch, layout, env=other)


def test_an_environment_without_fork_is_refused():
    batch = generate(GenerateConfig(env="search", episodes=1, group_size=1, seed=0))

    class NoFork:
        pass

    with pytest.raises(ReplayError, match=r"needs fork\(seed\)"):
        replay(batch, word_layout_of(env_of(batch)), env=NoFork())


def test_fork_shares_the_task_and_draws_its_own_dynamics():
    env = make_env("automation", difficulty=3, slip=0.5)
    env.reset(seed=3)
    while "take" in env.expert_action(env.task, env.state[1]):  # to a move, which can slip
        env.step(env.expert_action(env.task, env.state[1]))
    a, b, c = env.fork(1), env.fork(1), env.fork(2)
    assert a.task is env.task and a.state == env.state and a.messages == env.messages and a.messages is not env.messages
    act = env.expert_action(env.task, env.state[1])
    outs = [[f.fork(s).step(act)[0] for s in range(40)] for f in (a, b, c)]
    assert outs[0] == outs[1]  # the same seeds give the same futures
    assert len(set(outs[0])) > 1  # slips differ across seeds
    before = (env.state, list(env.messages))
    a.step(act)
    assert (env.state, env.messages) == before  # the original is left as it was
