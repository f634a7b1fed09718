"""``mpo-viz train``: SFT warm start, critic warm-up and RL iterations, writing a run folder.

::

    mpo-viz train --env search --estimator mpo --loss turn_ppo --iterations 30 --run-dir runs/mpo
    mpo-viz train --resume runs/mpo --iterations 50      # continue up to 50 iterations in all

Flags override the fields of ``--config FILE.json`` (a :class:`mpo_viz.train.Config` as JSON);
every other field keeps its default. One progress line per iteration, a summary at the end.
"""

from __future__ import annotations

import json
import signal
import sys
import time

#: flag -> Config field, for the flags that set a field directly
FLAGS = {
    "env": "env", "estimator": "estimator", "loss": "loss", "iterations": "iterations",
    "episodes": "episodes", "group_size": "group_size", "epochs": "epochs", "minibatches": "minibatches",
    "sft_steps": "sft_steps", "seed": "seed", "difficulty": "difficulty", "model_size": "model_size",
    "model_dir": "model_dir", "policy_lr": "policy_lr", "critic_lr": "critic_lr",
    "eval_interval": "eval_interval", "eval_episodes": "eval_episodes", "policy_lag": "policy_lag",
    "kl_coef": "kl_coef", "entropy_coef": "entropy_coef", "device": "device",
    "sft_lr": "sft_lr", "sft_target_success": "sft_target_success", "sft_noise": "sft_noise",
    "critic_warmup_steps": "critic_warmup_steps", "critic_warmup_ev": "critic_warmup_ev",
    "critic_warmup_episodes": "critic_warmup_episodes", "critic": "critic", "critic_epochs": "critic_epochs",
}


def _difficulty(text: str):
    try:
        if "-" in text:
            lo, hi = text.split("-", 1)
            return [int(lo), int(hi)]
        return int(text)
    except ValueError:
        raise ValueError(f"--difficulty: expected N or MIN-MAX (expert turns), found {text!r}") from None


def _config(base: dict, over: dict, source: str):
    """A Config from the file's fields ``base`` and the flags' ``over``. A bad field stays an
    OptionError (``mpo-viz`` then names its flag: ``--episodes: ...``, ``--group-size: ...``) unless
    its value came from the config file, which is then named with the field."""
    from mpo_viz.checks import OptionError
    from mpo_viz.train.config import Config

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
            raise ValueError(f"{flag}: expected KEY=VALUE (e.g. {flag} {'token_clip=2' if 'loss' in flag else 'turn_lam=1.0'}), "
                             f"found {item!r}")
        try:
            out[key.strip()] = json.loads(text)
        except json.JSONDecodeError:
            out[key.strip()] = text
    return out


def _overrides(args) -> dict:
    out = {}
    for flag, field in FLAGS.items():
        v = getattr(args, flag, None)
        if v is None:
            continue
        out[field] = _difficulty(v) if flag == "difficulty" else v
    return out


def _with_options(cfg_dict: dict, args) -> dict:
    """The config's ``estimator_options``/``loss_options`` updated key by key from the repeatable
    ``--estimator-option``/``--loss-option`` flags."""
    out = {}
    for flag, field in (("--estimator-option", "estimator_options"), ("--loss-option", "loss_options")):
        given = _options(getattr(args, field, None), flag)
        if given:
            out[field] = {**(cfg_dict.get(field) or {}), **given}
    return out


def cmd_train(args) -> int:
    from mpo_viz.cli import CLIError
    from mpo_viz.train.config import Config
    from mpo_viz.train.loop import Trainer

    # a launched run is stopped with SIGINT; make sure it raises KeyboardInterrupt here
    signal.signal(signal.SIGINT, signal.default_int_handler)
    over = _overrides(args)
    if args.resume:
        if args.run_dir:
            raise CLIError("--run-dir: not with --resume (the run folder is the one being resumed)", 2)
        cfg = None
        if args.config or set(over) - {"iterations"} or args.estimator_options or args.loss_options:
            from mpo_viz.train.runfolder import RunFolder

            src = args.config or str(RunFolder(args.resume).config_path)
            base = Config.load(src).to_dict()
            cfg = _config(base, {**over, **_with_options(base, args)}, src)
        tr = Trainer.resume(args.resume, cfg, iterations=over.get("iterations"))
        print(f"resuming {args.resume} at iteration {tr.iteration} of {tr.cfg.iterations}", flush=True)
    else:
        if not args.run_dir:
            raise CLIError("--run-dir: expected the folder to write the run to (or --resume DIR)", 2)
        base = Config.load(args.config).to_dict() if args.config else {}
        cfg = _config(base, {**over, **_with_options(base, args)}, args.config or "config")
        tr = Trainer(cfg, args.run_dir)
        print(f"training {cfg.estimator} + {cfg.loss} on {cfg.env} for {cfg.iterations} iterations "
              f"({cfg.episodes} episodes, G={cfg.group_size}, {cfg.epochs}x{cfg.minibatches} updates) -> "
              f"{args.run_dir}", flush=True)
    t0 = time.perf_counter()
    out = tr.run_all(log=lambda line: print(line, flush=True))
    wall = time.perf_counter() - t0
    last_eval = next((r for r in reversed(tr.history) if "eval_success" in r), None)
    if tr.interrupted:
        print(f"interrupted at iteration {tr.iteration}; continue with: mpo-viz train --resume {tr.run.path} "
              f"--iterations {tr.cfg.iterations}", file=sys.stderr, flush=True)
        return 130
    summary = f"done: {len(out)} iterations in {wall:.1f} s, at iteration {tr.iteration}/{tr.cfg.iterations}"
    if out:
        summary += f"; last rollout success {out[-1]['success']:.3f}"
    if last_eval:
        summary += (f"; held-out sampled success {last_eval.get('eval_sampled_success', float('nan')):.3f}, "
                    f"greedy {last_eval['eval_success']:.3f}")
    print(summary + f"; run folder {tr.run.path}", flush=True)
    return 0


