"""LoRA adapters (through peft), the adapter-free reference policy, and saving.

    model = apply_lora(model, cfg.model.lora)   # unchanged when lora.r == 0
    ref = make_reference(model)                 # the base model: same weights, adapters off
    save_policy(model, tok, run_dir / "final")  # a full HF model dir (+ adapter/ with LoRA)

Only the adapter matrices train; the base weights are frozen. The reference policy of the KL
term is the *initial* policy, and with LoRA that is exactly the base model with the adapters
switched off (peft initialises B = 0, so the adapted model starts equal to the base). The
reference therefore costs no memory at all: it is the policy's own weights, run under
`disable_adapter()`.

The model becomes a `peft.PeftModel`. Llama-family models keep the fused fast path: `FastLM`
reads each adapted projection's base weight and its adapters' factors (the low-rank term beside
the weight under autograd, folded into it for sampling and no-grad passes), and the reference
runs the same path with the adapters left out. A LoRA layer it does not cover (DoRA, a LoRA bias,
dropout while training) sends the model through the Hugging Face forward, adapters included.
tests/test_real_model.py checks that sampled and recomputed log-probs both see the adapters.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch

from postrl.config.schema import LoraConfig
from postrl.model.fastlm import FastLM
from postrl.model.logprobs import hf_decoder_and_head


def apply_lora(model, cfg: LoraConfig):
    """`model` with LoRA adapters on `cfg.target_modules` (only they train); unchanged if r == 0."""
    if cfg.r <= 0:
        return model
    try:
        from peft import LoraConfig as PeftLoraConfig
        from peft import get_peft_model
    except ImportError:
        from postrl.errors import UserError

        raise UserError("model.lora.r > 0 needs the peft package: run `make setup` (or `pip install peft`)") from None
    peft_cfg = PeftLoraConfig(
        r=cfg.r, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout, target_modules=list(cfg.target_modules),
        bias="none", task_type="CAUSAL_LM",
    )
    return get_peft_model(model, peft_cfg)  # freezes every base parameter


def is_lora(model) -> bool:
    return hasattr(model, "disable_adapter") and hasattr(model, "peft_config")


class AdapterFreeReference:
    """Callable like a causal LM; runs the policy's own weights with its adapters disabled.

    Deliberately exposes no `config`: a fast path that reads the model's weights directly must be
    told to leave the adapters out, which `fast_lm` does; without one, log-prob code uses the
    plain model call under `disable_adapter()`."""

    def __init__(self, model):
        self._model = model

    def fast_lm(self):
        """`FastLM` over the base weights alone (adapters off), or None where it does not cover the model."""
        return FastLM.wrap(self._model, adapters=False)

    @torch.no_grad()
    def __call__(self, **inputs):
        with self._model.disable_adapter():
            return self._model(**inputs)

    def decoder_and_head(self):
        """(decoder run with the adapters off, head) for the chunked log-probs; None if the
        architecture has no such split. LoRA on the head itself is off too: the base head runs."""
        split = hf_decoder_and_head(self._model)
        if split is None:
            return None
        decoder, head = split

        @torch.no_grad()
        def run_decoder(**inputs):
            with self._model.disable_adapter():
                return decoder(**inputs)

        @torch.no_grad()
        def run_head(hidden):
            with self._model.disable_adapter():
                return head(hidden)

        run_head.weight = getattr(head, "weight", None)  # its vocabulary size, for the chunking
        return run_decoder, run_head

    def eval(self):
        return self


def make_reference(model):
    """The frozen initial policy: the base with adapters off (LoRA), else a frozen deep copy."""
    if is_lora(model):
        return AdapterFreeReference(model)
    ref = copy.deepcopy(model).eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref


def merged_copy(model):
    """A plain HF model with the adapters folded into the weights (W + B A * alpha / r).

    Merges a deep copy: merging in place and unmerging afterwards would leave rounding error in
    the base weights, so a run that saves checkpoints would drift from one that does not."""
    return copy.deepcopy(model).merge_and_unload()


@torch.no_grad()
def merged_weights(model) -> list[tuple[str, torch.Tensor]]:
    """The policy's weights as (name, tensor) under the base model's own parameter names, adapters
    folded in (W + B A * alpha / r) out of place: what an inference engine that knows only the base
    architecture loads (`rollout.backend: vllm`). Without LoRA, the model's state dict as it is."""
    if not is_lora(model):
        return list(model.state_dict().items())
    from peft.tuners.lora import LoraLayer

    deltas = {f"{name}.base_layer.weight": sum(m.get_delta_weight(a) for a in m.active_adapters)
              for name, m in model.named_modules() if isinstance(m, LoraLayer) and m.active_adapters}
    out = []
    for name, t in model.state_dict().items():
        if ".lora_" in name:
            continue
        merged = (t + deltas[name]).to(t.dtype) if name in deltas else t
        out.append((name.removeprefix("base_model.model.").replace(".base_layer.", "."), merged))
    return out


def merge_and_save(model, tok, out_dir: str | Path) -> Path:
    """Write a full Hugging Face model directory (adapters merged) plus `adapter/` (peft format).

    `AutoModelForCausalLM.from_pretrained(out_dir)` loads the trained policy without peft;
    `PeftModel.from_pretrained(base, out_dir / "adapter")` restores the adapters alone."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out / "adapter")
    merged = merged_copy(model)
    merged.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def save_policy(model, tok, out_dir: str | Path) -> Path:
    """A full HF model directory for any policy; with LoRA, adapters merged and also kept."""
    if is_lora(model):
        return merge_and_save(model, tok, out_dir)
    out = Path(out_dir)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def load_policy_weights(model, path: str | Path) -> None:
    """Restore a policy saved by `save_policy` into `model` (a resumed run): the adapter weights
    for a LoRA policy (the base is unchanged by training), else the full state dict."""
    path = Path(path)
    if is_lora(model):
        from peft.utils import set_peft_model_state_dict
        from safetensors.torch import load_file

        result = set_peft_model_state_dict(model, load_file(path / "adapter" / "adapter_model.safetensors"))
        if result.unexpected_keys:
            raise ValueError(f"adapter in {path} does not fit this model: {result.unexpected_keys[:3]}")
        return
    from transformers import AutoModelForCausalLM

    saved = AutoModelForCausalLM.from_pretrained(path, dtype=next(model.parameters()).dtype)
    model.load_state_dict(saved.state_dict())
