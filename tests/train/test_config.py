"""Config: defaults, JSON round trip, validation naming the field, refusals and the trust-region warning."""

import json
import warnings

import pytest

from mpo_viz.train.config import (
    CRITIC_DEFAULTS,
    Config,
    TrustRegionWarning,
    warmup_pool,
    warmup_steps,
)


def test_defaults_round_trip_through_json(tmp_path):
    cfg = Config(
        env="automation",
        estimator="gae",
        loss="token_ppo",
        estimator_options={"lam": 0.95},
        loss_options={"clip_high": 0.28, "dual_clip": 3.0},
        difficulty=[3, 4],
    )
    p = cfg.save(tmp_path / "c.json")
    back = Config.load(p)
    assert back == cfg
    assert back.hash() == cfg.hash()
    assert json.loads(p.read_text())["loss_options"] == {"clip_high": 0.28, "dual_clip": 3.0}


def test_hash_ignores_iterations_only():
    a = Config()
    assert a.hash() == a.replace(iterations=999).hash()
    assert a.hash() != a.replace(seed=1).hash()
    assert a.replace(seed=1, episodes=32).differences(a) == ["episodes: 32 != 64", "seed: 1 != 0"]


def test_a_field_added_later_keeps_old_hashes_while_unset():
    # the hash as it was computed before value_target existed: sha256 of the canonical JSON of every
    # field but the resumable ones; a run folder written then must keep resuming
    import hashlib

    a = Config(estimator="gae", loss="token_ppo")
    old = {
        k: v
        for k, v in a.to_dict().items()
        if k not in ("iterations", "log_to", "side_thread", "mc_samples", "value_target", "critic_warmup_positions")
    }
    text = json.dumps(old, sort_keys=True, separators=(",", ":"))
    assert a.hash() == hashlib.sha256(text.encode()).hexdigest()[:16]
    set_ = a.replace(value_target="mc")
    assert set_.hash() != a.hash() and set_.differences(a) == ["value_target: 'mc' != None"]
    assert a.differences(set_) == ["value_target: None != 'mc'"]


@pytest.mark.parametrize(
    "changes, field",
    [
        ({"episodes": 0}, "episodes"),
        ({"episodes": 10, "group_size": 4}, "episodes"),
        ({"epochs": 1.5}, "epochs"),
        ({"policy_lr": "1e-4"}, "policy_lr"),
        ({"policy_lr": True}, "policy_lr"),
        ({"top_p": 0}, "top_p"),
        ({"env": "chess"}, "env"),
        ({"estimator": "nope"}, "estimator"),
        ({"loss": "nope"}, "loss"),
        ({"model_size": "7b"}, "model_size"),
        ({"difficulty": "hard"}, "difficulty"),
        ({"estimator_options": {"gama": 1.0}}, "estimator_options"),
        ({"estimator_options": {"gamma": "1"}}, "estimator_options.gamma"),
        ({"loss_options": {"clip_low": "0.2"}}, "loss_options.clip_low"),
        ({"loss_options": {"ratio": "median"}}, "loss_options.ratio"),
        ({"loss_options": {"scale": 3.0}}, "loss_options"),
        ({"loss_options": {"agg": "none"}}, "loss_options.agg"),
        ({"loss": "sao", "loss_options": {"dual_clip": 3.0}}, "loss_options"),
        ({"kl_estimator": "k4"}, "kl_estimator"),
        ({"keep_checkpoints": 0}, "keep_checkpoints"),
        ({"minibatches": 100, "episodes": 64}, "minibatches"),
    ],
)
def test_bad_values_name_the_field(changes, field):
    with pytest.raises(ValueError) as e:
        Config(**changes)
    assert str(e.value).startswith(field + ":"), str(e.value)


def test_unknown_json_keys_are_refused_by_name():
    with pytest.raises(ValueError, match="unknown field.*'learning_rate'"):
        Config.from_dict({"learning_rate": 1e-3})
    with pytest.raises(ValueError, match="expected JSON"):
        Config.from_json("{not json")


def test_group_estimator_with_group_size_one_is_refused():
    with pytest.raises(ValueError, match="^group_size: .*'grpo'.*>= 2, found 1"):
        Config(estimator="grpo", loss="token_ppo")
    Config(estimator="grpo", loss="token_ppo", group_size=4)  # fine


@pytest.mark.parametrize("field", sorted(CRITIC_DEFAULTS))
def test_critic_settings_with_a_critic_free_estimator_are_refused(field):
    value = {
        "critic_lr": 1e-3,
        "value_clip": 0.2,
        "critic_warmup_steps": 3,
        "critic_warmup_ev": 0.4,
        "critic_init": "fresh",
        "critic_epochs": 2,
        "critic_warmup_episodes": 64,
        "critic_warmup_lr": 3e-4,
        "value_target": "mc",
        "critic_warmup_positions": "turn_start",
    }[field]
    with pytest.raises(ValueError, match=f"^{field}: the estimator 'rloo' uses no critic"):
        Config(estimator="rloo", loss="token_ppo", group_size=2, **{field: value})
    # nor with the expert's or the Monte-Carlo values, which train no critic
    with pytest.raises(ValueError, match=f"^{field}: critic='expert' reads the scripted expert's exact values"):
        Config(estimator="gae", critic="expert", **{field: value})
    with pytest.raises(ValueError, match=f"^{field}: critic='mc' reads the policy's Monte-Carlo values"):
        Config(estimator="gae", critic="mc", **{field: value})
    # with a learned critic the same setting is fine, and None means the default
    assert Config(estimator="gae", **{field: value}).critic_option(field) == value
    assert Config(estimator="gae").critic_option(field) == CRITIC_DEFAULTS[field]


