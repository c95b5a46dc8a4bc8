"""QK-norm: queries and keys normalized per head, over head_dim, before their dot product.

    q_h, k_h = Norm_q(q_h), Norm_k(k_h)   for q_h, k_h of shape (B, H, T, head_dim)
    attention = softmax(q_h k_h^T / sqrt(head_dim)) v_h

(Dehghani et al. 2023, ViT-22B; Wortsman et al. 2023; with an L2 norm, Henry et al. 2020): the
attention logits stay bounded however large the q and k projections grow. One norm for all the
queries and one for all the keys of a layer, each with its own affine of size head_dim shared by
the heads, as in ViT-22B and timm. The norms come from the registry: any family that normalizes
each vector over its own features (the `tokenwise` trait: layernorm, rmsnorm, a user's), since
a head's queries at one position must not see other positions or samples.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from normlab.norms.base import NormConfigError
from normlab.norms.registry import canonical_name, create_norm, norm_traits, norms_with


def check_qk_norm(name: object, key: str = "model.net.qk_norm") -> str | None:
    """The canonical family of a qk_norm choice (`LayerNorm`, `ln` -> layernorm), None for
    None; anything else raises NormConfigError naming `key` and the valid values."""
    if name is None:
        return None
    family = None
    if isinstance(name, str):
        try:
            family = canonical_name(name)
        except NormConfigError:
            family = None
    if family is None or not norm_traits(family).tokenwise:
        raise NormConfigError(
            f"{key}={name!r} is not a QK-norm (one normalizing each head vector over its own "
            f"features); valid: {', '.join(norms_with('tokenwise'))} or null (none)"
        )
    return family


def create_qk_norm(name: str | None, head_dim: int, **kwargs: Any) -> nn.Module:
    """The norm of queries or keys (B, H, T, head_dim) over head_dim: create_norm(name,
    head_dim, **kwargs) for a tokenwise family, nn.Identity() (no parameters) for None."""
    family = check_qk_norm(name)
    if family is None:
        return nn.Identity()
    return create_norm(family, head_dim, channel_dim=-1, **kwargs)  # features last
