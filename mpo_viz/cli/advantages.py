"""``mpo-viz advantages`` and ``mpo-viz report``.

``advantages PATH -e mpo,gae,grpo -o OUT.parquet`` streams PATH through :func:`mpo_viz.io.scan`
(bounded memory: one chunk of ``--max-tokens`` response tokens at a time, groups kept together),
runs each estimator on each chunk and writes the rows with extra per-token columns
``adv_<name>`` / ``ret_<name>``. Chunks are written as parts and merged row group by row group, so
the output holds the union of the columns whatever chunk they first appear in; with ``-o FOLDER``
the parts are the output (one Parquet file per chunk, which ``mv.load``/``mv.scan`` read as one set).

``report PATH -o report.html`` writes the self-contained HTML report (:mod:`mpo_viz.report`).

Bad input: the loader's message on one line, exit code 1, no traceback.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from mpo_viz import analysis as an

__all__ = ["add_subcommand", "AdvantagesConfig", "annotate_file"]


@dataclass
class AdvantagesConfig:
    """What :func:`annotate_file` takes besides the paths (one flat config)."""

    estimators: tuple[str, ...] = ("mpo", "gae", "grpo")
    """estimator names (see ``mpo_viz.advantages.available()``)."""
    options: dict = field(default_factory=dict)
    """options shared by the estimators (gamma, lam, turn_gamma, turn_lam, beta, within, ...);
    each estimator receives those it accepts."""
    max_tokens: int = 1_000_000
    """response tokens per chunk (memory bound)."""
    progress: bool | None = None
    """tqdm progress bar on stderr (None: only on a terminal)."""


def _parts_dir(out: Path) -> Path:
    return out.with_name(out.name + ".parts.tmp")


def annotate_file(path, out, config: AdvantagesConfig | None = None) -> dict:
    """Add ``adv_<name>`` / ``ret_<name>`` columns for each estimator to every row of ``path``.

    ``out``: a ``.parquet`` or ``.jsonl`` file, or a folder (one Parquet file per chunk). The input
    is read with ``errors="raise"``: the first invalid row stops the run with the loader's message
    and no output is left behind. Returns statistics: ``out``, ``trajectories``, ``tokens``
    (response tokens), ``chunks``, ``seconds``, ``tokens_per_s`` and per-phase ``timings``.
    """
    import mpo_viz as mv
    from mpo_viz import advantages as adv
    from mpo_viz.report import _count_rows, iter_group_chunks

    cfg = config or AdvantagesConfig()
    out = Path(out)
    folder = out.suffix == "" or out.is_dir()
    if not folder and out.suffix not in (".parquet", ".jsonl"):
        raise ValueError(f"-o: expected a .parquet or .jsonl path or a folder, found {str(out)!r}")
    if folder and out.exists() and any(out.glob("part-*.parquet")):
        raise ValueError(f"-o: folder {str(out)!r} already holds part-*.parquet files; expected a new or empty folder")
    src, dst = Path(path).resolve(), out.resolve()
    if dst == src or src in dst.parents or (folder and dst in src.parents):
        raise ValueError(f"-o: expected an output outside the input, found {str(out)!r} for input {str(path)!r} "
                         f"(the input would be overwritten, or read back with the output as one set)")
    names = [e.strip() for e in cfg.estimators if e.strip()]
    if not names:
        raise ValueError("-e: expected at least one estimator name, found none")
    for n in names:
        adv.get(n)  # unknown names fail before any work, listing the available ones
    need_groups = any(an.is_group_estimator(n) for n in names)
    opts = {n: an.estimator_options(n, cfg.options) for n in names}
    t0 = time.perf_counter()
    timings = {"read": 0.0, "estimate": 0.0, "write": 0.0}
    # a folder output receives one Parquet file per chunk directly (no merge pass); a file output
    # is assembled from parts in a temporary folder beside it
    parts = out if folder else _parts_dir(out)
    if not folder and parts.exists():
        shutil.rmtree(parts)
    parts.mkdir(parents=True, exist_ok=True)
    n_traj = n_tok = n_chunks = 0
    from tqdm.auto import tqdm

    ok = False
    bar = tqdm(total=_count_rows(path), unit="traj", desc="advantages", leave=False, dynamic_ncols=True,
               disable=None if cfg.progress is None else not cfg.progress)
    try:
        it = iter_group_chunks(mv.scan(path, max_tokens=cfg.max_tokens), need_groups=need_groups)
        while True:
            ta = time.perf_counter()
            chunk = next(it, None)
            timings["read"] += time.perf_counter() - ta
            if chunk is None:
                break
            tb = time.perf_counter()
            cols = {}
            for n in names:
                r = adv.compute(chunk, n, **opts[n])
                cols[f"adv_{n}"] = r.advantages
                cols[f"ret_{n}"] = r.returns
            annotated = chunk.with_token_fields(**cols)
            annotated.meta = {**chunk.meta, "advantage_estimators": {n: _jsonable(r_opts) for n, r_opts in opts.items()}}
            tc = time.perf_counter()
            timings["estimate"] += tc - tb
            mv.save(annotated, parts / f"part-{n_chunks:06d}.parquet" if folder or out.suffix == ".parquet"
                    else parts / f"part-{n_chunks:06d}" / f"rows{out.suffix}")
            timings["write"] += time.perf_counter() - tc
            n_chunks += 1
            n_traj += len(chunk)
            n_tok += int(chunk.lengths.sum())
            bar.update(len(chunk))
            del chunk, annotated, cols
        tm = time.perf_counter()
        if n_chunks == 0:
            raise ValueError(f"{path}: no trajectories to annotate")
        if not folder:
            _merge_parts(parts, out)
        timings["write"] += time.perf_counter() - tm
        ok = True
    finally:
        bar.close()
        if not folder:
            shutil.rmtree(parts, ignore_errors=True)
        elif not ok:
            for f in parts.glob("part-*.parquet"):  # no half-written folder left behind
                f.unlink()
    secs = time.perf_counter() - t0
    return {"out": str(out), "trajectories": n_traj, "tokens": n_tok, "chunks": n_chunks, "seconds": secs,
            "tokens_per_s": n_tok / secs if secs > 0 else float("nan"), "timings": timings}


def _jsonable(d: dict) -> dict:
    return {k: (v if isinstance(v, (int, float, str, bool)) or v is None else str(v)) for k, v in d.items()}


def _merge_parts(parts: Path, out: Path) -> None:
    """Concatenate the part files into ``out`` (temporary name, then rename)."""
    tmp = out.with_name(out.name + ".tmp")
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        files = sorted(parts.glob("part-*.parquet"))
        schemas = [pq.read_schema(f) for f in files]
        unified = pa.unify_schemas([s.remove_metadata() for s in schemas], promote_options="permissive")
        unified = unified.with_metadata(schemas[0].metadata)
        with pq.ParquetWriter(tmp, unified, compression="zstd") as w:
            for f in files:
                pf = pq.ParquetFile(f)
                for g in range(pf.num_row_groups):
                    t = pf.read_row_group(g)
                    cols = [
                        t.column(fld.name).cast(fld.type) if fld.name in t.column_names else pa.nulls(t.num_rows, fld.type)
                        for fld in unified
                    ]
                    w.write_table(pa.Table.from_arrays(cols, schema=unified))
        os.replace(tmp, out)
    else:
        from mpo_viz.schema import JSONL_META_NAME

        dirs = sorted(parts.glob("part-*"))
        with open(tmp, "wb") as fh:
            for d in dirs:
                with open(d / f"rows{out.suffix}", "rb") as src:
                    shutil.copyfileobj(src, fh)
        os.replace(tmp, out)
        shutil.copyfile(dirs[0] / JSONL_META_NAME, out.parent / JSONL_META_NAME)


# ------------------------------------------------------------------------------------------------
# argparse

# The registered estimators, spelled out for --help without importing the numba kernels at parser
# build time (tests/test_report.py checks this list against mpo_viz.advantages.available()).
ESTIMATOR_NAMES = ("mpo", "mae", "turn_gae", "gae", "vapo", "grpo", "drgrpo", "rloo", "reinforce_pp",
                   "reinforce_pp_baseline", "gigpo")

_ADVANTAGES_DESCRIPTION = """\
Stream PATH chunk by chunk (--max-tokens response tokens at a time, the rows of a group kept
together), run each estimator on each chunk and write every input row with extra per-token
columns adv_<name> and ret_<name>. -o FILE.parquet or FILE.jsonl writes one file; -o FOLDER
writes one Parquet file per chunk (mpo-viz and mv.load read the folder as one set). Bad input
stops with the loader's one-line message and leaves no output behind."""

