"""``mpo-viz export RUN [--iteration N] -o DIR``: a trained checkpoint as a plain model folder.

The work is :mod:`mpo_viz.train.export`'s; this module is the command's flags and messages.
"""

from __future__ import annotations

from mpo_viz.checks import OptionError

__all__ = ["add_subcommand"]

_DESCRIPTION = """\
Rebuild the policy (and critic) of a training run at one of its checkpoints and write them as a
model folder: DIR/policy (a Hugging Face causal LM with its tokenizer), DIR/critic when the run
learned one, and DIR/export.json (where it came from). DIR then goes wherever a model folder does
(--model, --model-dir, mpo_viz.models.load), in any process; --model also takes RUN itself."""


def cmd_export(args) -> int:
    from mpo_viz.train.export import export, locate

    try:
        ckpt = locate(args.run, args.iteration)
    except OptionError as exc:
        if exc.option == "model":
            raise OptionError("run", exc.detail) from None
        raise
    out = export(ckpt, args.out)
    print(
        f"wrote the model of {ckpt} to {out} (policy/{', critic/' if (out / 'critic').is_dir() else ''}); "
        f"use it with --model {out}",
        flush=True,
    )
    return 0


def add_subcommand(sub) -> None:
    p = sub.add_parser(
        "export", help="write a trained checkpoint (a run folder's) as a plain model folder", description=_DESCRIPTION
    )
    p.add_argument(
        "run",
        metavar="RUN",
        help="a run folder (mpo-viz train --run-dir), or one of its checkpoints RUN/checkpoints/iter=N",
    )
    p.add_argument(
        "--iteration",
        type=int,
        default=None,
        metavar="N",
        help="the checkpoint of iteration N (default the last; a run keeps its newest keep_checkpoints)",
    )
    p.add_argument("-o", "--out", required=True, metavar="DIR", help="the model folder to write (new or empty)")
    p.set_defaults(func=cmd_export)
