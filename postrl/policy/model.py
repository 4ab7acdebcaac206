"""Loading a policy: any Hugging Face causal-LM directory, or a built-in name.

    model, tok = load_model("tiny-arith")          # the demo model, pretrained on first use
    model, tok = load_model("tiny-multi")          # the multi-domain demo model (arith, code, sort)
    model, tok = load_model("runs/demo/final")     # any HF directory (config.json + weights)

A missing or corrupt model raises UserError with one line naming the path and what is wrong.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from postrl.errors import UserError

BUILTIN = {"tiny-arith", "tiny-multi"}  # keys of postrl.pretrain.BUILTIN_MODELS (imported lazily: torch-heavy)


def resolve_model_path(name: str, log=print) -> Path:
    if name in BUILTIN:
        from postrl.pretrain import ensure_tiny_model

        return ensure_tiny_model(log=log, name=name)
    path = Path(name)
    if not path.exists():
        raise UserError(f"model not found: {name} (not a directory and not one of {sorted(BUILTIN)})")
    if not (path / "config.json").is_file():
        raise UserError(f"model directory {name} has no config.json; is it a Hugging Face model directory?")
    return path


def load_model(name: str, dtype: str = "float32", log=print):
    """(model, tokenizer) in eval mode. The tokenizer pads on the left, for generation."""
    path = resolve_model_path(name, log=log)
    try:
        json.loads((path / "config.json").read_text())
        tok = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))
    except (OSError, ValueError, json.JSONDecodeError, RuntimeError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"cannot load model from {path}: {first}") from None
    tok.padding_side = "left"
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    model.eval()
    return model, tok
