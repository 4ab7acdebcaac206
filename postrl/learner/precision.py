"""Low-precision training with float32 master weights: `model.dtype: bfloat16`.

    opt = make_optimizer(params, lr=1e-4, weight_decay=0.0)  # AdamW; MasterAdamW if any param is not fp32
    sched = warmup_schedule(opt, steps=10)                    # the learning rate's linear warm-up

Why: bfloat16 keeps 8 bits of mantissa, so a weight w moves only when an update exceeds about
|w| / 256. AdamW's steps are about `lr` per weight (1e-5 .. 1e-3 in RL fine-tuning), smaller than
that for most weights: stepping bf16 weights directly rounds most updates away, and the moments
lose their small values too. So the model computes in bf16 (forward, backward, gradients, their
accumulation over micro-batches), while the optimiser keeps a float32 master copy of every
trainable weight and float32 moments, steps the master copy, and writes it back to the bf16
weights rounded to nearest. Memory: 4 bytes of master plus 8 of moments per trainable weight
(with LoRA only the adapters), against 2 + 4 for bf16 AdamW.

This is what `torch.autocast(bfloat16)` over a float32 model gives (bf16 matmuls, float32 weights
stepped), without autocast's costs: a float32 model under autocast casts every weight to bf16 in
every forward and again for the backward, keeps float32 gradients (4 bytes each), and its sampler,
sharing the model, would decode in float32. Here the weights live in bf16, so sampling, the
reference pass and the update all read 2 bytes a weight, and only the optimiser holds float32.
So there is no autocast option: `model.dtype: bfloat16` is it (`postrl.model.logprobs` computes
the head's log-softmax in float32 either way).

A checkpoint carries the master weights inside the optimiser's state (`master_weights`, in
`Learner.state_dict()["optimizer"]`), so a resumed run continues from the float32 values, not from
the rounded bf16 ones.
"""

from __future__ import annotations

import torch


def make_optimizer(params, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    """AdamW over `params`; with float32 master weights when any of them is not float32."""
    params = list(params)
    if all(p.dtype == torch.float32 for p in params):
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    return MasterAdamW(params, lr=lr, weight_decay=weight_decay)


def warmup_schedule(opt: torch.optim.Optimizer, steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """`opt`'s learning rate rising linearly over its first `steps` optimiser steps (`train.warmup_steps`;
    0: full from the first), then constant."""
    warmup = max(1, steps)
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup))


class MasterAdamW(torch.optim.AdamW):
    """AdamW on float32 master copies of (bf16 or fp16) model parameters.

    Its param_groups hold the masters, so learning-rate schedules, `state_dict` and the rollback's
    learning-rate change (`Learner.scale_lr`) work as for plain AdamW. `step()` reads the model parameters' gradients,
    steps the masters and copies them back; `zero_grad()` clears the model's gradients too."""

    def __init__(self, params, **adamw):
        self.model_params = list(params)
        masters = [p.detach().float().clone() for p in self.model_params]
        super().__init__(masters, **adamw)

    def _masters(self) -> list[torch.Tensor]:
        return [p for group in self.param_groups for p in group["params"]]

    @torch.no_grad()
    def step(self, closure=None):
        for p, m in zip(self.model_params, self._masters()):
            m.grad = None if p.grad is None else p.grad.float()
        loss = super().step(closure)
        for p, m in zip(self.model_params, self._masters()):
            p.copy_(m)  # rounded to nearest into the model's dtype
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none)
        for p in self.model_params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    def state_dict(self):
        state = super().state_dict()
        state["master_weights"] = [m.detach().clone() for m in self._masters()]
        return state

    def load_state_dict(self, state_dict) -> None:
        state = dict(state_dict)
        masters = state.pop("master_weights", None)
        super().load_state_dict(state)
        if masters is None:  # an optimiser state saved without masters: start them from the model
            masters = [p.detach() for p in self.model_params]
        with torch.no_grad():
            for p, m, saved in zip(self.model_params, self._masters(), masters):
                m.copy_(saved)
                p.copy_(m)
