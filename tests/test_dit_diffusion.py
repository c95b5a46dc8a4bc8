"""The diffusion task: loss goes down, EMA, DDIM determinism, classifier-free guidance."""

from __future__ import annotations

import pytest
import torch

from normlab.models.dit import build_dit
from normlab.norms import norm_partial
from normlab.tasks.diffusion import DiffusionTask

LN = norm_partial("layernorm", eps=1e-5, elementwise_affine=True, bias=True, impl="fast")
OPTIM = {"optimizer": lambda params: torch.optim.AdamW(params, lr=1e-3)}


def tiny_task(**kw):
    torch.manual_seed(0)
    net = build_dit(LN, hidden_size=32, depth=2, num_heads=4, patch_size=4, class_dropout=0.0)
    return DiffusionTask(net, OPTIM, ema_decay=0.5, ema_warmup=False, **kw)


def fixed_batch(n=16):
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, 1, 28, 28, generator=g), torch.randint(0, 10, (n,), generator=g)


def fixed_loss(task, batch):
    """The loss at fixed t and eps (the same generator seed), with the online weights."""
    with torch.no_grad():
        return task.diffusion_loss(task.net, batch, torch.Generator().manual_seed(1)).item()


def test_three_training_steps_lower_the_loss_on_a_fixed_batch():
    task = tiny_task()
    batch = fixed_batch()
    opt = torch.optim.AdamW(task.net.parameters(), lr=1e-3)
    before = fixed_loss(task, batch)
    for _ in range(3):
        loss = task.diffusion_loss(task.net, batch, torch.Generator().manual_seed(1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert fixed_loss(task, batch) < before


def test_ema_moves_toward_the_weights_and_is_checkpointed():
    task = tiny_task()
    with torch.no_grad():
        for p in task.net.parameters():
            p.add_(1.0)
    ema_before = [p.clone() for p in task.ema.parameters()]
    task.update_ema()  # decay 0.5: halfway
    for e0, e1, p in zip(ema_before, task.ema.parameters(), task.net.parameters(), strict=True):
        torch.testing.assert_close(e1, (e0 + p) / 2)
    assert any(k.startswith("ema.") for k in task.state_dict())
    assert not any(p.requires_grad for p in task.ema.parameters())


def test_ema_warmup_decay():
    task = DiffusionTask(tiny_task().net, OPTIM, ema_decay=0.999, ema_warmup=True)
    assert task.current_ema_decay() == pytest.approx(0.1)  # step 0: (1 + 0) / (10 + 0)


def test_ddim_is_deterministic_given_a_seed():
    task = tiny_task()
    batch = fixed_batch()
    opt = torch.optim.AdamW(task.net.parameters(), lr=1e-3)
    for _ in range(3):  # non-trivial weights (the output layer starts at zero)
        loss = task.diffusion_loss(task.net, batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
    task.update_ema()
    y = torch.arange(10)
    a = task.sample(y, steps=4, guidance_scale=2.0, seed=3)
    b = task.sample(y, steps=4, guidance_scale=2.0, seed=3)
    c = task.sample(y, steps=4, guidance_scale=2.0, seed=4)
    assert a.shape == (10, 1, 28, 28)
    assert torch.equal(a, b)
    assert not torch.allclose(a, c)
    pixels = task.sample_pixels(y, steps=4, seed=3)
    assert pixels.min() >= 0 and pixels.max() <= 1


def test_guidance_scale_one_is_the_conditional_prediction():
    task = tiny_task()
    opt = torch.optim.AdamW(task.net.parameters(), lr=1e-3)
    for _ in range(3):
        loss = task.diffusion_loss(task.net, fixed_batch())
        opt.zero_grad()
        loss.backward()
        opt.step()
    net = task.net.eval()
    x, y = fixed_batch(8)
    t = torch.full((8,), 500)
    with torch.no_grad():
        cond = net(x, t, y)
        uncond = net(x, t, torch.full_like(y, net.null_class))
        assert not torch.allclose(cond, uncond)
        torch.testing.assert_close(task.guided_eps(net, x, t, y, 1.0), cond)
        torch.testing.assert_close(task.guided_eps(net, x, t, y, 0.0), uncond)


def test_guidance_scale_one_runs_the_net_once_per_step():
    task = tiny_task()
    calls = []
    task.ema.register_forward_hook(lambda module, args, out: calls.append(args[0].shape[0]))
    task.sample(torch.arange(4), steps=3, guidance_scale=1.0, seed=0)
    assert calls == [4, 4, 4]  # conditional pass only
    calls.clear()
    task.sample(torch.arange(4), steps=3, guidance_scale=1.5, seed=0)
    assert calls == [8, 8, 8]  # conditional and null label in one batch


def test_ddim_timesteps_cover_the_schedule():
    ts = tiny_task().ddim_timesteps(50)
    assert ts[0] == 999 and ts[-1] == 0 and len(ts) == 50
    assert torch.all(ts[:-1] > ts[1:])


def test_rescale_maps_standardized_images_to_minus_one_one():
    task = tiny_task()
    task.data_mean.fill_(0.286)
    task.data_std.fill_(0.353)
    pixels = torch.tensor([0.0, 0.5, 1.0])
    standardized = (pixels - 0.286) / 0.353
    torch.testing.assert_close(task.to_model_space(standardized), torch.tensor([-1.0, 0.0, 1.0]))
    torch.testing.assert_close(task.to_pixels(torch.tensor([-1.0, 0.0, 1.0])), pixels)


def test_example_input_runs_forward():
    task = tiny_task()
    x, t, y = task.example_input(4)
    assert task(x, t, y).shape == x.shape and t.dtype == y.dtype == torch.long


class PointMassEps(torch.nn.Module):
    """The exact eps-predictor when every training image is the same image x*."""

    num_classes, in_channels, input_size, null_class = 10, 1, 28, 10

    def __init__(self, target, alphas_bar):
        super().__init__()
        self.target, self.alphas_bar = target, alphas_bar

    def forward(self, x, t, y):
        abar = self.alphas_bar[t].view(-1, 1, 1, 1)
        return (x - abar.sqrt() * self.target) / (1 - abar).sqrt()


def test_ddim_with_the_exact_eps_recovers_the_data():
    task = tiny_task()
    target = torch.rand(1, 1, 28, 28) * 2 - 1
    task.ema = PointMassEps(target, task.alphas_bar)
    out = task.sample(torch.arange(4), steps=5, guidance_scale=3.0, seed=0)
    torch.testing.assert_close(out, target.expand(4, -1, -1, -1), atol=1e-4, rtol=0)
