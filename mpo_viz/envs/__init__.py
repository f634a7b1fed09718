"""Multi-turn text environments with scripted noisy experts and exact oracle values (docs/environments.md).

``make_env("search" | "tooluse" | "automation" | "sokoban" | "frozenlake" | "gem:<id>" | "textarena:<id>" |
"package.module:factory", **kw)``; ``from_gem(id)`` / ``from_textarena(id)`` (GEM's and TextArena's games);
:class:`NoisyExpert`; :class:`Oracle`; ``build_tokenizer(env)``; ``generate(GenerateConfig(...))`` -> trajectory/v1
rows with oracle values; :class:`ProtocolEnv` / ``as_env``: an environment without a finite model (plain
reset/step/fork). See docs/environments.md.
"""

from mpo_viz.envs.automation import AutomationEnv
from mpo_viz.envs.base import FAILURE, SUCCESS, Outcome, TextEnv
from mpo_viz.envs.expert import NoisyExpert
from mpo_viz.envs.frozenlake import FrozenLakeEnv
from mpo_viz.envs.gem import from_gem
from mpo_viz.envs.oracle import Oracle, TurnOracle
from mpo_viz.envs.protocol import ProtocolEnv, as_env
from mpo_viz.envs.registry import available_envs, make_env, register_env
from mpo_viz.envs.search import SearchEnv
from mpo_viz.envs.sokoban import SokobanEnv
from mpo_viz.envs.textarena import from_textarena
from mpo_viz.envs.tooluse import ToolUseEnv

__all__ = [
    "AutomationEnv",
    "ChatLayout",
    "FAILURE",
    "FrozenLakeEnv",
    "NoisyExpert",
    "Oracle",
    "Outcome",
    "ProtocolEnv",
    "SUCCESS",
    "SearchEnv",
    "SokobanEnv",
    "TextEnv",
    "ToolUseEnv",
    "TurnOracle",
    "as_env",
    "available_envs",
    "build_tokenizer",
    "from_gem",
    "from_textarena",
    "make_env",
    "register_env",
]

_TOKENIZER_NAMES = ("ChatLayout", "build_tokenizer")


def __getattr__(name):
    # the tokenizer pulls in transformers (about 1 s): imported on first use, so that `mpo-viz`
    # commands that never tokenize (every one but generate) do not pay for it
    if name in _TOKENIZER_NAMES:
        from mpo_viz.envs import tokenizer

        return getattr(tokenizer, name)
    raise AttributeError(f"module 'mpo_viz.envs' has no attribute {name!r}")