def test_the_expert_critic_needs_a_value_estimator_and_an_oracle():
    assert Config(estimator="mpo", critic="expert").learns_critic is False
    assert Config(estimator="mpo", critic="mc").learns_critic is False
    assert Config(estimator="mpo").learns_critic is True
    with pytest.raises(ValueError, match="^critic: the estimator 'grpo' reads no values"):
        Config(estimator="grpo", loss="token_ppo", group_size=2, critic="expert")
    with pytest.raises(ValueError, match="^oracle_noise: critic='expert' reads the oracle values .* found None"):
        Config(estimator="mpo", critic="expert", oracle_noise=None)
    with pytest.raises(ValueError, match="^critic: expected one of 'learned', 'expert', 'mc', found 'exact'"):
        Config(critic="exact")
    with pytest.raises(ValueError, match="^mc_samples: mc_samples sets the continuations of critic='mc'"):
        Config(estimator="mpo", mc_samples=4)
    with pytest.raises(ValueError, match="^mc_samples: expected"):
        Config(estimator="mpo", critic="mc", mc_samples=1)


def test_the_removed_oracle_name_is_refused_naming_the_kinds():
    with pytest.raises(ValueError, match=r"critic: expected one of .*'expert'.*found 'oracle'"):
        Config(estimator="mpo", critic="oracle")


def test_mc_samples_unset_leaves_the_identity_of_older_runs():
    cfg = Config(estimator="mpo")
    assert "mc_samples" not in cfg.identity()
    assert "mc_samples" in Config(estimator="mpo", critic="mc", mc_samples=4).identity()
    assert "critic_warmup_positions" not in cfg.identity() and cfg.critic_option("critic_warmup_positions") == "all"
    turn = Config(estimator="mpo", critic_warmup_positions="turn_start")
    assert turn.identity()["critic_warmup_positions"] == "turn_start" and turn.hash() != cfg.hash()


def test_a_shared_trunk_critic_moves_with_the_policy():
    with pytest.raises(ValueError, match="^critic_epochs: with critic_init='shared' .* found critic_epochs=3"):
        Config(estimator="gae", critic_init="shared", critic_epochs=3)


@pytest.mark.parametrize("loss", ["turn_ppo", "token_ppo"])
def test_one_epoch_one_minibatch_without_lag_warns(loss):
    with pytest.warns(TrustRegionWarning, match="every importance ratio is 1"):
        Config(loss=loss, epochs=1, minibatches=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Config(loss=loss, epochs=1, minibatches=1, policy_lag=1)
        Config(loss=loss, epochs=1, minibatches=2)
        Config(loss="sao", epochs=1, minibatches=1)


def test_uses_critic_follows_the_registry():
    assert Config(estimator="mpo").uses_critic
    assert Config(estimator="gae").uses_critic
    assert not Config(estimator="grpo", group_size=2).uses_critic


def test_every_field_is_documented():
    import dataclasses
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "training.md").read_text()
    missing = [f.name for f in dataclasses.fields(Config) if f"`{f.name}`" not in doc]
    assert not missing, f"docs/training.md does not describe {missing}"


def test_the_docs_field_table_is_the_generated_one():
    from pathlib import Path

    from mpo_viz.train.config import TABLE_END, TABLE_START, config_table

    doc = (Path(__file__).resolve().parents[2] / "docs" / "training.md").read_text()
    committed = doc.split(TABLE_START, 1)[1].split(TABLE_END, 1)[0].strip()
    assert committed == config_table(), (
        "docs/training.md's field table differs from the declarations; regenerate it with "
        "python -c \"from mpo_viz.train.config import write_config_table; write_config_table('docs/training.md')\""
    )


def test_every_field_is_declared_and_checked_by_its_declaration():
    import dataclasses

    from mpo_viz.checks import OptionError

    opts = Config.options()
    assert list(opts) == [f.name for f in dataclasses.fields(Config)]
    assert all(o.doc for o in opts.values())
    assert opts["episodes"].expected() == "an integer >= 1" and opts["top_p"].bounds_text() == "(0, 1]"
    with pytest.raises(OptionError, match=r"^top_p: expected a value in \(0, 1\], found 1.5"):
        Config(top_p=1.5)
    assert Config(episodes=__import__("numpy").int64(8)).episodes.__class__ is int  # stored as a Python int


def test_the_warmup_pool_and_budget_scale_down_with_a_short_run_only():
    # the default run (50 iterations of 64 episodes) keeps the 512-episode pool and the 256-step budget
    assert (
        Config(estimator="mpo").critic_option("critic_warmup_episodes"),
        Config(estimator="mpo").critic_option("critic_warmup_steps"),
    ) == (512, 256)
    assert warmup_pool(8, 64) == 512 and warmup_pool(10**6, 64) == 512  # a run of 512 episodes or more: unchanged
    # a short run: its own episodes (iterations x episodes), at least 64; half as many steps (16 passes)
    short = Config(estimator="mpo", iterations=2, episodes=16, group_size=4)
    assert (short.critic_option("critic_warmup_episodes"), short.critic_option("critic_warmup_steps")) == (64, 32)
    assert (warmup_pool(5, 40), warmup_steps(200)) == (200, 100) and warmup_steps(65) == 33
    assert warmup_pool(0, 64) == 64 and warmup_steps(2000) == 256
    # a pool that is set keeps its value; the budget follows it unless it is set too
    assert Config(estimator="mpo", critic_warmup_episodes=100).critic_option("critic_warmup_steps") == 50
    assert (
        Config(estimator="mpo", critic_warmup_episodes=100, critic_warmup_steps=7).critic_option("critic_warmup_steps")
        == 7
    )
