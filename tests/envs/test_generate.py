"""Generated trajectory/v1 files: validation, determinism, oracle alignment (docs/concepts.md §2), the CLI."""

import json

import numpy as np
import pytest

import mpo_viz as mv
from mpo_viz.cli import main
from mpo_viz.envs.generate import GenerateConfig, _env_of, generate, generate_rows, oracle_columns


@pytest.mark.parametrize("name", ["search", "tooluse", "automation"])
def test_rows_are_aligned_with_the_oracle(name):
    rows, meta = generate_rows(GenerateConfig(env=name, episodes=24, group_size=4, seed=1, noise=0.3))
    assert meta["values_source"] == "oracle"
    assert len({r["group_id"] for r in rows}) == 6
    for r in rows:
        mask = np.asarray(r["loss_mask"])
        tid = np.asarray(r["turn_ids"])
        v = np.asarray(r["oracle_values"], dtype=np.float64)
        adv = np.asarray(r["oracle_token_adv"], dtype=np.float64)
        dec = np.asarray(r["decisive"])
        orc = json.loads(r["extra_json"])["oracle"]
        K = r["num_turns"]
        assert K == len(orc["turn_v"]) == tid[mask == 1].max() + 1
        np.testing.assert_array_equal(r["values"], r["oracle_values"])  # no value noise asked
        for k in range(K):
            idx = np.flatnonzero((mask == 1) & (tid == k))
            assert idx[-1] - idx[0] + 1 == len(idx)  # one contiguous run per turn
            assert v[idx[0]] == pytest.approx(orc["turn_v"][k], abs=1e-6)  # V(s_k) at the first token
            assert adv[idx].sum() == pytest.approx(orc["turn_adv"][k], abs=1e-5)
            assert orc["turn_adv"][k] == pytest.approx(orc["turn_q"][k] - orc["turn_v"][k])
            # inside the turn: value(t+1) = value(t) + adv(t); flat wherever no token decides
            np.testing.assert_allclose(v[idx[1:]], (v[idx] + adv[idx])[:-1], atol=1e-5)
            assert np.all(adv[idx][dec[idx] == 0] == 0)
            if k + 1 < K:  # observations carry V(s_{k+1})
                obs = np.arange(idx[-1] + 1, np.flatnonzero((mask == 1) & (tid == k + 1))[0])
                np.testing.assert_allclose(v[obs], orc["turn_v"][k + 1], atol=1e-6)
        assert np.all(dec[mask == 0] == 0) and np.all(adv[mask == 0] == 0)
        assert r["response_tokens"][-1] == "<|eot|>"
        assert len(json.loads(r["messages_json"])) == 2 + 2 * K


def test_generate_is_deterministic_and_value_noise_is_gaussian():
    a = generate(GenerateConfig(env="automation", episodes=16, seed=3))
    b = generate(GenerateConfig(env="automation", episodes=16, seed=3))
    assert [a.row(i)["response_ids"] for i in range(16)] == [b.row(i)["response_ids"] for i in range(16)]
    c = generate(GenerateConfig(env="automation", episodes=16, seed=3, value_noise=0.2))
    d = (c.padded("values") - c.padded("oracle_values"))[c.padded("loss_mask") == 1].numpy()
    assert c.meta["value_noise"] == 0.2 and c.meta["values_source"] == "oracle"
    assert abs(d.std() - 0.2) < 0.02 and abs(d.mean()) < 0.02
    oc = oracle_columns(c)
    assert oc["values"].shape == c.padded("values").shape and len(oc["turn_adv"]) == 16
    with pytest.raises(ValueError, match="episodes"):
        generate(GenerateConfig(env="search", episodes=10, group_size=4))
    with pytest.raises(ValueError, match="oracle_values"):
        oracle_columns(mv.synthetic.make_batch(2, seed=0))


