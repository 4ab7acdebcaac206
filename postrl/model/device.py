"""Where the policy runs: `run.device` resolved to a torch device, and a model's own device.

    device = resolve_device("auto")   # cuda when torch sees one, else cpu; "cuda" without one is an error
    device = model_device(model)      # every tensor the policy code makes is created there

Nothing falls back to the CPU silently: asking for `cuda` on a machine where torch sees no CUDA
device is a `UserError`, and the policy code creates each tensor on its model's device, so a
tensor left on another device fails at the first operation that mixes them (tests/test_device.py
makes such a mistake fail on a CPU-only machine too).
"""

from __future__ import annotations

import torch

DEVICES = ("auto", "cpu", "cuda")


def resolve_device(name: str, setting: str = "run.device=") -> torch.device:
    """`run.device` -> a torch device: auto | cpu | cuda (or cuda:N). `setting` is how an error names
    where the value came from (`--device ` for a command-line flag)."""
    # imported here: the sampler imports this module, and `benchmarks/gpu_step.py` imports the
    # sampler on machines that get only torch, transformers and postrl's model, sampling and learner packages
    from postrl.errors import UserError

    kind = name.split(":", 1)[0]
    if kind not in DEVICES or (kind != "cuda" and ":" in name):
        raise UserError(f"{setting}{name!r}: expected one of {', '.join(DEVICES)} (or cuda:N)")
    if kind == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if kind == "cuda" and not torch.cuda.is_available():
        raise UserError(f"{setting}{name}: torch sees no CUDA device here (torch {torch.__version__}); "
                        f"use {setting}cpu or auto")
    return torch.device(name)


def model_device(model) -> torch.device:
    """The device of a model's parameters (a peft model's too)."""
    return next(model.parameters()).device
