"""MixToken (Jiang et al. 2021, "All Tokens Matter", arXiv:2104.10858): a CutMix box on the token
grid. Token-labeling students take it through ``model(images, dense=True, mix=mix)``."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TokenMix:
    """MixToken on the coarse token grid: tokens inside ``box`` = (top, left, bottom, right) (coarse
    grid units, end exclusive) are taken from sample ``perm[b]`` instead of sample ``b``."""

    box: tuple[int, int, int, int]
    perm: torch.Tensor


def apply_token_mix(x: torch.Tensor, mix: TokenMix | None, scale: int = 1) -> torch.Tensor:
    """Mix a channels-last grid ``(B, H, W, C)`` whose cells are ``scale`` x ``scale`` per coarse token."""
    if mix is None:
        return x
    top, left, bottom, right = (v * scale for v in mix.box)
    if bottom <= top or right <= left:
        return x
    x = x.clone()
    x[:, top:bottom, left:right] = x[mix.perm, top:bottom, left:right]
    return x


__all__ = ["TokenMix", "apply_token_mix"]