def add_subcommand(sub) -> None:
    p = sub.add_parser("train", help="train a policy with any estimator and loss, writing a run folder",
                       description="SFT warm start, critic warm-up and RL iterations (rollout, advantages, "
                                   "E x M updates, evaluation), writing a run folder that TrainingDashboard "
                                   "reads. Flags override --config; --resume continues a run.")
    p.add_argument("--env", help="environment (search, tooluse, automation)")
    p.add_argument("--estimator", help="advantage estimator (mpo, gae, grpo, ...)")
    p.add_argument("--loss", help="policy loss (turn_ppo, token_ppo, gspo, sao)")
    p.add_argument("--estimator-option", dest="estimator_options", action="append", metavar="KEY=VALUE",
                   help="an option of the estimator, repeatable (e.g. beta=0.5, turn_lam=1.0)")
    p.add_argument("--loss-option", dest="loss_options", action="append", metavar="KEY=VALUE",
                   help="an option of the loss, repeatable (e.g. token_clip=2, clip_high=0.28, agg=seq-mean-token-mean)")
    p.add_argument("--iterations", type=int, help="RL iterations in all (with --resume: the new total)")
    p.add_argument("--run-dir", dest="run_dir", help="the run folder to create")
    p.add_argument("--resume", metavar="DIR", help="continue the run in DIR from its latest checkpoint")
    p.add_argument("--config", metavar="FILE.json", help="a Config as JSON; flags override its fields")
    p.add_argument("--episodes", type=int, help="episodes per iteration")
    p.add_argument("--group-size", dest="group_size", type=int, help="samples per task (G)")
    p.add_argument("--epochs", type=int, help="passes over each iteration's episodes (E)")
    p.add_argument("--minibatches", type=int, help="optimizer steps per epoch (M)")
    p.add_argument("--sft-steps", dest="sft_steps", type=int, help="SFT warm-start step budget (0: none)")
    p.add_argument("--sft-lr", dest="sft_lr", type=float, help="SFT learning rate")
    p.add_argument("--sft-target-success", dest="sft_target_success", type=float,
                   help="SFT stops at this greedy eval success (0..1)")
    p.add_argument("--sft-noise", dest="sft_noise", type=float, help="noise rate of the imitated expert (0..1)")
    p.add_argument("--critic", choices=("learned", "oracle"),
                   help="values from a learned critic (default) or the environment's exact oracle values")
    p.add_argument("--critic-epochs", dest="critic_epochs", type=int,
                   help="critic passes over each iteration's episodes (default 4)")
    p.add_argument("--critic-warmup-episodes", dest="critic_warmup_episodes", type=int,
                   help="episodes of the start policy the critic warm-up fits (default 512)")
    p.add_argument("--critic-warmup-steps", dest="critic_warmup_steps", type=int,
                   help="critic warm-up step budget (default 256; 0: none)")
    p.add_argument("--critic-warmup-ev", dest="critic_warmup_ev", type=float,
                   help="held-out explained variance that ends the critic warm-up (default 0.2)")
    p.add_argument("--seed", type=int, help="master seed")
    p.add_argument("--difficulty", help="expert turns per task: N or MIN-MAX")
    p.add_argument("--model-size", dest="model_size", help="tiny policy size: 1m, 3m, 10m")
    p.add_argument("--model-dir", dest="model_dir", help="start from a local model folder (DIR/policy, DIR/critic)")
    p.add_argument("--policy-lr", dest="policy_lr", type=float, help="policy learning rate")
    p.add_argument("--critic-lr", dest="critic_lr", type=float, help="critic learning rate")
    p.add_argument("--eval-interval", dest="eval_interval", type=int, help="iterations between evaluations")
    p.add_argument("--eval-episodes", dest="eval_episodes", type=int,
                   help="held-out tasks per evaluation (each played greedy and sampled; default 128)")
    p.add_argument("--policy-lag", dest="policy_lag", type=int, help="update on rollouts N iterations old")
    p.add_argument("--kl-coef", dest="kl_coef", type=float, help="KL-to-reference coefficient (0: off)")
    p.add_argument("--entropy-coef", dest="entropy_coef", type=float, help="entropy bonus (0: off)")
    p.add_argument("--device", help="torch device (cpu, cuda)")
    p.set_defaults(func=cmd_train)
