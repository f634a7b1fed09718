"""The shipped sample logs: reproducible from their script, and every framework's layout of the same
episodes converts to the same trajectories (token ids, turns, total rewards)."""

import math

import numpy as np
import pytest

from mpo_viz.adapters import (
    from_areal,
    from_art,
    from_chat,
    from_skyrl,
    from_steps,
    from_trl,
    from_verl,
)
from tests.adapters.adapter_data import SAMPLES


@pytest.fixture(scope="module")
def make_samples(load_script):
    return load_script(SAMPLES / "make_samples.py", "make_samples")


def test_samples_regenerate_identically(tmp_path, make_samples):
    make_samples.main(tmp_path)
    shipped = sorted(
        p.relative_to(SAMPLES)
        for p in SAMPLES.rglob("*")
        if p.is_file() and p.suffix != ".py" and "__pycache__" not in p.parts
    )
    made = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    assert made == shipped
    for rel in shipped:
        assert (tmp_path / rel).read_bytes() == (SAMPLES / rel).read_bytes(), rel


@pytest.fixture(scope="module")
def episodes(make_samples):
    eps, _ = make_samples.episodes()
    return eps


@pytest.fixture(scope="module")
def converted():
    tok = SAMPLES / "tokenizer"
    return {
        "verl": from_verl(SAMPLES / "verl_batch.pt"),
        "areal": from_areal(SAMPLES / "areal_rollout.safetensors"),
        "skyrl": from_skyrl(SAMPLES / "skyrl_generator_output.json"),
        "verifiers": from_steps(SAMPLES / "verifiers_rollouts.jsonl"),
        "rllm": from_steps(SAMPLES / "rllm_episodes.jsonl"),
        "agl": from_steps(SAMPLES / "agl_rollouts.jsonl"),
        "openai": from_chat(SAMPLES / "openai_chat.jsonl", tokenizer=tok),
        "trl": from_trl(SAMPLES / "trl", tokenizer=tok),
        "art": from_art(SAMPLES / "art" / "trajectories" / "train", tokenizer=tok),
    }


@pytest.mark.parametrize("name", ["verl", "areal", "skyrl", "openai", "art"])
def test_full_layouts_give_the_episodes_exactly(converted, episodes, name):
    b, rep = converted[name]
    assert len(b) == 4 and not rep.rejected
    for i, e in enumerate(episodes):
        r, want = b.row(i), e["row"]
        assert r["prompt_ids"] == want["prompt_ids"] and r["response_ids"] == want["response_ids"]
        assert r["loss_mask"] == want["loss_mask"]
        assert b.num_turns[i] == len(e["turn_rewards"])
        # the turn rewards the tool replies carried, wherever the layout put them
        turns = b.turns()
        got = turns.loc[turns.traj_id == b.traj_ids[i], "reward"].to_numpy()
        if name in ("art", "areal"):  # ART and AReaL log one sequence reward: it sits on the last turn
            assert got.sum() == pytest.approx(sum(e["turn_rewards"]), abs=1e-6)
        else:
            assert got == pytest.approx(e["turn_rewards"], abs=1e-6)


def test_reward_moves_are_counted(converted):
    # verl: every tool reply's reward sat on its last (observation) token; chat: on the tool message
    n_rewarded = sum(1 for x in converted["openai"][0].field("turn_rewards") for v in (x if x is not None else []) if v)
    assert converted["verl"][1].rewards_moved == n_rewarded
    assert converted["openai"][1].rewards_moved == n_rewarded > 0
    assert converted["skyrl"][1].rewards_moved == 0  # SkyRL already puts them on the turn's last token
    assert converted["openai"][1].retokenization_mismatches == 1


@pytest.mark.parametrize("name", ["verifiers", "agl", "rllm", "trl"])
def test_step_and_text_layouts_keep_total_rewards(converted, episodes, name):
    b, rep = converted[name]
    totals = {}
    for tid, s in zip(b.traj_ids, b.token_rewards.sum(1).tolist()):
        key = tid.split("/step")[0]
        totals[key] = totals.get(key, 0.0) + s
    want = [sum(e["turn_rewards"]) for e in episodes]
    assert sorted(totals.values()) == pytest.approx(sorted(want), abs=1e-6)
    if name == "rllm":  # one task's agent drops its system prompt after the first call: kept as steps
        assert sum(rep.kept_as_steps.values()) == sum(len(e["starts"]) for e in episodes[2:])
        assert rep.merged_steps == sum(len(e["starts"]) for e in episodes[:2])
    if name in ("verifiers", "agl"):
        for i, e in enumerate(episodes):  # step logs end at the last completion: no final tool reply
            n = e["ends"][-1]
            assert b.row(i)["response_ids"] == e["row"]["response_ids"][:n]
    assert not math.isnan(sum(totals.values()))
    assert np.isfinite(b.token_rewards.numpy()).all()
