"""verl's own compute_advantage (both trainer paths) on CPU DataProto batches built like verl's
multi-turn agent-loop output: ours for mpo/turn_gae, verl's unchanged numbers for gae/grpo."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import verl.trainer.ppo.ray_trainer as rt
import verl.trainer.ppo.v1.utils as v1u
from omegaconf import OmegaConf
from verl.trainer.ppo import core_algos

import mpo_viz.advantages as A
from mpo_viz.advantages import reference as ref
from mpo_viz.integrations.verl.batch import move_observation_rewards
from mpo_viz.integrations.verl.estimators import MissingCriticError
from tests.integrations.verl_batches import SPECS, UIDS, copy, make_batch, multi_turn_batch

ORIGINAL = rt.compute_advantage.__mpo_viz_wrapped__  # verl's function, as shipped


def algo(adv_estimator, **sections):
    """verl's `algorithm` section as the Hydra config carries it (a DictConfig)."""
    return OmegaConf.create(
        {"adv_estimator": adv_estimator, "gamma": 1.0, "lam": 1.0, "norm_adv_by_std_in_grpo": True, **sections}
    )


def run(data, name, config, fn=rt.compute_advantage, **kw):
    return fn(
        data,
        adv_estimator=name,
        gamma=config.gamma,
        lam=config.lam,
        num_repeat=1,
        norm_adv_by_std_in_grpo=config.norm_adv_by_std_in_grpo,
        config=config,
        **kw,
    )


def moved_rewards(data):
    r, n_moved, n_dropped = move_observation_rewards(data.batch["token_level_rewards"], data.batch["response_mask"])
    return r, n_moved, n_dropped


# ------------------------------------------------------------------------------------------- mpo


@pytest.mark.parametrize(
    "opts",
    [
        {},
        {"beta": 0.5, "lam": 0.9, "turn_lam": 0.8, "within": "local"},
        {"value_at": "mean", "critic_target": "turn", "whiten": True},
    ],
)
def test_mpo_through_verl_equals_our_mae_and_the_reference_loop(opts):
    data = multi_turn_batch(seed=3)
    cfg = algo("mpo", mpo=opts)
    r, moved, _ = moved_rewards(data)
    assert moved == 2  # rows 1 and 4 end on a tool reply
    out = run(copy(data), "mpo", cfg)
    m = data.batch["response_mask"].float()
    v = data.batch["values"]
    adv, ret = A.mae(r, v, m, **opts)
    torch.testing.assert_close(out.batch["advantages"], adv, rtol=0, atol=0)
    torch.testing.assert_close(out.batch["returns"], ret, rtol=0, atol=0)
    ref_adv, ref_ret = ref.mae(r.double().numpy(), v.double().numpy(), m.numpy(), **opts)
    np.testing.assert_allclose(out.batch["advantages"].double().numpy(), ref_adv, atol=2e-5)
    np.testing.assert_allclose(out.batch["returns"].double().numpy(), ref_ret, atol=2e-5)
    assert out.batch["advantages"].dtype == torch.float32
    # MAE's defining property: the mean over a turn's tokens is the turn-level GAE
    if not opts.get("whiten"):
        tg, _ = A.turn_gae(r, v, m, **{k: opts[k] for k in ("turn_lam", "value_at") if k in opts})
        a = out.batch["advantages"].double().numpy()
        t = tg.double().numpy()
        for i, spec in enumerate(SPECS):
            pos = 0
            for kind, n in spec:
                if kind == "a":
                    assert a[i, pos : pos + n].mean() == pytest.approx(t[i, pos], abs=1e-6)
                pos += n


def test_design_worked_example_through_verl():
    """The blueprint's worked example (turns 2,3,2 and 3,1,2 with tool spans between them)."""
    va = [0.50, 0.55, 0.60, 0.58, 0.62, 0.80, 0.85]
    vb = [0.40, 0.38, 0.35, 0.20, 0.25, 0.22]

    def spread(spec, vals):  # values on action tokens, 9.0 (garbage the estimator must ignore) on tools
        it, out = iter(vals), []
        for kind, n in spec:
            out += [next(it) if kind == "a" else 9.0 for _ in range(n)]
        return out

    sa = [("a", 2), ("t", 3), ("a", 3), ("t", 2), ("a", 2)]
    sb = [("a", 3), ("t", 1), ("a", 1), ("t", 4), ("a", 2)]
    data = make_batch([sa, sb], [1.0, 0.0], ["g", "g"], values=[spread(sa, va), spread(sb, vb)])
    cfg = algo("mpo", mpo={"lam": 0.9, "turn_lam": 0.9})
    out = run(copy(data), "mpo", cfg)
    m = data.batch["response_mask"][0].bool()
    np.testing.assert_allclose(
        out.batch["advantages"][0][m].numpy(), [0.467, 0.417, 0.377333, 0.401333, 0.361333, 0.225, 0.175], atol=1e-5
    )
    m = data.batch["response_mask"][1].bool()
    np.testing.assert_allclose(
        out.batch["advantages"][1][m].numpy(), [-0.378833, -0.361833, -0.331833, -0.175, -0.265, -0.235], atol=1e-5
    )
    out = run(copy(data), "turn_gae", algo("turn_gae", turn_gae={"turn_lam": 0.9}))
    np.testing.assert_allclose(
        out.batch["advantages"][0][data.batch["response_mask"][0].bool()].numpy(),
        [0.442, 0.442, 0.38, 0.38, 0.38, 0.2, 0.2],
        atol=1e-6,
    )


