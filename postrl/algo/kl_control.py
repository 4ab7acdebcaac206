"""KL coefficient controllers: fixed, or adaptive toward a target KL (Ziegler et al., 2019).

    ctl = AdaptiveKL(init_coef=0.01, target=0.05, horizon=100)
    coef = ctl.update(observed_kl, n_steps=1)

The adaptive rule multiplies the coefficient by 1 + clip(kl / target - 1, -0.2, 0.2) * n / horizon:
a KL above target raises the penalty, below target lowers it; the clip keeps one noisy
estimate from moving it far.
"""

from __future__ import annotations

import math


class FixedKL:
    def __init__(self, init_coef: float):
        self.coef = init_coef

    def update(self, observed_kl: float, n_steps: int = 1) -> float:
        return self.coef

    def state_dict(self) -> dict:
        return {"coef": self.coef}

    def load_state_dict(self, state: dict) -> None:
        self.coef = state["coef"]


class AdaptiveKL(FixedKL):
    def __init__(self, init_coef: float, target: float, horizon: int):
        super().__init__(init_coef)
        self.target, self.horizon = target, horizon

    def update(self, observed_kl: float, n_steps: int = 1) -> float:
        if math.isfinite(observed_kl):
            error = max(-0.2, min(0.2, observed_kl / self.target - 1))
            self.coef *= 1 + error * n_steps / self.horizon
        return self.coef


def make_kl_controller(init_coef: float, target: float, horizon: int) -> FixedKL:
    return AdaptiveKL(init_coef, target, horizon) if target > 0 else FixedKL(init_coef)