def test_shaping_writes_turn_rewards():
    b = generate(GenerateConfig(env="search", episodes=8, seed=0, env_options={"shaping": 0.1}))
    assert np.isnan(b.outcome_reward).all() and b.has("turn_rewards")
    # the oracle values include the shaping: V(s_0) ≈ mean return is checked in test_env_oracle;
    # here the per-token rewards add up to the turn rewards
    tr = b.field("turn_rewards")
    assert np.allclose(b.token_rewards.sum(1).numpy(), [np.sum(x) for x in tr])


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
def test_cli_generate_then_validate(tmp_path, suffix, capsys):
    out = tmp_path / f"auto{suffix}"
    rc = main(
        [
            "generate",
            "--env",
            "automation",
            "--noise",
            "0.25",
            "--episodes",
            "12",
            "--group-size",
            "4",
            "--seed",
            "2",
            "--value-noise",
            "0.1",
            "--slip",
            "0.2",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    assert main(["validate", str(out)]) == 0
    assert "OK: 12 valid" in capsys.readouterr().out
    b = mv.load(out)
    assert len(b) == 12 and b.meta["values_source"] == "oracle"
    assert b.meta["command"].startswith("mpo-viz generate --env automation")
    assert b.meta["generator"]["env_options"] == {"slip": 0.2}
    capsys.readouterr()
    assert main(["generate", "--env", "search", "--slip", "0.2", "--episodes", "4", "--out", str(out)]) == 1
    assert (
        "error: --slip: expected an option of the search environment (distractors, difficulty, slack, max_turns, "
        "shaping, seed), found one it does not take" in capsys.readouterr().err
    )
    assert main(["generate", "--env", "search", "--difficulty", "x", "--episodes", "4", "--out", str(out)]) == 1
    assert main(["generate", "--env", "search", "--noise", "2", "--episodes", "4", "--out", str(out)]) == 1
    assert "error: --noise: expected 0 <= noise <= 1, found 2.0" in capsys.readouterr().err
    assert main(["generate", "--env", "search", "--episodes", "6", "--out", str(out)]) == 1
    assert "error: --episodes: expected a positive multiple of group_size=4, found 6" in capsys.readouterr().err


@pytest.mark.parametrize("within,opts", [("td", {}), ("intra", {"lam": 0.0})])
def test_mae_on_the_exact_critic_recovers_the_oracle_credit(within, opts):
    # Deterministic transitions (search): with V = oracle, turn GAE with turn_lam = 0 gives
    # A^T_k = R_k + V(s_{k+1}) − V(s_k) = Q − V exactly, and the one-step increments inside a turn are
    # the oracle token advantages, so MAE = a*_t + A*_k·(1 − 1/n_k) token by token (docs/concepts.md §7.3).
    from mpo_viz.advantages import compute

    b = generate(GenerateConfig(env="search", episodes=16, seed=5, noise=0.4))
    res = compute(b, "mpo", within=within, turn_lam=0.0, **opts)
    oc = oracle_columns(b)
    m = b.mask.numpy() != 0
    tid = b.turn_ids.numpy()
    a_star = oc["token_adv"].numpy().astype(np.float64)
    expect = np.zeros_like(a_star)
    for i in range(len(b)):
        for k, A in enumerate(oc["turn_adv"][i]):
            sel = m[i] & (tid[i] == k)
            expect[i, sel] = a_star[i, sel] + A * (1 - 1 / sel.sum())
    np.testing.assert_allclose(res.advantages.numpy()[m], expect[m], atol=2e-5)


def test_long_horizon_without_reasoning(tmp_path):
    out = tmp_path / "long.parquet"
    assert (
        main(
            [
                "generate",
                "--env",
                "tooluse",
                "--noise",
                "0",
                "--episodes",
                "4",
                "--difficulty",
                "20-22",
                "--no-reasoning",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    b = mv.load(out)
    assert (b.num_turns >= 20).all() and (b.num_turns <= 22).all() and (b.outcome_reward == 1).all()
    toks = list(b.field("response_tokens")[0])
    assert toks[0] == "calc" and toks[4] == "<|eot|>" and toks[5] == "<|tool|>"  # "calc x op c <|eot|>"
    np.testing.assert_allclose(b.padded("values")[b.padded("loss_mask") == 1].numpy(), 1.0)  # noise 0: V = 1


def test_the_environments_own_difficulty_unless_one_is_given(tmp_path):
    """No --difficulty: the environment's default (an 8x8 lake: shortest paths 2·(8 − 1) = 14 to 8·8 = 64;
    the built-in environments: 3-6), not the built-ins' 3-6 forced on every environment."""
    assert _env_of(GenerateConfig(env="frozenlake", env_options={"size": 8})).difficulty == (14, 64)
    assert _env_of(GenerateConfig(env="search")).difficulty == (3, 6)
    assert _env_of(GenerateConfig(env="search", difficulty=4)).difficulty == (4, 4)
    out = tmp_path / "fl.parquet"
    assert main(["generate", "--env", "frozenlake", "--size", "8", "--episodes", "4", "--out", str(out)]) == 0
    assert len(mv.load(out)) == 4
