"""Built-in optimizers, LR schedulers and losses, registered by lowercase name.

Every ``torch.optim`` optimizer (``sgd``, ``adamw``, ...), every ``torch.optim.lr_scheduler``
scheduler (``multisteplr`` and, without the suffix, ``multistep``), ``reducelronplateau`` (on
``sched.monitor``), ``warmup_cosine`` / ``cosine``,
and every ``torch.nn`` loss in snake_case (``cross_entropy``, ``mse``, ``bce_with_logits``, ...).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

import torch
from torch import nn
from torch.optim import lr_scheduler

from expctl.builtin import checks
from expctl.errors import UserError
from expctl.registry import register


def _snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name).lower()


# optimizers the built-in steps cannot drive, and why (a clear error before anything runs)
_UNSUPPORTED = {
    "LBFGS": "needs a closure that re-evaluates the loss several times per step",
    "SparseAdam": "takes sparse gradients only (nn.Embedding(sparse=True))",
}


def _refuse(name: str, why: str) -> Callable[..., None]:
    def check(**_: object) -> None:
        raise UserError(
            f"optim={name.lower()}: torch.optim.{name} {why}, which the built-in steps do not do",
            "pick another optimizer, or drive it from your own registered step (train.step)",
        )

    return check


def _register_optimizers() -> None:
    for name in dir(torch.optim):
        cls = getattr(torch.optim, name)
        if (
            isinstance(cls, type)
            and issubclass(cls, torch.optim.Optimizer)
            and cls is not torch.optim.Optimizer
        ):
            why = _UNSUPPORTED.get(name)
            register(
                "optimizers",
                name.lower(),
                runtime=("params",),
                check=_refuse(name, why) if why else checks.optimizer,
                description=f"torch.optim.{name}",
            )(cls)


def _register_schedulers() -> None:
    skip = {
        "LRScheduler",
        "_LRScheduler",
        "ReduceLROnPlateau",
        "SequentialLR",
        "ChainedScheduler",
        "LambdaLR",
        "MultiplicativeLR",
    }
    # the length of the run, filled in (in the unit of sched.interval) when the config leaves it
    inferred = {"OneCycleLR": ("total_steps",), "CosineAnnealingLR": ("T_max",)}
    per_step = {"OneCycleLR", "CyclicLR"}  # made to be stepped every optimizer step
    for name in dir(lr_scheduler):
        cls = getattr(lr_scheduler, name)
        if isinstance(cls, type) and issubclass(cls, lr_scheduler.LRScheduler) and name not in skip:
            for alias in {name.lower(), name.lower().removesuffix("lr")}:
                register(
                    "schedulers",
                    alias,
                    runtime=("optimizer",),
                    inferred=inferred.get(name, ()),
                    settings={"interval": "step"} if name in per_step else None,
                    description=f"torch.optim.lr_scheduler.{name}",
                )(cls)


@register(
    "schedulers",
    runtime=("optimizer",),
    inferred=("total_steps",),
    settings={"interval": "step"},
)
def warmup_cosine(
    optimizer: torch.optim.Optimizer,
    total_steps: int = 1,
    warmup_steps: int = 0,
    min_lr_ratio: float = 0.0,
) -> lr_scheduler.LRScheduler:
    """Linear warm-up for `warmup_steps`, then cosine decay to min_lr_ratio x lr at `total_steps`."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return lr_scheduler.LambdaLR(optimizer, factor)


@register(
    "schedulers",
    runtime=("optimizer",),
    inferred=("total_steps",),
    settings={"interval": "step"},
)
def cosine(
    optimizer: torch.optim.Optimizer, total_steps: int = 1, min_lr_ratio: float = 0.0
) -> lr_scheduler.LRScheduler:
    """Cosine decay over the whole run (warmup_cosine without warm-up)."""
    return warmup_cosine(optimizer, total_steps, 0, min_lr_ratio)


register(
    "schedulers",
    "reducelronplateau",
    runtime=("optimizer",),
    settings={"monitor": "val/loss"},
    description="torch.optim.lr_scheduler.ReduceLROnPlateau: steps after each validation, "
    "on sched.monitor",
)(lr_scheduler.ReduceLROnPlateau)


def _register_losses() -> None:
    for name in dir(nn):
        cls = getattr(nn, name)
        if (
            isinstance(cls, type)
            and issubclass(cls, nn.modules.loss._Loss)
            and name.endswith("Loss")
        ):
            register(
                "losses",
                _snake(name.removesuffix("Loss")),
                check=checks.loss,
                description=f"torch.nn.{name}",
            )(cls)


_register_optimizers()
_register_schedulers()
_register_losses()
