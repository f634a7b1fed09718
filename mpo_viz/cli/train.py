"""``mpo-viz train``: SFT warm start, critic warm-up and RL iterations, writing a run folder.

::

    mpo-viz train --env search --estimator mpo --loss turn_ppo --iterations 30 --run-dir runs/mpo
    mpo-viz train --resume runs/mpo --iterations 50      # continue up to 50 iterations in all

Flags override the fields of ``--config FILE.json`` (a :class:`mpo_viz.train.Config` as JSON);
every other field keeps its default. One progress line per iteration, a summary at the end.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
import warnings

from mpo_viz import losses
from mpo_viz import train as training
from mpo_viz.advantages import registry
from mpo_viz.checks import OptionError
from mpo_viz.cli.advantages import estimator_option_help
from mpo_viz.cli.errors import CLIError
from mpo_viz.cli.flags import (
    ENV_OPTIONS,
    add_env_options,
    add_option,
    env_help,
    option_help,
    read_text,
)
from mpo_viz.data.runfolder import RunFolder
from mpo_viz.options import Option
from mpo_viz.train.checkpoint import CheckpointWarning
from mpo_viz.train.config import Config
from mpo_viz.train.summary import phase_line, summary_lines

#: the dict fields whose keys get flags of their own (``--beta`` fills ``estimator_options.beta``,
#: ``--slip`` ``env_options.slip``)
OPTION_FIELDS = ("estimator_options", "loss_options", ENV_OPTIONS)
#: their repeatable escape flags
ESCAPE_FLAGS = ("--estimator-option", "--loss-option", "--env-option")


def _trainer_warnings() -> tuple:
    """Warning classes printed as one ``mpo-viz train: warning: ...`` line (the tokenizer's lazily:
    transformers)."""
    from mpo_viz.envs.tokenizer import UnknownTextWarning

    return (CheckpointWarning, UnknownTextWarning)


def _config(base: dict, over: dict, source: str) -> Config:
    """A Config from the file's fields ``base`` and the flags' ``over``. A bad field stays an
    OptionError (``mpo-viz`` then names its flag: ``--episodes: ...``, ``--group-size: ...``) unless
    its value came from the config file, which is then named with the field."""
    try:
        return Config.from_dict({**base, **over}, source=source)
    except OptionError as exc:
        field = str(exc.option).partition(".")[0]  # loss_options.token_clip -> loss_options
        if field in base and field not in over:
            raise ValueError(f"{source}: {exc}") from None
        raise


def _options(items, flag: str) -> dict:
    """``KEY=VALUE`` strings as a dict; each VALUE is read as JSON (``2``, ``1e-3``, ``true``,
    ``null``) and kept as text when it is not JSON (``within=local``)."""
    out = {}
    for item in items or ():
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            example = {"--loss-option": "token_clip=2", "--env-option": "slack=3"}.get(flag, "turn_lam=1.0")
            raise ValueError(f"{flag}: expected KEY=VALUE (e.g. {flag} {example}), found {item!r}")
        try:
            out[key.strip()] = json.loads(text)
        except json.JSONDecodeError:
            out[key.strip()] = text
    return out


def _overrides(args) -> dict:
    """The Config fields the flags set (an absent flag leaves no attribute: None is a value)."""
    given = vars(args)
    return {name: read_text(Config.options()[name], given[name]) for name in _field_flags() if name in given}


def _field_flags() -> list[str]:
    """The Config fields with a flag of their own (all but the dicts of options)."""
    return [name for name, o in Config.options().items() if o.kind != "dict"]


def _with_options(cfg_dict: dict, args) -> dict:
    """The config's ``estimator_options``/``loss_options`` updated key by key: from the repeatable
    ``--estimator-option``/``--loss-option KEY=VALUE`` flags, then the typed flags (``--beta``,
    ``--token-clip``)."""
    out = {}
    given = vars(args)
    for field, flag in zip(OPTION_FIELDS, ESCAPE_FLAGS):
        typed = {k.partition(".")[2]: v for k, v in given.items() if k.startswith(field + ".")}
        escape = _options(given.get(field), flag)
        if typed or escape:
            out[field] = {**(cfg_dict.get(field) or {}), **escape, **typed}
    return out


def cmd_train(args) -> int:
    # a launched run is stopped with SIGINT; make sure it raises KeyboardInterrupt here
    signal.signal(signal.SIGINT, signal.default_int_handler)
    with warnings.catch_warnings():
        warnings.showwarning = _one_line_warning
        return _train(args)


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """The trainer's own warnings (a damaged checkpoint skipped) as one line on stderr; others as
    Python shows them."""
    if issubclass(category, _trainer_warnings()):
        print(f"mpo-viz train: warning: {message}", file=sys.stderr, flush=True)
    else:
        sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


def _train(args) -> int:
    # a bad option is named by the flag that gave it: the typed flag, else --estimator-option/--loss-option
    args.flags = {k: v for k, v in args.flags.items() if "." not in k or k in vars(args)}
    over = _overrides(args)
    if args.resume:
        if args.run_dir:
            raise CLIError("--run-dir: not with --resume (the run folder is the one being resumed)", 2)
        cfg = None
        if args.config or set(over) - {"iterations"} or _with_options({}, args):
            src = args.config or str(RunFolder(args.resume).config_path)
            base = Config.load(src).to_dict()
            cfg = _config(base, {**over, **_with_options(base, args)}, src)
        # (mpo_viz.train.Trainer is imported on first use: the models, transformers, for this command only)
        tr = training.Trainer.resume(args.resume, cfg, iterations=over.get("iterations"))
        print(f"resuming {args.resume} at iteration {tr.iteration} of {tr.cfg.iterations}", flush=True)
    else:
        if not args.run_dir:
            raise CLIError("--run-dir: expected the folder to write the run to (or --resume DIR)", 2)
        base = Config.load(args.config).to_dict() if args.config else {}
        cfg = _config(base, {**over, **_with_options(base, args)}, args.config or "config")
        tr = training.Trainer(cfg, args.run_dir)
        print(
            f"training {cfg.estimator} + {cfg.loss} on {cfg.env} for {cfg.iterations} iterations "
            f"({cfg.episodes} episodes, G={cfg.group_size}, {cfg.epochs}x{cfg.minibatches} updates) -> "
            f"{args.run_dir}",
            flush=True,
        )
    t0 = time.perf_counter()
    try:
        out = tr.run_all(log=lambda line: print(line, flush=True))
    finally:
        tr.close()
    wall = time.perf_counter() - t0
    last_eval = next((r for r in reversed(tr.history) if "eval_success" in r), None)
    if tr.interrupted:
        print(
            f"interrupted at iteration {tr.iteration}; continue with: mpo-viz train --resume {tr.run.path} "
            f"--iterations {tr.cfg.iterations}",
            file=sys.stderr,
            flush=True,
        )
        return 130
    summary = f"done: {len(out)} iterations in {wall:.1f} s, at iteration {tr.iteration}/{tr.cfg.iterations}"
    if out:
        summary += f"; last rollout success {out[-1]['success']:.3f}"
    if last_eval:
        summary += (
            f"; held-out sampled success {last_eval.get('eval_sampled_success', float('nan')):.3f}, "
            f"greedy {last_eval['eval_success']:.3f}"
        )
    print(summary + f"; run folder {tr.run.path}", flush=True)
    print(phase_line(tr.history, wall), flush=True)
    if out:
        for line in summary_lines(tr.run.metrics()):
            print(line, flush=True)
    return 0


def add_subcommand(sub, env_hint: str | None = None) -> None:
    p = sub.add_parser(
        "train",
        help="train a policy with any estimator and loss, writing a run folder",
        description="SFT warm start, critic warm-up and RL iterations (rollout, advantages, "
        "E x M updates, evaluation), writing a run folder that TrainingDashboard "
        "reads. Flags override --config; --resume continues a run. Every Config "
        "field has a flag (docs/training.md lists them); an optional one takes none.",
    )
    p.add_argument("--run-dir", dest="run_dir", help="the run folder to create")
    p.add_argument("--resume", metavar="DIR", help="continue the run in DIR from its latest checkpoint")
    p.add_argument("--config", metavar="FILE.json", help="a Config as JSON; flags override its fields")
    g = p.add_argument_group("config fields (unset: the --config file's value, else the default)")
    for name in _field_flags():
        o = Config.options()[name]
        text = env_help() + "; default 'search'" if name == "env" else option_help(o, doc=_first_sentence(o.doc))
        add_option(g, o, help=text, default=argparse.SUPPRESS)
    _option_flags(p)
    g = p.add_argument_group(
        "environment options (the environment takes those it declares; unset: its default; an "
        "entry point's or package.module:factory's own options show with --env NAME --help)"
    )
    g.add_argument(
        "--env-option",
        dest=ENV_OPTIONS,
        action="append",
        metavar="KEY=VALUE",
        help="any option of the environment, repeatable (e.g. slack=3; the value read as JSON when it is)",
    )
    add_env_options(g, p, env_hint)
    p.set_defaults(func=cmd_train)


def _option_flags(p) -> None:
    """One typed flag per estimator option and per loss option (``--beta``, ``--token-clip``),
    each filling its key of ``estimator_options`` / ``loss_options``; and the generic escapes."""
    names = registry.available_estimators()
    g = p.add_argument_group("estimator options (the estimator takes those it declares; unset: its default)")
    for o in registry.vocabulary(names).values():
        if o.kind != "any":
            add_option(
                g,
                o,
                help=estimator_option_help(o, names),
                dest=f"estimator_options.{o.name}",
                default=argparse.SUPPRESS,
            )
    g.add_argument(
        "--estimator-option",
        dest="estimator_options",
        action="append",
        metavar="KEY=VALUE",
        help="any option of the estimator, repeatable (e.g. beta=0.5, turn_lam=1.0)",
    )
    g = p.add_argument_group("loss options (the loss takes those it declares; unset: its default)")
    for o in _loss_vocabulary().values():
        add_option(g, o, help=_loss_option_help(o), dest=f"loss_options.{o.name}", default=argparse.SUPPRESS)
    g.add_argument(
        "--loss-option",
        dest="loss_options",
        action="append",
        metavar="KEY=VALUE",
        help="any option of the loss, repeatable (e.g. token_clip=2, clip_high=0.28, agg=seq-mean-token-mean)",
    )


def _loss_vocabulary() -> dict[str, Option]:
    """Every option of the registered loss kinds, by name (the first declaration of each)."""
    out: dict[str, Option] = {}
    for kind in losses.available_losses():
        for o in losses.loss_options(kind):
            if o.kind != "any":
                out.setdefault(o.name, o)
    return out


def _loss_option_help(o: Option) -> str:
    """The option's help with each loss kind's default (``defaults gspo None, turn_ppo 2.0``)."""
    defaults = {k: x.default for k in losses.available_losses() for x in losses.loss_options(k) if x.name == o.name}
    if len(set(map(repr, defaults.values()))) == 1:
        return option_help(o)
    return option_help(o, defaults="defaults " + ", ".join(f"{k} {v!r}" for k, v in defaults.items()))


def _first_sentence(doc: str) -> str:
    head, dot, _ = doc.partition(". ")
    return head + ("." if dot else "")
