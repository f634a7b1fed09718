"""A policy: a causal LM with its tokenizer and chat layout; loading any local Hugging Face folder.

Loading is offline (``local_files_only=True``) and runs no code from the folder unless
``trust_remote_code=True``. Every error names the folder.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from mpo_viz.checks import OptionError
from mpo_viz.models.layout import layout_for

__all__ = [
    "Policy",
    "load_policy",
    "save_policy",
    "check_vocabulary",
    "resolve_dtype",
    "resolve_device",
    "embedding_rows",
]

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


class Policy:
    """A causal language model, its tokenizer, and the layout that turns conversations into ids.

    Fields:
        model: a Hugging Face ``*ForCausalLM`` (``model(input_ids, attention_mask, position_ids,
            past_key_values) -> logits (B, T, V)``); train it like any ``nn.Module``.
        tokenizer: its tokenizer (``save_pretrained``-able).
        layout: :func:`~mpo_viz.models.layout.layout_for` the tokenizer — the environments'
            word-level chat layout, or the tokenizer's chat template.
        path: the folder it was loaded from (None when built in memory).
        name: a description for messages and metadata when there is no path.
    """

    def __init__(self, model, tokenizer, *, path: str | None = None, name: str | None = None):
        if not callable(model) or not hasattr(model, "config"):
            raise OptionError("model", f"expected a Hugging Face causal LM, found {type(model).__name__}")
        self.model = model
        self.tokenizer = tokenizer
        self.path = path
        self._name = name
        gen = getattr(model, "generation_config", None)
        eos = getattr(gen, "eos_token_id", None) if gen is not None else None
        stop = [eos] if isinstance(eos, int) else list(eos or [])
        self.layout = layout_for(tokenizer, stop_ids=stop)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    @property
    def name(self) -> str:
        """The folder it came from, or a short description."""
        return self.path or self._name or f"<{type(self.model).__name__} in memory>"

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    def __repr__(self) -> str:
        return (
            f"Policy({type(self.model).__name__}, {self.num_parameters() / 1e6:.2f}M parameters, "
            f"vocab {len(self.tokenizer)}, {self.dtype}, {self.device}, from {self.name})"
        )


#: how to get a torch that has CUDA (docs/training.md, "On a GPU")
CUDA_INSTALL = (
    "pip install --force-reinstall torch --index-url https://download.pytorch.org/whl/cu126 "
    "(pick the CUDA version of your driver at pytorch.org/get-started)"
)


def resolve_device(device) -> torch.device:
    """``device`` as a ``torch.device`` this torch can use, else an :class:`OptionError` (option
    ``device``) in one line: which backend is missing and how to get it — a CPU-only torch build
    needs a CUDA build (:data:`CUDA_INSTALL`), a CUDA build without a visible GPU needs a driver or
    ``CUDA_VISIBLE_DEVICES``, ``cuda:N`` needs N GPUs, ``mps`` needs macOS on Apple silicon."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise OptionError("device", f"expected 'cpu', 'cuda', 'cuda:N' or 'mps', found {device!r}") from None
    if dev.type == "cuda":
        if torch.version.cuda is None:
            raise OptionError(
                "device",
                f"expected a device this torch has, found {device!r} but torch "
                f"{torch.__version__} is a CPU-only build; install a CUDA build of torch: "
                f"{CUDA_INSTALL}",
            )
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n == 0:
            raise OptionError(
                "device",
                f"expected a visible GPU, found {device!r} but torch {torch.__version__} "
                "(a CUDA build) sees none: check the NVIDIA driver (nvidia-smi) and "
                "CUDA_VISIBLE_DEVICES",
            )
        if dev.index is not None and dev.index >= n:
            raise OptionError("device", f"expected cuda:0 to cuda:{n - 1} ({n} visible GPUs), found {device!r}")
    elif dev.type == "mps":
        if not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
            raise OptionError(
                "device",
                f"expected a device this torch has, found {device!r} but the MPS backend is "
                "not available (it needs macOS on Apple silicon); use 'cpu', or 'cuda' with "
                f"a CUDA build of torch: {CUDA_INSTALL}",
            )
    elif dev.type != "cpu":
        raise OptionError("device", f"expected 'cpu', 'cuda', 'cuda:N' or 'mps', found {device!r}")
    return dev


