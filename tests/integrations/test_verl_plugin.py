"""The plugin loads the way verl loads plugins, and registers our names in verl's registries."""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import subprocess
import sys

import pytest

PROBE = """
import json, sys
import verl
from verl.trainer.ppo import core_algos as ca
def mod(fn):
    return None if fn is None else fn.__module__
out = {
    "loaded": "mpo_viz.integrations.verl" in sys.modules,
    "mpo": mod(ca.ADV_ESTIMATOR_REGISTRY.get("mpo")),
    "turn_gae": mod(ca.ADV_ESTIMATOR_REGISTRY.get("turn_gae")),
    "turn_ppo": mod(ca.POLICY_LOSS_REGISTRY.get("turn_ppo")),
}
import verl.trainer.ppo.ray_trainer as rt
out["wrapped"] = getattr(rt.compute_advantage, "__mpo_viz_wrapped__", None) is not None
print("PROBE" + json.dumps(out))
"""


def _probe(env_extra: dict, code: str = PROBE) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VERL_USE_EXTERNAL", "MPO_VIZ_"))}
    env.update(env_extra)
    res = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    assert res.returncode == 0, res.stderr[-3000:]
    line = [ln for ln in res.stdout.splitlines() if ln.startswith("PROBE")][-1]
    return json.loads(line[len("PROBE") :])


def test_entry_point_is_declared():
    eps = [ep for ep in md.entry_points(group="verl.plugins") if ep.name == "mpo_viz"]
    assert len(eps) == 1 and eps[0].value == "mpo_viz.integrations.verl"


def test_import_verl_loads_the_plugin_through_the_entry_point():
    """`import verl` alone (no import of ours) registers mpo/turn_gae/turn_ppo and wraps the trainer."""
    out = _probe({})
    assert out == {
        "loaded": True,
        "mpo": "mpo_viz.integrations.verl.estimators",
        "turn_gae": "mpo_viz.integrations.verl.estimators",
        "turn_ppo": "mpo_viz.integrations.verl.losses",
        "wrapped": True,
    }


def test_external_modules_path_with_entry_points_off():
    """VERL_USE_EXTERNAL_PLUGINS=none disables entry points; VERL_USE_EXTERNAL_MODULES loads us."""
    out = _probe({"VERL_USE_EXTERNAL_PLUGINS": "none"})
    assert out == {"loaded": False, "mpo": None, "turn_gae": None, "turn_ppo": None, "wrapped": False}
    out = _probe({"VERL_USE_EXTERNAL_PLUGINS": "none", "VERL_USE_EXTERNAL_MODULES": "mpo_viz.integrations.verl"})
    assert out["loaded"] and out["wrapped"] and out["mpo"] == "mpo_viz.integrations.verl.estimators"


def test_external_lib_of_the_model_config():
    """actor_rollout_ref.model.external_lib: verl's HFModelConfig imports it in __post_init__ with
    verl.utils.import_utils.import_external_libs — the same call, here on its own."""
    code = PROBE.replace(
        "import verl\n",
        "import verl\nfrom verl.utils.import_utils import import_external_libs\n"
        "import_external_libs('mpo_viz.integrations.verl')\n",
    )
    out = _probe({"VERL_USE_EXTERNAL_PLUGINS": "none"}, code)
    assert out["loaded"] and out["wrapped"] and out["turn_ppo"] == "mpo_viz.integrations.verl.losses"


def test_registry_lookups_return_ours():
    from verl.trainer.ppo import core_algos as ca

    import mpo_viz.integrations.verl as plugin
    from mpo_viz.integrations.verl.estimators import MissingCriticError

    assert ca.get_adv_estimator_fn("mpo").__name__ == "mpo_viz_mpo"
    assert ca.get_adv_estimator_fn("turn_gae").__name__ == "mpo_viz_turn_gae"
    assert ca.get_policy_loss_fn("turn_ppo").__name__ == "mpo_viz_turn_ppo"
    assert ca.get_policy_loss_fn("turn_ppo_product").__name__ == "mpo_viz_turn_ppo_product"
    # verl 0.9.1 has its own gspo (kept) and no sao (ours registered as mpo_sao)
    assert ca.get_policy_loss_fn("gspo").__module__ == "verl.trainer.ppo.core_algos"
    assert "mpo_gspo" not in ca.POLICY_LOSS_REGISTRY
    assert ca.get_policy_loss_fn("mpo_sao").__name__ == "mpo_viz_mpo_sao"
    assert plugin.register() == plugin.registered()  # idempotent
    with pytest.raises(MissingCriticError, match=r"critic\.enable=True"):
        ca.get_adv_estimator_fn("mpo")(token_level_rewards=None, response_mask=None)


