"""Ghost BatchNorm (`ghost_batch`): equal to torch BatchNorm copies, one per slice of the batch.

fp32 tolerances: rtol 1e-5, atol 1e-5 (outputs and gradients are O(1)).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from normlab.norms import BatchNorm, NormConfigError, create_norm

TOL = {"rtol": 1e-5, "atol": 1e-5}
IMPLS = ["fast", "reference", "manual"]


def _torch_bn(shape: tuple[int, ...], **kwargs: object) -> nn.Module:
    """torch's BatchNorm1d or BatchNorm2d for inputs of `shape`."""
    return (nn.BatchNorm2d if len(shape) == 4 else nn.BatchNorm1d)(shape[1], **kwargs)


def _ghost(shape: tuple[int, ...], ghost_batch: int, **kwargs: object) -> BatchNorm:
    """A ghost BatchNorm for `shape` with random weight and bias."""
    norm = create_norm("batchnorm", shape[1], ghost_batch=ghost_batch, **kwargs)
    with torch.no_grad():
        norm.weight.normal_()
        norm.bias.normal_()
    return norm


def _copies(norm: BatchNorm, shape: tuple[int, ...], momentum: float | None) -> list[nn.Module]:
    """One torch BatchNorm per slice ("device"), each starting from `norm`'s state."""
    copies = [_torch_bn(shape, momentum=momentum) for _ in range(shape[0] // norm.ghost_batch)]
    for copy in copies:
        copy.load_state_dict(norm.state_dict())
    return copies


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("momentum", [0.1, None])
@pytest.mark.parametrize("ghost_batch", [4, 2])
@pytest.mark.parametrize("shape", [(16, 3), (12, 4, 5), (8, 3, 4, 4)])
def test_equals_torch_batchnorm_per_slice(shape, ghost_batch, momentum, impl):
    torch.manual_seed(0)
    ours = _ghost(shape, ghost_batch, momentum=momentum, impl=impl)
    copies = _copies(ours, shape, momentum)

    for step in range(3):  # training steps: outputs, gradients, running statistics
        x = (torch.randn(shape) * 2 + step).requires_grad_()
        x_ref = x.detach().clone().requires_grad_()
        y = ours(x)
        y_ref = torch.cat([bn(s) for bn, s in zip(copies, x_ref.split(ghost_batch), strict=True)])
        torch.testing.assert_close(y, y_ref, **TOL)
        g = torch.randn(shape)
        y.backward(g)
        y_ref.backward(g)
        torch.testing.assert_close(x.grad, x_ref.grad, **TOL)
        for name, p in ours.named_parameters():
            summed = sum(getattr(bn, name).grad for bn in copies)
            torch.testing.assert_close(p.grad, summed, **TOL, msg=name)
            p.grad = None
        for bn in copies:
            bn.zero_grad()

    averaged = _torch_bn(shape).eval()
    averaged.load_state_dict(copies[0].state_dict())
    for key in ("running_mean", "running_var"):
        mean_over_copies = torch.stack([getattr(bn, key) for bn in copies]).mean(0)
        torch.testing.assert_close(getattr(ours, key), mean_over_copies, **TOL, msg=key)
        getattr(averaged, key).copy_(mean_over_copies)
    assert int(ours.num_batches_tracked) == 3

    ours.eval()  # eval normalises with the running statistics, whatever the batch size
    x = torch.randn(3, *shape[1:])
    torch.testing.assert_close(ours(x), averaged(x), **TOL)


@pytest.mark.parametrize("impl", IMPLS)
def test_channels_last_slices_the_batch_dim(impl):
    torch.manual_seed(0)
    shape = (8, 5, 3)  # (B, T, D): D is the channel dim
    ours = _ghost((8, 3), 2, impl=impl, channel_dim=-1)
    copies = _copies(ours, (8, 3, 5), 0.1)
    x = torch.randn(shape)
    slices = zip(copies, x.split(2), strict=True)
    y_ref = torch.cat([bn(s.movedim(-1, 1)).movedim(1, -1) for bn, s in slices])
    torch.testing.assert_close(ours(x), y_ref, **TOL)
    mean_over_copies = torch.stack([bn.running_mean for bn in copies]).mean(0)
    torch.testing.assert_close(ours.running_mean, mean_over_copies, **TOL)


@pytest.mark.parametrize("track_running_stats", [True, False])
@pytest.mark.parametrize("impl", IMPLS)
def test_ghost_batch_of_the_whole_batch_is_plain_batchnorm(impl, track_running_stats):
    torch.manual_seed(0)
    shape = (8, 3, 4, 4)
    ghost = _ghost(shape, shape[0], impl=impl, track_running_stats=track_running_stats)
    plain = create_norm("batchnorm", 3, impl=impl, track_running_stats=track_running_stats)
    plain.load_state_dict(ghost.state_dict())
    x = (torch.randn(shape) * 2 + 1).requires_grad_()
    x_plain = x.detach().clone().requires_grad_()
    y, y_plain = ghost(x), plain(x_plain)
    assert torch.equal(y, y_plain)
    g = torch.randn(shape)
    y.backward(g)
    y_plain.backward(g)
    assert torch.equal(x.grad, x_plain.grad)
    for (key, value), plain_value in zip(
        ghost.state_dict().items(), plain.state_dict().values(), strict=True
    ):
        assert torch.equal(value, plain_value), key


def test_without_affine_equals_identity_affine():
    torch.manual_seed(0)
    x = torch.randn(8, 3, 5)
    plain = create_norm("batchnorm", 3, ghost_batch=2, affine=False)
    identity = create_norm("batchnorm", 3, ghost_batch=2)
    torch.testing.assert_close(plain(x), identity(x), **TOL)
    torch.testing.assert_close(plain.running_var, identity.running_var, **TOL)


def test_gradcheck_float64():
    torch.manual_seed(0)
    norm = _ghost((6, 2, 3), 2, track_running_stats=False).double()
    x = torch.randn(6, 2, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda x, w, b: torch.func.functional_call(norm, {"weight": w, "bias": b}, (x,)),
        (
            x,
            norm.weight.detach().clone().requires_grad_(),
            norm.bias.detach().clone().requires_grad_(),
        ),
    )


@pytest.mark.parametrize("impl", IMPLS)
def test_batch_not_a_multiple_of_ghost_batch(impl):
    norm = create_norm("batchnorm", 3, ghost_batch=4, impl=impl)
    with pytest.raises(NormConfigError, match=r"ghost_batch=4.*\(6, 3, 2\)"):
        norm(torch.randn(6, 3, 2))
    norm.eval()  # eval with running statistics: any batch size
    assert norm(torch.randn(6, 3, 2)).shape == (6, 3, 2)


@pytest.mark.parametrize("impl", IMPLS)
def test_slice_of_one_value_per_channel(impl):
    norm = create_norm("batchnorm", 3, ghost_batch=1, impl=impl)
    with pytest.raises(NormConfigError, match="needs more than 1 value per channel"):
        norm(torch.randn(4, 3))
    assert norm(torch.randn(4, 3, 2)).shape == (4, 3, 2)  # 2 values per slice and channel


@pytest.mark.parametrize("ghost_batch", [0, -1, 2.0, True])
def test_bad_ghost_batch(ghost_batch):
    with pytest.raises(NormConfigError, match="ghost_batch"):
        create_norm("batchnorm", 3, ghost_batch=ghost_batch)


def test_ghost_batch_with_sync():
    with pytest.raises(NormConfigError, match="ghost_batch.*sync"):
        create_norm("batchnorm", 3, ghost_batch=2, sync=True)


@pytest.mark.parametrize("impl", IMPLS)
def test_bfloat16_input(impl):
    torch.manual_seed(0)
    x = (torch.randn(8, 3, 4, 4) * 2 + 1).bfloat16()
    low = _ghost(x.shape, 2, impl=impl)
    full = create_norm("batchnorm", 3, ghost_batch=2, impl=impl)
    full.load_state_dict(low.state_dict())
    y, y_full = low(x), full(x.float())  # the same values, in bfloat16 and in float32
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), y_full, rtol=0.01, atol=0.01)  # y rounded to bf16
    for key in ("running_mean", "running_var"):  # statistics computed in float32
        assert getattr(low, key).dtype == torch.float32
        torch.testing.assert_close(getattr(low, key), getattr(full, key), **TOL, msg=key)


def test_state_dict_keys_and_repr():
    norm = create_norm("batchnorm", 3, ghost_batch=4)
    assert list(norm.state_dict()) == list(nn.BatchNorm2d(3).state_dict())
    assert "ghost_batch=4" in repr(norm)
    assert "ghost_batch" not in repr(create_norm("batchnorm", 3))
