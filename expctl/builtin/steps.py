"""Batch steps: what one batch does. Built-ins ``supervised``, ``gan`` (seed 000's DCGAN) and
``lm`` (next-token prediction).

A batch step is a class registered under ``steps`` (picked with ``train.step``) with
``train_step(ctx, batch)`` returning a dict of detached scalar tensors (averaged over ranks at log
time), and optionally ``val_step(ctx, batch)`` returning ``{name: (sum, count)}`` tensors (summed
over ranks, then divided), and ``derived(row)`` returning metrics computed from a row's reduced
ones (the ``lm`` step's ``val/ppl`` from ``val/loss``), added to each train, validation and test
row:

    @register("steps", "my_step")
    class MyStep:
        def train_step(self, ctx: StepContext, batch):
            x, y = batch
            with ctx.autocast():
                loss = ctx.loss_fn(ctx.model(x), y)
            ctx.backward(loss)
            ctx.optimizer_step()
            return {"loss": loss.detach()}

`ctx` hides precision, gradient accumulation, clipping and the GradScaler.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from torch import nn

from expctl.registry import register


@dataclass
class StepContext:
    """What a batch step sees: models, optimizers, the loss, and helpers that apply the train config."""

    models: dict[str, nn.Module]
    optimizers: dict[str, torch.optim.Optimizer]
    loss_fn: nn.Module
    device: torch.device
    amp_dtype: torch.dtype | None = None
    scaler: Any = None  # torch.amp.GradScaler for fp16
    grad_accum: int = 1
    grad_clip: float | None = None
    channels_last: bool = False
    boundary: bool = True  # the last micro-batch before an optimizer step
    skip_nonfinite: bool = False  # train.on_nan=skip: drop updates whose gradients are not finite
    skipped: int = 0  # updates dropped so far
    _warned_step: ClassVar[bool] = False  # `step()` has warned in this process

    @property
    def model(self) -> nn.Module:
        """The model, when there is only one."""
        return next(iter(self.models.values()))

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """Autocast to the configured precision (a no-op in fp32)."""
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.amp_dtype)

    def backward(self, loss: torch.Tensor) -> None:
        """Backward of `loss`, scaled for accumulation and fp16."""
        if self.grad_accum > 1:
            loss = loss / self.grad_accum
        if self.scaler is not None:
            loss = self.scaler.scale(loss)
        loss.backward()

    def optimizer_step(self, name: str | None = None) -> None:
        """At an accumulation boundary: unscale, clip, step and zero the grads of one optimizer
        (`name`; default: the first)."""
        if not self.boundary:
            return
        key = name or next(iter(self.optimizers))
        opt = self.optimizers[key]
        if self.skip_nonfinite and self.scaler is None and not self._finite(opt):
            self.skipped += 1  # gradients are all-reduced: every rank decides alike
            opt.zero_grad(set_to_none=True)
            return
        if self.grad_clip is not None:
            if self.scaler is not None:
                self.scaler.unscale_(opt)
            params = [p for g in opt.param_groups for p in g["params"]]
            torch.nn.utils.clip_grad_norm_(params, self.grad_clip, foreach=True)
        if self.scaler is not None:
            self.scaler.step(opt)
        else:
            opt.step()
        opt.zero_grad(set_to_none=True)

    def step(self, name: str | None = None) -> None:
        """Deprecated name of `optimizer_step` (goes in a later release)."""
        if not StepContext._warned_step:  # once: a warning per batch would cost the hot loop
            StepContext._warned_step = True
            warnings.warn(
                "StepContext.step() is StepContext.optimizer_step() now; call ctx.optimizer_step()"
                " (ctx.step() goes in a later release)",
                DeprecationWarning,
                stacklevel=2,
            )
        self.optimizer_step(name)

    @staticmethod
    def _finite(opt: torch.optim.Optimizer) -> bool:
        """Whether every gradient is finite (one host sync: only with train.on_nan=skip)."""
        grads = [p.grad for g in opt.param_groups for p in g["params"] if p.grad is not None]
        if not grads:
            return True
        largest = torch.nn.utils.get_total_norm(grads, norm_type=float("inf"), foreach=True)
        return bool(torch.isfinite(largest))  # the largest |gradient|: NaN and inf propagate

    def zero_grad(self, name: str) -> None:
        """Drop gradients that another model's backward left on `name`'s parameters."""
        self.optimizers[name].zero_grad(set_to_none=True)

    def inputs(self, x: torch.Tensor) -> torch.Tensor:
        """Move an image batch to the memory format the model uses."""
        if self.channels_last and x.dim() == 4:
            return x.contiguous(memory_format=torch.channels_last)
        return x


@register("steps", "supervised")
class Supervised:
    """Forward, loss, backward, step; validation reports loss and, for class targets, accuracy."""

    def train_step(
        self, ctx: StepContext, batch: tuple[torch.Tensor, ...]
    ) -> dict[str, torch.Tensor]:
        x, y = batch[0], batch[1]
        with ctx.autocast():
            loss = ctx.loss_fn(ctx.model(ctx.inputs(x)), y)
        ctx.backward(loss)
        ctx.optimizer_step()
        return {"loss": loss.detach()}

    def val_step(
        self, ctx: StepContext, batch: tuple[torch.Tensor, ...]
    ) -> dict[str, tuple[torch.Tensor, Any]]:
        x, y = batch[0], batch[1]
        with ctx.autocast():
            out = ctx.model(ctx.inputs(x))
            loss = ctx.loss_fn(out, y)
        n = y.shape[0]
        metrics: dict[str, tuple[torch.Tensor, Any]] = {"loss": (loss.float() * n, n)}
        if y.dtype == torch.long and out.dim() == 2:
            metrics["acc"] = ((out.argmax(1) == y).sum(), n)
        return metrics


@register("steps", "gan")
class GAN:
    """DCGAN as PyTorch's example: a discriminator step on a real batch and a generated batch
    (separate forwards, so BatchNorm never mixes their statistics), then a generator step."""

    requires = ("generator", "discriminator")  # the models it trains (model=dcgan gives them)

    def _noise(self, ctx: StepContext, n: int) -> torch.Tensor:
        gen = ctx.models["generator"]
        latent: int = getattr(gen, "module", gen).latent_dim  # type: ignore[assignment]
        return torch.randn(n, latent, device=ctx.device)

    def train_step(
        self, ctx: StepContext, batch: tuple[torch.Tensor, ...]
    ) -> dict[str, torch.Tensor]:
        real = ctx.inputs(batch[0])
        n = real.shape[0]
        gen, disc = ctx.models["generator"], ctx.models["discriminator"]
        ones = torch.ones(n, 1, device=ctx.device)
        zeros = torch.zeros(n, 1, device=ctx.device)
        # one forward per backward keeps DDP's reducer in step; the two backwards add up
        with ctx.autocast():
            out_real = disc(real).float()
            err_real = ctx.loss_fn(out_real, ones)
        ctx.backward(err_real)
        with ctx.autocast():
            fake = gen(self._noise(ctx, n))
            out_fake = disc(ctx.inputs(fake.detach())).float()
            err_fake = ctx.loss_fn(out_fake, zeros)
        ctx.backward(err_fake)
        ctx.optimizer_step("discriminator")
        with _grads_set_aside(disc):
            with ctx.autocast():
                loss_g = ctx.loss_fn(disc(ctx.inputs(fake)).float(), ones)
            ctx.backward(loss_g)
        ctx.optimizer_step("generator")
        return {
            "loss_d": (err_real + err_fake).detach(),
            "loss_g": loss_g.detach(),
            "d_real": torch.sigmoid(out_real.detach()).mean(),
            "d_fake": torch.sigmoid(out_fake.detach()).mean(),  # before the discriminator step
        }

    def val_step(
        self, ctx: StepContext, batch: tuple[torch.Tensor, ...]
    ) -> dict[str, tuple[torch.Tensor, Any]]:
        real = ctx.inputs(batch[0])
        n = real.shape[0]
        disc = ctx.models["discriminator"]
        with ctx.autocast():
            fake = ctx.models["generator"](self._noise(ctx, n))
            out_real = disc(real).float()
            out_fake = disc(ctx.inputs(fake)).float()
        d_acc = ((out_real > 0).sum() + (out_fake < 0).sum()).float()
        return {
            "d_acc": (d_acc, 2 * n),
            "d_real": (torch.sigmoid(out_real).sum(), n),
            "d_fake": (torch.sigmoid(out_fake).sum(), n),
        }


# dense bf16 peak FLOP/s of one GPU by a part of its name (the first that matches), from NVIDIA's
# datasheets: what perf/mfu divides by; a device not named here gets no MFU
BF16_PEAK = (
    ("H100 NVL", 835e12),
    ("H100 PCIe", 756e12),
    ("H100", 989e12),  # SXM ("NVIDIA H100 80GB HBM3")
    ("H200", 989e12),
)


def bf16_peak(device_name: str) -> float | None:
    """The bf16 peak FLOP/s of a GPU by its name (BF16_PEAK), None when unknown."""
    return next((peak for part, peak in BF16_PEAK if part in device_name), None)


@register("steps", "lm")
class LanguageModel:
    """Next-token prediction: the loss (cross-entropy) over every position of (input, target)
    token windows; rows add val/ppl, perf/tokens_per_s and, on GPUs of known peak, perf/mfu.

    MFU = tokens/s x the model's `flops_per_token()` (6 N + 12 n_layer d_model block_size for
    model=gpt) / (ranks x BF16_PEAK), whatever train.precision is."""

    def __init__(self) -> None:
        self.tokens = 0  # per sample: the windows' length, from the first batch
        self.flops = 0  # training FLOPs per token (0: the model does not say)
        self.peak: float | None = None  # every rank's GPU together

    def train_step(
        self, ctx: StepContext, batch: tuple[torch.Tensor, ...]
    ) -> dict[str, torch.Tensor]:
        x, y = batch[0], batch[1]
        if not self.tokens:
            self._measure(ctx, x)
        with ctx.autocast():
            loss = ctx.loss_fn(ctx.model(x).flatten(0, 1), y.flatten())
        ctx.backward(loss)
        ctx.optimizer_step()
        return {"loss": loss.detach()}

    def val_step(
        self, ctx: StepContext, batch: tuple[torch.Tensor, ...]
    ) -> dict[str, tuple[torch.Tensor, Any]]:
        x, y = batch[0], batch[1]
        with ctx.autocast():
            loss = ctx.loss_fn(ctx.model(x).flatten(0, 1), y.flatten())
        n = y.numel()  # tokens: the mean over the split is over its tokens
        return {"loss": (loss.float() * n, n)}

    def derived(self, row: dict[str, float]) -> dict[str, float]:
        """Perplexity of the validation and test rows; throughput of the train rows."""
        out = {}
        for split in ("val", "test"):
            if f"{split}/loss" in row:
                try:
                    out[f"{split}/ppl"] = math.exp(row[f"{split}/loss"])
                except OverflowError:
                    out[f"{split}/ppl"] = math.inf
        rate = row.get("perf/samples_per_s")
        if rate is not None and self.tokens:
            out["perf/tokens_per_s"] = round(rate * self.tokens, 1)
            if self.flops and self.peak:
                out["perf/mfu"] = round(rate * self.tokens * self.flops / self.peak, 4)
        return out

    def _measure(self, ctx: StepContext, x: torch.Tensor) -> None:
        model = ctx.model
        for wrapper in ("_orig_mod", "module"):  # torch.compile's, then DDP's
            model = getattr(model, wrapper, model)
        flops = getattr(model, "flops_per_token", None)
        self.tokens, self.flops = int(x.shape[1]), int(flops()) if callable(flops) else 0
        cuda = ctx.device.type == "cuda"
        peak = bf16_peak(torch.cuda.get_device_name(ctx.device)) if cuda else None
        ranks = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        self.peak = peak * ranks if peak else None


@contextlib.contextmanager
def _grads_set_aside(model: nn.Module) -> Iterator[None]:
    """Keep the gradients a backward leaves on `model` out of its own: the generator's loss runs
    through the discriminator, whose gradients may hold earlier micro-batches (accumulation)."""
    params = [p for p in model.parameters() if p.requires_grad]
    kept = [p.grad for p in params]
    for p in params:
        p.grad = None
    try:
        yield
    finally:
        for p, g in zip(params, kept, strict=True):
            p.grad = g


def derived(step: Any, row: dict[str, float]) -> dict[str, float]:
    """`row` with the metrics the step's optional `derived` computes from it."""
    compute = getattr(step, "derived", None)
    return {**row, **compute(row)} if compute is not None else row


@contextlib.contextmanager
def no_sync(models: dict[str, nn.Module], skip: bool) -> Iterator[None]:
    """Skip DDP's gradient all-reduce for every model while `skip` (non-boundary micro-batches)."""
    with contextlib.ExitStack() as stack:
        if skip:
            for m in models.values():
                sync_off = getattr(m, "no_sync", None)
                if sync_off is not None:
                    stack.enter_context(sync_off())
        yield
