"""The "plug in your own environment" example of docs/environments.md runs as written."""

import random
import re
from pathlib import Path

import numpy as np

from mpo_viz.envs import NoisyExpert, Oracle, available_envs, make_env, register_env
from mpo_viz.envs.generate import GenerateConfig, generate

DOC = Path(__file__).resolve().parents[2] / "docs" / "environments.md"


def _load_example():
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    code = next(b for b in blocks if "class ButtonsEnv" in b)
    body, reg = code.rsplit("register_env(", 1)
    assert reg.startswith('"buttons", ButtonsEnv)')
    ns: dict = {}
    exec(compile(body, str(DOC), "exec"), ns)
    if "buttons" not in available_envs():
        register_env("buttons", ns["ButtonsEnv"])


def test_documented_custom_env_works_end_to_end():
    _load_example()
    env = make_env("buttons", difficulty=3)
    env.reset(seed=0)
    ex = NoisyExpert(0.3)
    orc = Oracle(env, ex)
    # hand value: 3 presses, limit 5; each turn succeeds w.p. q = .7 + .1 = .8; need 3 successes in 5
    q = 0.8
    v = sum(__import__("math").comb(k - 1, 2) * q**3 * (1 - q) ** (k - 3) for k in (3, 4, 5))
    assert abs(orc.value(env.state) - v) < 1e-12
    rets = []
    for i in range(2000):
        env.reset(seed=i, task=env.task)
        rng = random.Random(f"x{i}")
        total = 0.0
        while not env.done:
            total += env.step(ex.act(env, rng)[1])[1]
        rets.append(total)
    r = np.asarray(rets)
    assert abs(r.mean() - v) < 3 * r.std(ddof=1) / np.sqrt(len(r))
    b = generate(GenerateConfig(env="buttons", episodes=8, group_size=4))
    assert len(b) == 8 and b.meta["values_source"] == "oracle"
