"""KL-coefficient schedules (`algo/beta=...`): beta as a function of the optimizer step.

    constant  beta = value
    linear    from `start` to `end` over `steps` optimizer steps, then `end`
    relax     the sample-augmentation recipe's: `value` until the KL has stayed below `kl_below` for `patience`
              consecutive rollouts, or until step `after_step`; then value x factor for good
`observe(step, kl)` feeds the rank-averaged KL of each rollout; schedules with memory save it
through state_dict so a resumed run continues with the same beta.
"""

from __future__ import annotations

from grpo_aug.errors import UsageError


class ConstantBeta:
    def __init__(self, value: float = 0.04) -> None:
        if value < 0:
            raise UsageError(f"algo.beta.value must be >= 0, got {value}")
        self.value = float(value)

    def __call__(self, step: int) -> float:
        return self.value

    @property
    def always_zero(self) -> bool:
        """beta is 0 at every step: the run needs no reference model and no reference forward."""
        return self.value == 0

    def observe(self, step: int, kl: float) -> None:
        pass

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class LinearBeta(ConstantBeta):
    def __init__(self, start: float = 0.04, end: float = 0.0, steps: int = 1000) -> None:
        if start < 0 or end < 0:
            raise UsageError(f"algo.beta.start and algo.beta.end must be >= 0, got {start}, {end}")
        if steps < 1:
            raise UsageError(f"algo.beta.steps must be >= 1, got {steps}")
        super().__init__(start)
        self.start, self.end, self.steps = float(start), float(end), int(steps)

    def __call__(self, step: int) -> float:
        frac = min(max(step, 0) / self.steps, 1.0)
        return self.start + (self.end - self.start) * frac

    @property
    def always_zero(self) -> bool:
        return self.start == 0 and self.end == 0


class RelaxBeta(ConstantBeta):
    def __init__(self, value: float = 0.04, factor: float = 0.5, kl_below: float = 0.02, patience: int = 50,
                 after_step: int | None = None) -> None:
        super().__init__(value)
        if not 0 <= factor <= 1:
            raise UsageError(f"algo.beta.factor must be in [0, 1], got {factor}")
        if kl_below <= 0:
            raise UsageError(f"algo.beta.kl_below must be > 0, got {kl_below}")
        if patience < 1:
            raise UsageError(f"algo.beta.patience must be >= 1, got {patience}")
        self.factor, self.kl_below = float(factor), float(kl_below)
        self.patience, self.after_step = patience, after_step
        self.calm = 0  # consecutive rollouts with KL below kl_below
        self.relaxed = False

    def __call__(self, step: int) -> float:
        relaxed = self.relaxed or (self.after_step is not None and step >= self.after_step)
        return self.value * self.factor if relaxed else self.value

    def observe(self, step: int, kl: float) -> None:
        self.calm = self.calm + 1 if kl < self.kl_below else 0
        if self.calm >= self.patience:
            self.relaxed = True

    def state_dict(self) -> dict:
        return {"calm": self.calm, "relaxed": self.relaxed}

    def load_state_dict(self, state: dict) -> None:
        self.calm, self.relaxed = int(state["calm"]), bool(state["relaxed"])