def resolve_dtype(dtype, device: torch.device) -> torch.dtype:
    """``None`` -> float32; strings like ``"bfloat16"``; half precision is refused on CPU."""
    if dtype is None:
        return torch.float32
    if isinstance(dtype, str):
        if dtype not in _DTYPES:
            raise OptionError("dtype", f"expected one of {sorted(_DTYPES)}, found {dtype!r}")
        dtype = _DTYPES[dtype]
    if dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise OptionError("dtype", f"expected float32, bfloat16 or float16, found {dtype}")
    if device.type == "cpu" and dtype != torch.float32:
        raise OptionError("dtype", f"expected float32 on CPU (half precision is slow and inexact there), found {dtype}")
    return dtype


def _check_folder(path: Path, what: str) -> None:
    if not path.exists():
        raise FileNotFoundError(f"{path}: expected a {what} folder, found no such file or folder")
    if not path.is_dir():
        raise ValueError(f"{path}: expected a {what} folder, found a file")
    if not (path / "config.json").is_file():
        raise ValueError(
            f"{path}: expected a {what} folder with config.json, found none "
            f"(contents: {sorted(p.name for p in path.iterdir())[:8]})"
        )


def embedding_rows(model) -> int:
    """The rows of a model's input embedding (the token ids it can read)."""
    return int(model.get_input_embeddings().num_embeddings)


def load_policy(path, *, device="cpu", dtype=None, trust_remote_code: bool = False) -> Policy:
    """Load a policy from a local Hugging Face causal-LM folder (``config.json``, weights, tokenizer),
    offline. ``device``: ``"cpu"`` (default) or an accelerator; ``dtype``: float32 by default,
    ``"bfloat16"``/``"float16"`` allowed off CPU. When the tokenizer has a chat template,
    conversations are rendered with it (:class:`~mpo_viz.models.layout.TemplateLayout`)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    path = Path(path)
    _check_folder(path, "Hugging Face causal-LM")
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    try:
        raw = json.loads((path / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(
            f"{path / 'config.json'}: expected a JSON model config, found unreadable text ({exc})"
        ) from None
    mtype = raw.get("model_type")
    archs = raw.get("architectures") or []
    # the saved architectures say what the weights are (a BertModel folder has no LM head even though
    # BERT has a causal-LM class); without them, the model type must have a causal-LM class
    causal = (
        any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in archs)
        if archs
        else mtype in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    )
    if not causal and not (trust_remote_code and raw.get("auto_map", {}).get("AutoModelForCausalLM")):
        raise ValueError(
            f"{path}: expected a causal language model (a *ForCausalLM architecture), found "
            f"model_type {mtype!r} with architectures {archs}"
        )
    kw = {"local_files_only": True, "trust_remote_code": trust_remote_code}
    try:
        config = AutoConfig.from_pretrained(str(path), **kw)
        model = AutoModelForCausalLM.from_pretrained(str(path), config=config, dtype=dt, **kw)
    except (OSError, ValueError, KeyError) as exc:
        raise ValueError(f"{path}: could not load the causal LM ({type(exc).__name__}: {exc})") from None
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path), **kw)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(
            f"{path}: expected a tokenizer beside the model (tokenizer.json or tokenizer_config.json), "
            f"found none loadable ({type(exc).__name__}: {exc})"
        ) from None
    rows = embedding_rows(model)
    if len(tokenizer) > rows:
        raise ValueError(f"{path}: the tokenizer has {len(tokenizer)} tokens but the model embeds only {rows}")
    model.to(dev).eval()  # type: ignore[arg-type]  # transformers types .to as taking the model
    return Policy(model, tokenizer, path=str(path))


def save_policy(policy: Policy, path) -> Path:
    """Write ``policy`` as a standard Hugging Face folder (safetensors weights, config, generation
    config, tokenizer): ``AutoModelForCausalLM/AutoTokenizer.from_pretrained(path)`` load it."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    policy.model.save_pretrained(str(path))
    policy.tokenizer.save_pretrained(str(path))
    return path


def check_vocabulary(tokenizer, words, *, where: str = "tokenizer", max_examples: int = 5) -> None:
    """Raise when ``tokenizer`` maps any of ``words`` (e.g. an environment's ``vocabulary()``) to its
    unknown token: a policy could then neither read nor write those words. The message names
    ``where``, the count and examples. Tokenizers without an unknown token (byte-level) pass."""
    unk = tokenizer.unk_token_id
    if unk is None:
        return
    words = list(words)
    bad = [w for w in words if unk in tokenizer.encode(w, add_special_tokens=False)]
    if bad:
        ex = ", ".join(repr(w) for w in bad[:max_examples])
        raise ValueError(
            f"{where}: expected a tokenizer that covers the environment's words, found {len(bad)} of "
            f"{len(words)} mapped to the unknown token {tokenizer.unk_token!r} (e.g. {ex})"
        )