_REPORT_DESCRIPTION = """\
Write one self-contained HTML file (opens offline): summary, advantages by estimator, estimator
agreement, critic values across vs within turns, and the token strip, value curve and per-turn
advantages of the best, worst and most disagreed-on trajectories. PATH is streamed chunk by
chunk; statistics are those of the whole file."""


def _estimator_args(p, default: str | None) -> None:
    p.add_argument("-e", "--estimators", default=default,
                   help=f"comma-separated, from: {', '.join(ESTIMATOR_NAMES)}" + (f" (default {default})" if default else
                                                                             " (default: mpo,gae,grpo where the data allow)"))
    g = p.add_argument_group("estimator options (each estimator takes the ones it accepts; unset = its default)")
    g.add_argument("--gamma", type=float, help="token discount γ")
    g.add_argument("--lam", type=float, help="token λ")
    g.add_argument("--turn-gamma", type=float, help="turn discount γ_T (turn_gae, mpo)")
    g.add_argument("--turn-lam", type=float, help="turn λ_T (turn_gae, mpo)")
    g.add_argument("--beta", type=float, help="MAE weight of the within-turn signal")
    g.add_argument("--within", choices=["intra", "local", "global", "td"], help="MAE within-turn signal")
    g.add_argument("--value-at", choices=["first", "last", "mean"], help="turn value V(s_k)")
    g.add_argument("--critic-target", choices=["mc", "turn"], help="MAE returns")
    g.add_argument("--whiten", action="store_true", default=None, help="whiten advantages (per chunk)")
    p.add_argument("--max-tokens", type=int, default=1_000_000, help="response tokens per chunk (default 1,000,000)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _options(args) -> dict:
    keys = ("gamma", "lam", "turn_gamma", "turn_lam", "beta", "within", "value_at", "critic_target", "whiten")
    return {k: getattr(args, k) for k in keys if getattr(args, k) is not None}


def _names(s: str | None) -> tuple[str, ...] | None:
    """The ``-e`` list, each name checked against the registry (the message names the flag)."""
    if s is None:
        return None
    names = tuple(e.strip() for e in s.split(",") if e.strip())
    from mpo_viz.advantages import available

    for n in names:
        if n not in available():
            hint = f" (names are lower case: {n.lower()!r})" if n.lower() in available() else ""
            raise ValueError(f"-e/--estimators: unknown estimator {n!r}{hint}; available: {', '.join(available())}")
    return names


_FLAG_KEYS = ("gamma", "lam", "turn_gamma", "turn_lam", "beta", "within", "value_at", "critic_target", "whiten",
              "max_tokens")


def _as_flag(exc: ValueError) -> ValueError:
    """``lam: expected ...`` from the Python API reads ``--lam: expected ...`` on the command line."""
    msg = str(exc)
    key = msg.split(":", 1)[0]
    return ValueError("--" + key.replace("_", "-") + msg[len(key):]) if key in _FLAG_KEYS else exc


@contextlib.contextmanager
def _errors_name_flags():
    """Re-raise a ValueError about an option under its command-line flag (``lam: ...`` -> ``--lam: ...``)."""
    try:
        yield
    except ValueError as exc:
        flagged = _as_flag(exc)
        if flagged is exc:
            raise
        raise flagged from exc


def cmd_advantages(args) -> int:
    cfg = AdvantagesConfig(estimators=_names(args.estimators), options=_options(args), max_tokens=args.max_tokens,
                           progress=False if args.no_progress else None)
    with _errors_name_flags():
        stats = annotate_file(args.path, args.output, cfg)
    print(f"wrote {stats['out']}: {stats['trajectories']:,} trajectories, {stats['tokens']:,} tokens, "
          f"columns {', '.join(f'adv_{n}, ret_{n}' for n in cfg.estimators)} "
          f"({stats['seconds']:.1f}s, {stats['tokens_per_s']:,.0f} tokens/s)")
    return 0


def cmd_report(args) -> int:
    from mpo_viz.report import ReportConfig, write_report

    o = _options(args)
    cfg = ReportConfig(estimators=_names(args.estimators), **o, n_best=args.n_best, n_worst=args.n_worst,
                       n_disagreed=args.n_disagreed, title=args.title, max_tokens=args.max_tokens,
                       progress=False if args.no_progress else None, tokenizer=args.tokenizer,
                       export_dir=args.export)
    t = time.perf_counter()
    with _errors_name_flags():
        p = write_report(args.path, args.output, cfg)
    print(f"wrote {p} ({p.stat().st_size / 1e6:.1f} MB, {time.perf_counter() - t:.1f}s); open it in a browser (works offline)")
    return 0


def add_subcommand(sub) -> None:
    p = sub.add_parser("advantages", help="add adv_<name>/ret_<name> columns for chosen estimators (streams)",
                       description=_ADVANTAGES_DESCRIPTION)
    p.add_argument("path", help="trajectories: .jsonl, .parquet or a folder")
    p.add_argument("-o", "--output", required=True,
                   help="output .parquet or .jsonl file, or a folder (one Parquet file per chunk, no merge pass)")
    _estimator_args(p, "mpo,gae,grpo")
    p.set_defaults(func=cmd_advantages)

    r = sub.add_parser("report", help="self-contained offline HTML report (summary, across/within, token strips)",
                       description=_REPORT_DESCRIPTION)
    r.add_argument("path", help="trajectories: .jsonl, .parquet or a folder")
    r.add_argument("-o", "--output", default="report.html", help="output HTML (default report.html)")
    _estimator_args(r, None)
    r.add_argument("--title", default="mpo_viz report", help="page title")
    r.add_argument("--n-best", type=int, default=2, help="highest-score trajectories to show (default 2)")
    r.add_argument("--n-worst", type=int, default=2, help="lowest-score trajectories to show (default 2)")
    r.add_argument("--n-disagreed", type=int, default=2, help="most disagreed-on trajectories to show (default 2)")
    r.add_argument("--tokenizer", metavar="DIR", default=None,
                   help="local tokenizer folder (or tokenizer.json): show decoded text in the strips when the data "
                        "has no response_tokens; loaded offline, nothing is downloaded")
    r.add_argument("--export", metavar="DIR", default=None,
                   help="also write the report's tables as CSV, and its figures as PNG and SVG when plotly's static "
                        "renderer (kaleido) is installed, into DIR")
    r.set_defaults(func=cmd_report)