def test_turn_gae_through_verl_equals_ours_and_reference():
    data = multi_turn_batch(seed=5)
    out = run(copy(data), "turn_gae", algo("turn_gae", turn_gae={"turn_lam": 0.7}))
    r, _, _ = moved_rewards(data)
    v, m = data.batch["values"], data.batch["response_mask"].float()
    adv, ret = A.turn_gae(r, v, m, turn_lam=0.7)
    torch.testing.assert_close(out.batch["advantages"], adv, rtol=0, atol=0)
    ref_adv, _ = ref.turn_gae(r.double().numpy(), v.double().numpy(), m.numpy(), turn_lam=0.7)
    np.testing.assert_allclose(out.batch["advantages"].double().numpy(), ref_adv, atol=2e-5)


def test_vapo_is_offered_by_the_rule_and_equals_ours_and_reference():
    """vapo needs only critic values and takes (rewards, values, mask): the plugin offers it without
    a line of its own; its options come from algorithm.vapo.*."""
    data = multi_turn_batch(seed=6)
    out = run(copy(data), "vapo", algo("vapo", vapo={"alpha": 0.2, "gamma": 0.98}))
    r, _, _ = moved_rewards(data)
    v, m = data.batch["values"], data.batch["response_mask"].float()
    adv, ret = A.vapo(r, v, m, alpha=0.2, gamma=0.98)
    torch.testing.assert_close(out.batch["advantages"], adv, rtol=0, atol=0)
    torch.testing.assert_close(out.batch["returns"], ret, rtol=0, atol=0)
    ref_adv, _ = ref.vapo(r.double().numpy(), v.double().numpy(), m.numpy(), alpha=0.2, gamma=0.98)
    np.testing.assert_allclose(out.batch["advantages"].double().numpy(), ref_adv, atol=2e-5)
    with pytest.raises(ValueError, match=r"algorithm\.vapo\.beta: unknown option of estimator 'vapo'"):
        run(copy(data), "vapo", algo("vapo", vapo={"beta": 1.0}))


def test_the_offered_estimators_follow_the_registry():
    """Critic-based estimators on values and turns are offered; group estimators (they need uids
    compared across rows) and verl's own names are not; verl's gae stays verl's function."""
    from mpo_viz.advantages import registry
    from mpo_viz.integrations.verl import ESTIMATORS, registered

    assert {"mpo", "turn_gae", "vapo"} <= set(ESTIMATORS) and "mae" not in ESTIMATORS
    assert set(ESTIMATORS) == set(registered()["estimators"])
    assert not {"gae", "grpo", "rloo", "gigpo", "reinforce_pp"} & set(ESTIMATORS)
    for name in ESTIMATORS:
        assert "values" in registry.get_estimator(name).needs
        assert core_algos.get_adv_estimator_fn(name).__name__ == f"mpo_viz_{name}"
    assert core_algos.get_adv_estimator_fn("gae").__module__ == "verl.trainer.ppo.core_algos"


def test_v1_trainer_path_gives_the_same_numbers():
    """verl.trainer.ppo.v1.utils.compute_advantage_for_multi_trajectories (the v1 trainer's call)."""
    data = multi_turn_batch(seed=7)
    cfg = algo("mpo", mpo={"beta": 0.7})
    a1 = run(copy(data), "mpo", cfg).batch["advantages"]
    keys = [f"{u}_0_{i}" for i, u in enumerate(UIDS)]
    a2 = v1u.compute_advantage_for_multi_trajectories(
        copy(data), batch_keys=keys, adv_estimator="mpo", gamma=1.0, lam=1.0, config=cfg
    ).batch["advantages"]
    torch.testing.assert_close(a1, a2, rtol=0, atol=0)


def test_enum_and_string_names_are_the_same_estimator():
    data = multi_turn_batch(seed=1)
    cfg = algo("mpo")
    direct = core_algos.get_adv_estimator_fn("mpo")(
        token_level_rewards=data.batch["token_level_rewards"],
        response_mask=data.batch["response_mask"],
        config=cfg,
        index=data.non_tensor_batch["uid"],
        values=data.batch["values"],
    )
    torch.testing.assert_close(run(copy(data), "mpo", cfg).batch["advantages"], direct[0], rtol=0, atol=0)