def test_both_trainer_paths_are_wrapped():
    import verl.trainer.ppo.ray_trainer as rt
    import verl.trainer.ppo.v1.utils as v1u

    from mpo_viz.integrations.verl import patch

    assert v1u.compute_advantage is rt.compute_advantage
    assert rt.compute_advantage.__mpo_viz_wrapped__.__module__ == "verl.trainer.ppo.ray_trainer"
    assert {"verl.trainer.ppo.ray_trainer", "verl.trainer.ppo.v1.utils"} <= set(patch.patched_modules())


LATER = """
import json
import torch
from mpo_viz.advantages import registry

@registry.register_estimator("probe_before", needs=("values", "turns"))
def probe_before(rewards, values, mask, *, scale: float = 1.0):
    return (rewards - values) * mask * scale, values * mask

@registry.register_estimator("probe_groups", needs=("values", "groups"))
def probe_groups(rewards, values, mask, *, scale: float = 1.0):
    return rewards, values

@registry.register_estimator("probe_extra", needs=("values",))
def probe_extra(rewards, values, mask, lengths):  # a fourth input verl does not provide
    return rewards, values

import verl  # the entry point loads the plugin: probe_before is in the registry by then
from verl.trainer.ppo import core_algos as ca
import mpo_viz.integrations.verl as plugin

@registry.register_estimator("probe_after", needs=("values",))
def probe_after(rewards, values, mask, *, shift: float = 0.0):
    return (rewards + shift) * mask, values * mask

before = "probe_after" in ca.ADV_ESTIMATOR_REGISTRY
plugin.register()  # verl imports the plugin once; a later call picks up what was registered since
r = torch.tensor([[0.0, 1.0, 0.5]]); v = torch.tensor([[0.2, 0.3, 0.4]]); m = torch.tensor([[1, 1, 0]])
a1, _ = ca.get_adv_estimator_fn("probe_before")(token_level_rewards=r, response_mask=m, values=v,
                                                 config={"probe_before": {"scale": 2.0}})
a2, _ = ca.get_adv_estimator_fn("probe_after")(token_level_rewards=r, response_mask=m, values=v,
                                                config={"probe_after": {"shift": 1.0}})
print("PROBE" + json.dumps({"before": before, "groups": "probe_groups" in ca.ADV_ESTIMATOR_REGISTRY,
                            "extra": "probe_extra" in ca.ADV_ESTIMATOR_REGISTRY,
                            "a1": a1.tolist(), "a2": a2.tolist(), "names": plugin.registered()["estimators"]}))
"""


def test_estimators_registered_later_are_offered_without_plugin_code():
    """An estimator on values (and turns) registered before `import verl` is there when the entry point
    loads the plugin; one registered after joins at the next register(); one that needs groups, or
    requires an input verl does not give, is not offered. Each runs with its options from
    algorithm.<name>.*."""
    out = _probe({}, LATER)
    assert out["before"] is False and out["groups"] is False and out["extra"] is False
    assert {"probe_before", "probe_after"} <= set(out["names"])
    assert not {"probe_groups", "probe_extra"} & set(out["names"])
    # by hand: the plugin first moves the 0.5 on the tool token 2 to token 1, so r = [0, 1.5, 0];
    # probe_before: (r - v)·m·2, probe_after: (r + 1)·m
    assert out["a1"][0] == pytest.approx([-0.4, 2.4, 0.0])
    assert out["a2"][0] == pytest.approx([1.0, 2.5, 0.0])
