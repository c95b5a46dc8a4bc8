"""QK-norm: queries and keys normalized per head, over head_dim, before their dot product.

    q_h, k_h = Norm_q(q_h), Norm_k(k_h)   for q_h, k_h of shape (B, H, T, head_dim)
    attention = softmax(q_h k_h^T / sqrt(head_dim)) v_h

(Dehghani et al. 2023, ViT-22B; Wortsman et al. 2023; with an L2 norm, Henry et al. 2020): the
attention logits stay bounded however large the q and k projections grow. One norm for all the
queries and one for all the keys of a layer, each with its own affine of size head_dim shared by
the heads, as in ViT-22B and timm. The norm is a norm layer (a callable width -> module) of
any family that normalizes each vector over its own features (the `tokenwise` trait: layernorm,
rmsnorm, a user's), since a head's queries at one position must not see other positions or
samples.
"""

from __future__ import annotations

import functools
from typing import Any

from torch import nn

from normlab.norms.registry import NormLayer, build_norm, norm_name, norm_traits, norms_with


def check_qk_norm(norm_layer: Any) -> NormLayer | None:
    """`norm_layer` when it can normalize queries and keys: a norm layer (a callable width ->
    module, as a norm config's partial) whose class, where known, declares `tokenwise`; None
    for None. Anything else raises a ValueError naming the argument and the valid families."""
    if norm_layer is None:
        return None
    traits = norm_traits(norm_layer) if callable(norm_layer) else None
    if not callable(norm_layer) or (traits is not None and not traits.tokenwise):
        shown = norm_name(norm_layer) if callable(norm_layer) else norm_layer
        raise ValueError(
            f"qk_norm={shown!r} is not a QK-norm (a norm layer normalizing each head vector over "
            f"its own features); valid: {', '.join(norms_with('tokenwise'))} or None (none)"
        )
    return norm_layer


def create_qk_norm(norm_layer: NormLayer | None, head_dim: int, **factory: Any) -> nn.Module:
    """The norm of queries or keys (B, H, T, head_dim) over head_dim: `norm_layer(head_dim)`
    with its features last (`build_norm`), nn.Identity() (no parameters) for None. `factory`:
    torch.nn's device and dtype, as timm's Attention passes them."""
    if check_qk_norm(norm_layer) is None:
        return nn.Identity()
    layer = functools.partial(norm_layer, **factory) if factory else norm_layer
    return build_norm(layer, head_dim, channel_dim=-1)  # features last