# ------------------------------------------------------------------------------ verl's estimators


def test_gae_passes_through_unchanged_and_equals_our_gae():
    data = multi_turn_batch(seed=11)
    cfg = algo("gae", lam=0.95, gamma=0.99)
    cfg.lam, cfg.gamma = 0.95, 0.99
    ours = run(copy(data), "gae", cfg)
    theirs = run(copy(data), "gae", cfg, fn=ORIGINAL)
    torch.testing.assert_close(ours.batch["advantages"], theirs.batch["advantages"], rtol=0, atol=0)
    torch.testing.assert_close(ours.batch["returns"], theirs.batch["returns"], rtol=0, atol=0)
    # our gae (whitened like verl's) equals verl's GAE on action tokens, given the rewards verl used
    m = data.batch["response_mask"].bool()
    r = data.batch["token_level_rewards"].clone()
    r[~m] = 0  # verl's recursion never reads a reward on an observation token (see the next test)
    adv, ret = A.gae(r.double(), data.batch["values"].double(), m.double(), gamma=0.99, lam=0.95, whiten=True)
    np.testing.assert_allclose(theirs.batch["advantages"][m].double().numpy(), adv[m].numpy(), atol=2e-5)
    _, ret_plain = A.gae(r.double(), data.batch["values"].double(), m.double(), gamma=0.99, lam=0.95)
    np.testing.assert_allclose(theirs.batch["returns"][m].double().numpy(), ret_plain[m].numpy(), atol=2e-5)


def test_verl_gae_drops_a_score_on_a_tool_token_which_the_plugin_moves():
    """A fact of verl 0.9.1 worth knowing: compute_gae_advantage_return keeps lastgaelam only on
    response_mask == 1, so a score on a trailing tool reply never reaches any advantage; mpo and
    turn_gae (through the plugin) move it onto the last action token instead."""
    spec = [[("a", 3), ("t", 2)], [("a", 3), ("t", 2)]]
    vals = [[0.0] * 5, [0.0] * 5]
    data = make_batch(spec, [1.0, 0.0], ["g", "g"], values=vals)
    g = core_algos.compute_gae_advantage_return(
        data.batch["token_level_rewards"], data.batch["values"], data.batch["response_mask"], 1.0, 1.0
    )[1]
    assert float(g[0, :3].abs().max()) == 0.0  # returns: the score was lost
    out = run(copy(data), "turn_gae", algo("turn_gae"))
    np.testing.assert_allclose(out.batch["advantages"][0, :3].numpy(), [1.0, 1.0, 1.0])


def test_grpo_passes_through_unchanged_and_equals_our_grpo():
    data = multi_turn_batch(seed=13)
    cfg = algo("grpo")
    ours = run(copy(data), "grpo", cfg)
    theirs = run(copy(data), "grpo", cfg, fn=ORIGINAL)
    torch.testing.assert_close(ours.batch["advantages"], theirs.batch["advantages"], rtol=0, atol=0)
    direct, _ = core_algos.compute_grpo_outcome_advantage(
        data.batch["token_level_rewards"], data.batch["response_mask"], data.non_tensor_batch["uid"]
    )
    torch.testing.assert_close(ours.batch["advantages"], direct, rtol=0, atol=0)
    r, _, _ = moved_rewards(data)
    adv, _ = A.grpo(r, data.batch["response_mask"].float(), list(UIDS))
    np.testing.assert_allclose(ours.batch["advantages"].numpy(), adv.numpy(), atol=1e-6)


@pytest.mark.parametrize("name", ["rloo", "reinforce_plus_plus", "grpo_vectorized"])
def test_other_verl_estimators_pass_through(name):
    data = multi_turn_batch(seed=17)
    cfg = algo(name)
    torch.testing.assert_close(
        run(copy(data), name, cfg).batch["advantages"],
        run(copy(data), name, cfg, fn=ORIGINAL).batch["advantages"],
        rtol=0,
        atol=0,
    )


# ----------------------------------------------------------------------------------------- errors


def test_mpo_without_a_critic_is_refused():
    data = multi_turn_batch(with_values=False)
    with pytest.raises(MissingCriticError, match=r"algorithm\.adv_estimator=mpo.*critic\.enable=True"):
        run(data, "mpo", algo("mpo"))


def test_unknown_option_names_the_key():
    with pytest.raises(ValueError, match=r"algorithm\.mpo\.betta: unknown option.*beta"):
        run(multi_turn_batch(), "mpo", algo("mpo", mpo={"betta": 0.5}))


@pytest.mark.parametrize(
    "opts, key", [({"beta": "big"}, "beta"), ({"within": "sideways"}, "within"), ({"lam": 1.5}, "lam")]
)
def test_bad_option_value_names_the_key(opts, key):
    with pytest.raises(ValueError, match=rf"algorithm\.mpo\.{key}:"):
        run(multi_turn_batch(), "mpo", algo("mpo", mpo=opts))
