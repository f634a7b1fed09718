"""Adapters: other frameworks' rollout logs → trajectory/v1, with a report of every change.

One function per source, each returning ``(TrajectoryBatch, ConversionReport)``:

* :func:`from_verl` — a verl batch (dict of tensors and arrays, ``torch.save`` file, or a pickled
  ``DataProto`` with ``trust=True``);
* :func:`from_areal` — an AReaL rollout batch (dict of padded tensors, ``.safetensors``, ``.pt``
  read with ``weights_only=True``) or one trajectory per record (``.jsonl``, ``.parquet``);
* :func:`from_skyrl` — a SkyRL ``GeneratorOutput`` (dict, JSON, or pickle with ``trust=True``);
* :func:`from_steps` — step-wise logs: verifiers rollouts, rLLM episodes/trajectories,
  agent-lightning rollouts, or one step per line;
* :func:`from_chat` — OpenAI-style chat JSONL, with a local tokenizer;
* :func:`from_trl` — TRL ``completions_*.parquet``, with a local tokenizer;
* :func:`from_art` — ART trajectory Parquet, with a local tokenizer.

:func:`stream` converts chunk by chunk (bounded memory) and :func:`convert` writes the result to a
Parquet file or a folder — what ``mpo-viz convert`` runs. The field mapping of each source is in
its module's docstring and in ``docs/adapters.md``.

Common options: ``obs_reward='move'`` (default) moves rewards found on observation tokens to the
last action token before them, counted in ``report.rewards_moved``; ``'error'`` refuses such rows.
``errors='raise'`` (default) raises :class:`~mpo_viz.data.schema.TrajectoryError` at the first problem,
naming file, line/row, traj_id, field, the expected framework layout and what was found;
``errors='collect'`` keeps the good rows and lists the others in ``batch.rejected`` (and
``report.rejected``). A wrong layout for the whole input is raised either way. Nothing is dropped
silently, and nothing is unpickled without ``trust=True``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from mpo_viz.adapters._common import Collector, check_options, drive
from mpo_viz.adapters._write import write_chunks
from mpo_viz.adapters.areal import from_areal, iter_areal
from mpo_viz.adapters.art import from_art, iter_art
from mpo_viz.adapters.chat import from_chat, iter_chat
from mpo_viz.adapters.chat_template import ChatEncoder
from mpo_viz.adapters.conversion import ConversionReport, ConversionWarning
from mpo_viz.adapters.skyrl import from_skyrl, iter_skyrl
from mpo_viz.adapters.steps import from_steps, iter_steps
from mpo_viz.adapters.trl import from_trl, iter_trl
from mpo_viz.adapters.verl import from_verl, iter_verl
from mpo_viz.checks import OptionError

__all__ = [
    "ConversionReport",
    "ConversionWarning",
    "FORMATS",
    "from_verl",
    "from_areal",
    "from_skyrl",
    "from_steps",
    "from_chat",
    "from_trl",
    "from_art",
    "stream",
    "convert",
]

# name (``mpo-viz convert --from``) -> (row generator, options it takes, needs a tokenizer)
FORMATS: dict[str, tuple[Callable, tuple, bool]] = {
    "verl": (iter_verl, ("obs_reward", "trust"), False),
    "areal": (iter_areal, ("obs_reward",), False),
    "skyrl": (iter_skyrl, ("obs_reward", "trust"), False),
    "steps": (iter_steps, ("obs_reward",), False),
    "openai": (iter_chat, ("obs_reward", "tokenizer", "allow_unknown"), True),
    "trl": (iter_trl, ("obs_reward", "tokenizer", "allow_unknown"), True),
    "art": (iter_art, ("obs_reward", "tokenizer", "allow_unknown"), True),
}


def stream(
    kind: str,
    src,
    *,
    tokenizer=None,
    trust: bool = False,
    obs_reward: str = "move",
    errors: str = "raise",
    chunk_rows: int = 1024,
    allow_unknown: bool = False,
    unknown_role: str = "error",
    chunk_tokens: int = 1_000_000,
) -> tuple[Iterator, ConversionReport]:
    """Convert ``src`` with adapter ``kind`` chunk by chunk.

    Returns ``(batches, report)``: an iterator of validated TrajectoryBatches of at most about
    ``chunk_rows`` trajectories or ``chunk_tokens`` response tokens each, whichever is reached first
    (problems of each chunk in its ``rejected``), and the report (its counts do not depend on the chunks),
    complete once the iterator is exhausted (its warnings are then emitted as
    :class:`~mpo_viz.adapters.conversion.ConversionWarning`). ``allow_unknown`` (tokenizer adapters):
    convert even when most action tokens are the tokenizer's unknown token (checked at every chunk,
    over everything so far). ``unknown_role`` (tokenizer adapters): a message whose role is not an
    OpenAI chat role is a row problem (``"error"``) or kept as observation tokens with a warning
    (``"observation"``). An input without any record is an error.
    """
    if kind not in FORMATS:
        raise OptionError("kind", f"expected one of {sorted(FORMATS)}, found {kind!r}")
    check_options(obs_reward=obs_reward, errors=errors)
    gen_fn, takes, needs_tok = FORMATS[kind]
    if needs_tok and tokenizer is None:
        raise OptionError(
            "tokenizer",
            f"expected a local tokenizer folder ({kind} logs are text; the tokenizer "
            "turns them into token ids), found none",
        )
    if not needs_tok and tokenizer is not None:
        raise OptionError("tokenizer", f"expected none ({kind} logs hold token ids already), found {str(tokenizer)!r}")
    if allow_unknown and "allow_unknown" not in takes:
        raise OptionError(
            "allow_unknown",
            f"expected only with openai, trl or art inputs (text through a tokenizer), found it with {kind}",
        )
    if unknown_role != "error" and "allow_unknown" not in takes:
        raise OptionError(
            "unknown_role", f"expected only with openai, trl or art inputs (chat messages), found it with {kind}"
        )
    if trust and "trust" not in takes:
        raise OptionError(
            "trust",
            f"expected only with verl or skyrl inputs (the only ones that may be pickles), found it with {kind}",
        )
    opts: dict[str, Any] = {"obs_reward": obs_reward}
    if "trust" in takes:
        opts["trust"] = trust
    if "tokenizer" in takes:
        opts["tokenizer"] = ChatEncoder(tokenizer, allow_unknown=allow_unknown, unknown_role=unknown_role)
    col = Collector(kind, source=src if isinstance(src, (str, Path)) else None, errors=errors)
    return drive(gen_fn(src, col, **opts), col, chunk_rows, chunk_tokens), col.report


def convert(
    kind: str,
    src,
    out,
    *,
    tokenizer=None,
    trust: bool = False,
    obs_reward: str = "move",
    errors: str = "raise",
    chunk_rows: int = 1024,
    allow_unknown: bool = False,
    unknown_role: str = "error",
    chunk_tokens: int = 1_000_000,
) -> ConversionReport:
    """Convert ``src`` and write trajectory/v1 to ``out``: a ``.parquet`` file, or a folder of
    ``part-NNNNN.parquet`` files (one per chunk). **Streams** the output side: memory stays bounded by
    the chunk size (``chunk_rows`` trajectories or ``chunk_tokens`` response tokens), plus what the
    source format itself needs to read (a verl or AReaL batch file is one tensor dump). The same input
    always gives the same bytes. Returns the report.
    """
    batches, report = stream(
        kind,
        src,
        tokenizer=tokenizer,
        trust=trust,
        obs_reward=obs_reward,
        errors=errors,
        chunk_rows=chunk_rows,
        allow_unknown=allow_unknown,
        unknown_role=unknown_role,
        chunk_tokens=chunk_tokens,
    )
    write_chunks(batches, out)
    return report
