"""trajectory/v1 (trajectories/README.md): field names, dtypes, the version string, the constants
of the validation rules and the :class:`Problem` / :class:`TrajectoryError` that report them.

One row per trajectory with ragged (unpadded) arrays. This module only *describes* the format;
:mod:`mpo_viz.data.validate` beside it runs the rules, :mod:`mpo_viz.data.trajectory` holds the data.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SCHEMA_VERSION = "mpo_viz.trajectory/v1"

REQUIRED = ("traj_id", "group_id", "prompt_ids", "response_ids", "loss_mask", "reward")

# Per-token fields (same length as response_ids) and the dtype they are held in, in memory and on
# disk. Model outputs are float32 (what frameworks log; half the memory of float64); rewards are
# float64 so that the "token_rewards sum to reward within 1e-6" rule is meaningful.
TOKEN_FIELDS: dict[str, np.dtype] = {
    "response_ids": np.dtype(np.int64),
    "loss_mask": np.dtype(np.int8),
    "turn_ids": np.dtype(np.int64),
    "token_rewards": np.dtype(np.float64),
    "rollout_logprobs": np.dtype(np.float32),
    "old_logprobs": np.dtype(np.float32),
    "ref_logprobs": np.dtype(np.float32),
    "values": np.dtype(np.float32),
    "advantages": np.dtype(np.float32),
    "returns": np.dtype(np.float32),
    "entropy": np.dtype(np.float32),
    # what a trainer's update did (docs/training.md): the token's importance ratio after the
    # update, and whether the loss's clip held the token there (0/1)
    "ratio": np.dtype(np.float32),
    "clipped": np.dtype(np.int8),
    "response_tokens": np.dtype(object),  # decoded strings, for display
    # Monte-Carlo truth inside turns (mpo-viz truth --tokens): a measured token's true advantage Â_t, its
    # standard error, the estimates of the two halves (NaN where not measured), the 0/1 flags of the
    # measured tokens and of the controls among them, and π(a_t|h_t) under the continuations' sampling
    "mc_tok_adv": np.dtype(np.float64),
    "mc_tok_adv_se": np.dtype(np.float64),
    "mc_tok_adv_a": np.dtype(np.float64),
    "mc_tok_adv_b": np.dtype(np.float64),
    "mc_tok_measured": np.dtype(np.int8),
    "mc_tok_control": np.dtype(np.int8),
    "mc_tok_pi": np.dtype(np.float64),
}
# Per-token float fields that must be finite on action tokens.
FINITE_ON_ACTIONS = ("values", "rollout_logprobs", "old_logprobs", "ref_logprobs", "ratio")
# Per-turn fields (one entry per assistant turn).
TURN_FIELDS: dict[str, np.dtype] = {
    "turn_rewards": np.dtype(np.float64),
    # Monte-Carlo truth of a policy at each turn start (mpo-viz truth): mean return of M continuations,
    # its standard error, the means of the two halves; and after the recorded turn (Q) with its error
    "mc_value": np.dtype(np.float64),
    "mc_value_se": np.dtype(np.float64),
    "mc_value_a": np.dtype(np.float64),
    "mc_value_b": np.dtype(np.float64),
    "mc_q": np.dtype(np.float64),
    "mc_q_se": np.dtype(np.float64),
    # what a trainer's update did to the turn: its ratio after the update and whether it left the clip band
    "turn_ratio": np.dtype(np.float64),
    "turn_clipped": np.dtype(np.int8),
}
# Flags (per token or per turn): 0 or 1 (booleans accepted), checked before they are narrowed to int8.
BINARY_FIELDS = ("clipped", "turn_clipped", "mc_tok_measured", "mc_tok_control")
# The token truth's numbers (finite where mc_tok_measured is 1, which is only on action tokens).
MC_TOKEN_NUMBERS = ("mc_tok_adv", "mc_tok_adv_se", "mc_tok_adv_a", "mc_tok_adv_b", "mc_tok_pi")
# Ratios (per token: on action tokens; per turn): finite and > 0.
POSITIVE_FIELDS = ("ratio", "turn_ratio")
# Per-trajectory scalars. ``None`` = absent for that row.
SCALAR_FIELDS: dict[str, type] = {
    "traj_id": str,
    "group_id": str,
    "reward": float,
    "sample_idx": int,
    "step": int,
    "split": str,
    "policy_version": int,
    "num_turns": int,
    "stop_reason": str,
    "truncated": bool,
    "bootstrap_value": float,
    "messages_json": str,
    "extra_json": str,
}
PROMPT_FIELD = "prompt_ids"

# File metadata keys (Parquet key-value metadata, or _meta.json beside JSONL files).
META_KEYS = ("schema", "tokenizer", "source_framework", "values_source", "gamma", "lam")
JSONL_META_NAME = "_meta.json"

# Extra columns (e.g. ``adv_mpo`` written by ``mpo-viz advantages``) are preserved: a list column
# whose every row has the response length is an extra per-token float field (float32); any other
# extra column is kept as an opaque per-row value. Nothing a file holds is dropped.
EXTRA_TOKEN_DTYPE = np.dtype(np.float32)

REWARD_SUM_TOL = 1e-6


@dataclass(frozen=True)
class Problem:
    """One validation problem: where (file, line or row), which trajectory and field, what was wrong."""

    field: str
    expected: str
    found: str
    traj_id: str | None = None
    file: str | None = None
    line: int | None = None  # 1-based line of a JSONL file
    row: int | None = None  # 0-based row of a Parquet file or of an in-memory list of rows

    def where(self) -> str:
        parts = []
        if self.file:
            parts.append(str(self.file))
        if self.line is not None:
            parts.append(f"line {self.line}")
        elif self.row is not None:
            parts.append(f"row {self.row}")
        if self.traj_id is not None:
            parts.append(f"traj_id={self.traj_id!r}")
        return ", ".join(parts) if parts else "<input>"

    def __str__(self) -> str:
        return f"{self.where()}: field {self.field!r}: expected {self.expected}, found {self.found}"

    def to_dict(self) -> dict:
        return {
            "file": self.file,
            "line": self.line,
            "row": self.row,
            "traj_id": self.traj_id,
            "field": self.field,
            "expected": self.expected,
            "found": self.found,
            "message": str(self),
        }


class TrajectoryError(ValueError):
    """Invalid trajectory data. ``problems`` lists every problem found (at least one)."""

    def __init__(self, problems: list[Problem] | Problem, *, total: int | None = None):
        if isinstance(problems, Problem):
            problems = [problems]
        self.problems = list(problems)
        n = total if total is not None else len(self.problems)
        msg = str(self.problems[0])
        if n > 1:
            msg += (
                f" (and {n - 1} more problem{'s' if n > 2 else ''}; load with errors='collect' or run "
                "`mpo-viz validate` to list all)"
            )
        super().__init__(msg)


def short(value, limit: int = 60) -> str:
    """A compact repr for error messages."""
    s = repr(value)
    return s if len(s) <= limit else s[: limit - 3] + "..."
