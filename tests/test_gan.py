"""The `gan` step against PyTorch's DCGAN example (pytorch/examples dcgan/main.py), in-process."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn

from expctl import registry
from expctl.builtin.steps import StepContext

LATENT, BATCH, STEPS = 16, 16, 4
ADAM = {"lr": 2e-4, "betas": (0.5, 0.999)}


def _pair() -> dict[str, nn.Module]:
    torch.manual_seed(0)
    models: dict[str, nn.Module] = registry.get("models", "dcgan").factory(
        input_shape=(1, 28, 28), latent_dim=LATENT, features=8
    )
    return models


def _batches() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.rand(BATCH, 1, 28, 28, generator=g) * 2 - 1 for _ in range(STEPS)]


def _ctx(models: dict[str, nn.Module], grad_accum: int = 1) -> StepContext:
    adam = registry.get("optimizers", "adam").factory
    return StepContext(
        models=models,
        optimizers={k: adam(m.parameters(), **ADAM) for k, m in models.items()},
        loss_fn=registry.get("losses", "bce_with_logits").factory(),
        device=torch.device("cpu"),
        grad_accum=grad_accum,
    )


def _reference_step(
    net_g: nn.Module,
    net_d: nn.Module,
    opt_g: torch.optim.Optimizer,
    opt_d: torch.optim.Optimizer,
    real: torch.Tensor,
) -> dict[str, torch.Tensor]:
    """One iteration of the example's loop (its Sigmoid + BCELoss as BCEWithLogits on logits)."""
    criterion = nn.BCEWithLogitsLoss()
    b_size = real.size(0)
    # (1) Update D network: maximize log(D(x)) + log(1 - D(G(z)))
    net_d.zero_grad()
    label = torch.full((b_size,), 1.0)
    output = net_d(real).view(-1)
    err_d_real = criterion(output, label)
    err_d_real.backward()
    d_x = torch.sigmoid(output).mean()
    noise = torch.randn(b_size, LATENT, 1, 1)
    fake = net_g(noise)
    label.fill_(0.0)
    output = net_d(fake.detach()).view(-1)
    err_d_fake = criterion(output, label)
    err_d_fake.backward()
    d_g_z1 = torch.sigmoid(output).mean()
    err_d = err_d_real + err_d_fake
    opt_d.step()
    # (2) Update G network: maximize log(D(G(z)))
    net_g.zero_grad()
    label.fill_(1.0)
    output = net_d(fake).view(-1)
    err_g = criterion(output, label)
    err_g.backward()
    opt_g.step()
    return {"loss_d": err_d, "loss_g": err_g, "d_real": d_x, "d_fake": d_g_z1}


def test_gan_step_matches_the_pytorch_dcgan_example() -> None:
    """Same weights, batches and noise: parameters, BatchNorm buffers and the reported losses
    agree with the example's loop after every step (a mixed real+fake batch does not)."""
    ours = _pair()
    ref = copy.deepcopy(ours)
    ctx = _ctx(ours)
    ref_opt = {k: torch.optim.Adam(m.parameters(), **ADAM) for k, m in ref.items()}
    step = registry.get("steps", "gan").factory()
    for i, real in enumerate(_batches()):
        torch.manual_seed(100 + i)  # the noise: one randn of the same shape in both
        got = step.train_step(ctx, (real, torch.zeros(BATCH, dtype=torch.long)))
        torch.manual_seed(100 + i)
        want = _reference_step(
            ref["generator"],
            ref["discriminator"],
            ref_opt["generator"],
            ref_opt["discriminator"],
            real,
        )
        for name in ("discriminator", "generator"):
            a, b = ours[name].state_dict(), ref[name].state_dict()
            for key in b:
                torch.testing.assert_close(
                    a[key], b[key], rtol=1e-6, atol=1e-7, msg=f"step {i}: {name}.{key}"
                )
        for k, v in want.items():
            torch.testing.assert_close(
                got[k], v.detach(), rtol=1e-6, atol=1e-7, msg=f"step {i}: {k}"
            )


def test_generator_backward_leaves_accumulated_discriminator_grads_alone() -> None:
    """Between optimizer steps (grad_accum=2) a micro-batch leaves exactly the discriminator
    loss's gradients on the discriminator (halved), not the generator loss's pass through it."""
    ours = _pair()
    ref = copy.deepcopy(ours)
    ctx = _ctx(ours, grad_accum=2)
    ctx.boundary = False
    real = _batches()[0]
    torch.manual_seed(7)
    registry.get("steps", "gan").factory().train_step(ctx, (real,))
    net_g, net_d = ref["generator"], ref["discriminator"]
    criterion = nn.BCEWithLogitsLoss()
    torch.manual_seed(7)
    (criterion(net_d(real).view(-1), torch.ones(BATCH)) / 2).backward()
    fake = net_g(torch.randn(BATCH, LATENT))
    (criterion(net_d(fake.detach()).view(-1), torch.zeros(BATCH)) / 2).backward()
    for p, q in zip(ours["discriminator"].parameters(), net_d.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-6, atol=1e-7)
    net_d.zero_grad()
    (criterion(net_d(fake).view(-1), torch.ones(BATCH)) / 2).backward()
    for p, q in zip(ours["generator"].parameters(), net_g.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-6, atol=1e-7)


def test_the_old_step_name_still_steps_the_optimizer_and_warns_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`ctx.step(name)` (before 0.2) does what `ctx.optimizer_step(name)` does, with one
    DeprecationWarning per process naming the new method."""
    monkeypatch.setattr(StepContext, "_warned_step", False)
    old, new = _pair(), _pair()
    old_ctx, new_ctx = _ctx(old), _ctx(new)
    real = _batches()[0]
    for ctx, models in ((old_ctx, old), (new_ctx, new)):
        ctx.backward(ctx.loss_fn(models["discriminator"](real), torch.ones(BATCH, 1)))
    with pytest.warns(DeprecationWarning, match=r"optimizer_step\(\)"):
        old_ctx.step("discriminator")
    new_ctx.optimizer_step("discriminator")
    for p, q in zip(
        old["discriminator"].parameters(), new["discriminator"].parameters(), strict=True
    ):
        torch.testing.assert_close(p, q, rtol=0, atol=0)
        assert p.grad is None  # zeroed, as optimizer_step leaves them
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        old_ctx.step("discriminator")  # warned already: silent
