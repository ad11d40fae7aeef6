"""Triton kernels of fused outlook attention (forward and backward); imported only when Triton is.

Notation (all tensors contiguous, channels last; ``C = nH * Dh`` local channels, ``K2 = K * K``):
values ``v`` ``(B, H, W, C)``; logits ``L`` ``(B, h, w, nH * K2 * K2)`` with rows ``(head, o, m)``;
window ``(i, j)`` covers the pixels ``(i*S - PAD + ki, j*S - PAD + kj)``, ``ki, kj < K``. For each
window, head and output slot ``o``: ``P[o, :] = softmax(scale * L[o, :])`` over the ``K2`` gathered
slots ``m``, and the window's result for slot ``o``, ``sum_m P[o, m] v[pixel m]``, is added onto
pixel ``o`` (the paper's unfold -> weight -> fold, Yuan et al. 2021, arXiv:2106.13112, Algorithm 1).

Nothing of size ``K2 x`` the values is materialised. Both the forward and the value gradient are
GATHERS, one program per tile of output pixels that share their position modulo the stride (so the
windows covering them are the same offsets for the whole tile and whole ``(ki, kj)`` cases drop out
with one scalar branch): an output pixel ``q`` receives from window ``(i, j)`` through slot ``o``
the values at ``q - o + m`` for every ``m`` — a fixed shift whatever the stride. No atomics: results
are deterministic. Accumulation is fp32 whatever the input dtype.

Backward: ``dP[o, m] = dout[pixel o] . v[pixel m]``; ``dL = scale * P * (dP - sum_m P dP)``
(softmax's gradient), one program per tile of windows, which also writes each row's log-sum-exp;
then ``dv[q] = sum over (window, m) gathering q, and o, of P[o, m] dout[pixel o]`` as a gather.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_PIXELS = 64
"""Output pixels per program of the gather kernels (forward, value gradient)."""
BLOCK_WINDOWS = 16
"""Windows per program of the logit-gradient kernel (it holds ``K2 x Dh`` values per window)."""


@triton.jit
def _pixel_tile(H, W, HC, WC, S: tl.constexpr, BLOCK_P: tl.constexpr):
    """The output pixels of this program of a gather kernel: grid axis 1 is (image b, class (pr, pc)),
    the pixels whose rows are ``pr`` and columns ``pc`` modulo the stride; axis 0 tiles that class's
    ``(HC, WC)`` grid, ``ceil(H / S) x ceil(W / S)``. Returns ``b, pr, pc, ti, tj, r, c, pmask``."""
    b_cls = tl.program_id(1)
    b = b_cls // (S * S)
    pr = (b_cls % (S * S)) // S
    pc = b_cls % S
    t = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    ti = t // WC
    tj = t % WC
    r = ti * S + pr
    c = tj * S + pc
    pmask = (ti < HC) & (r < H) & (c < W)
    return b, pr, pc, ti, tj, r, c, pmask


@triton.jit
def _fwd_kernel(V, L, OUT, H, W, h, w, HC, WC, C, NH, scale,
                K: tl.constexpr, PAD: tl.constexpr, S: tl.constexpr, DH: tl.constexpr,
                BLOCK_P: tl.constexpr, BLOCK_D: tl.constexpr):  # fmt: skip
    KK: tl.constexpr = K * K
    head = tl.program_id(2)
    b, pr, pc, ti, tj, r, c, pmask = _pixel_tile(H, W, HC, WC, S, BLOCK_P)
    d = tl.arange(0, BLOCK_D)
    dmask = d < DH
    b64 = b.to(tl.int64)
    vbase = V + b64 * H * W * C + head * DH
    lbase = L + b64 * h * w * NH * KK * KK + head * KK * KK
    acc = tl.zeros((BLOCK_P, BLOCK_D), dtype=tl.float32)
    for di in range(K):  # a loop, not unrolled: most (di, dj) are skipped per tile when S > 1
        for dj in range(K):
            # the window whose slot (di, dj) is this pixel: i = (r + PAD - di) / S when that divides
            ai = pr + PAD - di + S * K  # kept >= 0 so % and // are plain
            aj = pc + PAD - dj + S * K
            if (ai % S == 0) & (aj % S == 0):
                i = ti + (ai // S - K)
                j = tj + (aj // S - K)
                wm = pmask & (i >= 0) & (i < h) & (j >= 0) & (j < w)
                lrow = lbase + (i * w + j) * (NH * KK * KK) + (di * K + dj) * KK  # (BLOCK_P,) row o
                mx = tl.full((BLOCK_P,), float("-inf"), tl.float32)  # online softmax: one pass over m
                den = tl.zeros((BLOCK_P,), dtype=tl.float32)
                y = tl.zeros((BLOCK_P, BLOCK_D), dtype=tl.float32)
                for mi in range(K):
                    for mj in range(K):
                        logit = tl.load(lrow + mi * K + mj, mask=wm, other=0.0).to(tl.float32) * scale
                        mnew = tl.maximum(mx, logit)
                        alpha = tl.exp(mx - mnew)
                        e = tl.exp(logit - mnew)
                        mx = mnew
                        den = den * alpha + e
                        vr = r + (mi - di)  # the gathered pixel: this pixel - o + m
                        vc = c + (mj - dj)
                        vm = wm & (vr >= 0) & (vr < H) & (vc >= 0) & (vc < W)
                        vp = vbase + (vr * W + vc) * C
                        vv = tl.load(vp[:, None] + d[None, :], mask=vm[:, None] & dmask[None, :], other=0.0)
                        y = y * alpha[:, None] + e[:, None] * vv.to(tl.float32)
                acc += y / den[:, None]  # masked lanes: y = 0, den = K2
    op = OUT + b64 * H * W * C + head * DH + (r * W + c) * C
    tl.store(op[:, None] + d[None, :], acc.to(OUT.dtype.element_ty), mask=pmask[:, None] & dmask[None, :])


@triton.jit
def _bwd_logits_kernel(V, L, DOUT, DL, LSE, H, W, h, w, C, NH, scale,
                       K: tl.constexpr, PAD: tl.constexpr, S: tl.constexpr, DH: tl.constexpr,
                       BLOCK_W: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_K: tl.constexpr):  # fmt: skip
    KK: tl.constexpr = K * K
    b = tl.program_id(1)
    head = tl.program_id(2)
    t = tl.program_id(0) * BLOCK_W + tl.arange(0, BLOCK_W)
    i = t // w
    j = t % w
    wm = t < h * w
    m = tl.arange(0, BLOCK_K)
    mvalid = m < KK
    d = tl.arange(0, BLOCK_D)
    dmask = d < DH
    b64 = b.to(tl.int64)
    vbase = V + b64 * H * W * C + head * DH
    gbase = DOUT + b64 * H * W * C + head * DH
    lbase = L + b64 * h * w * NH * KK * KK + head * KK * KK + (i * w + j) * (NH * KK * KK)  # (BLOCK_W,)
    sbase = LSE + b64 * h * w * NH * KK + head * KK + (i * w + j) * (NH * KK)
    dlbase = DL + b64 * h * w * NH * KK * KK + head * KK * KK + (i * w + j) * (NH * KK * KK)
    # the window's K2 gathered values, (BLOCK_W, BLOCK_K, BLOCK_D)
    vr = i[:, None] * S - PAD + m[None, :] // K
    vc = j[:, None] * S - PAD + m[None, :] % K
    vm = wm[:, None] & mvalid[None, :] & (vr >= 0) & (vr < H) & (vc >= 0) & (vc < W)
    vp = vbase + (vr * W + vc) * C
    vals = tl.load(vp[:, :, None] + d[None, None, :], mask=vm[:, :, None] & dmask[None, None, :], other=0.0)
    vals = vals.to(tl.float32)
    lmask = wm[:, None] & mvalid[None, :]
    for o in range(KK):
        tr = i * S - PAD + o // K  # the pixel slot o lands on
        tc = j * S - PAD + o % K
        tm = wm & (tr >= 0) & (tr < H) & (tc >= 0) & (tc < W)
        g = tl.load((gbase + (tr * W + tc) * C)[:, None] + d[None, :], mask=tm[:, None] & dmask[None, :], other=0.0)
        dp = tl.sum(vals * g.to(tl.float32)[:, None, :], axis=2)  # (BLOCK_W, BLOCK_K)
        lptr = lbase[:, None] + o * KK + m[None, :]
        logit = tl.load(lptr, mask=lmask, other=0.0).to(tl.float32) * scale
        logit = tl.where(mvalid[None, :], logit, float("-inf"))  # padding slots of BLOCK_K
        mx = tl.max(logit, axis=1)
        e = tl.exp(logit - mx[:, None])
        lse = mx + tl.log(tl.sum(e, axis=1))
        p = tl.exp(logit - lse[:, None])
        dl = p * (dp - tl.sum(p * dp, axis=1)[:, None]) * scale  # slot o off the image: dp = 0 -> 0
        tl.store(dlbase[:, None] + o * KK + m[None, :], dl.to(DL.dtype.element_ty), mask=lmask)
        tl.store(sbase + o, lse, mask=wm)


@triton.jit
def _bwd_values_kernel(L, LSE, DOUT, DV, H, W, h, w, HC, WC, C, NH, scale,
                       K: tl.constexpr, PAD: tl.constexpr, S: tl.constexpr, DH: tl.constexpr,
                       BLOCK_P: tl.constexpr, BLOCK_D: tl.constexpr):  # fmt: skip
    KK: tl.constexpr = K * K
    head = tl.program_id(2)
    b, pr, pc, ti, tj, r, c, pmask = _pixel_tile(H, W, HC, WC, S, BLOCK_P)
    d = tl.arange(0, BLOCK_D)
    dmask = d < DH
    b64 = b.to(tl.int64)
    gbase = DOUT + b64 * H * W * C + head * DH
    lbase = L + b64 * h * w * NH * KK * KK + head * KK * KK
    sbase = LSE + b64 * h * w * NH * KK + head * KK
    acc = tl.zeros((BLOCK_P, BLOCK_D), dtype=tl.float32)
    for mi in range(K):
        for mj in range(K):
            # the window that gathers this pixel into its slot m = (mi, mj)
            ai = pr + PAD - mi + S * K
            aj = pc + PAD - mj + S * K
            if (ai % S == 0) & (aj % S == 0):
                i = ti + (ai // S - K)
                j = tj + (aj // S - K)
                wm = pmask & (i >= 0) & (i < h) & (j >= 0) & (j < w)
                win = i * w + j
                for oi in range(K):
                    for oj in range(K):
                        tr = r + (oi - mi)  # the pixel slot o lands on: this pixel - m + o
                        tc = c + (oj - mj)
                        tm = wm & (tr >= 0) & (tr < H) & (tc >= 0) & (tc < W)
                        lp = lbase + win * (NH * KK * KK) + (oi * K + oj) * KK + mi * K + mj
                        logit = tl.load(lp, mask=tm, other=0.0).to(tl.float32) * scale
                        lse = tl.load(sbase + win * (NH * KK) + oi * K + oj, mask=tm, other=0.0)
                        p = tl.where(tm, tl.exp(logit - lse), 0.0)
                        gp = gbase + (tr * W + tc) * C
                        g = tl.load(gp[:, None] + d[None, :], mask=tm[:, None] & dmask[None, :], other=0.0)
                        acc += p[:, None] * g.to(tl.float32)
    op = DV + b64 * H * W * C + head * DH + (r * W + c) * C
    tl.store(op[:, None] + d[None, :], acc.to(DV.dtype.element_ty), mask=pmask[:, None] & dmask[None, :])


def _dims(v: torch.Tensor, logits: torch.Tensor, kernel: int) -> tuple[int, ...]:
    B, H, W, C = v.shape
    _, h, w, A = logits.shape
    nh = A // kernel**4
    return B, H, W, C, h, w, nh, C // nh


def forward(v: torch.Tensor, logits: torch.Tensor, kernel: int, padding: int, stride: int, scale: float) -> torch.Tensor:
    """Fused outlook attention of contiguous ``v`` ``(B, H, W, C)`` and ``logits`` ``(B, h, w, nH*K^4)``."""
    B, H, W, C, h, w, nh, dh = _dims(v, logits, kernel)
    out = torch.empty_like(v)
    hc, wc = triton.cdiv(H, stride), triton.cdiv(W, stride)
    grid = (triton.cdiv(hc * wc, BLOCK_PIXELS), B * stride * stride, nh)
    _fwd_kernel[grid](v, logits, out, H, W, h, w, hc, wc, C, nh, scale, K=kernel, PAD=padding, S=stride, DH=dh,
                      BLOCK_P=BLOCK_PIXELS, BLOCK_D=triton.next_power_of_2(dh))  # fmt: skip
    return out


def backward(grad: torch.Tensor, v: torch.Tensor, logits: torch.Tensor, kernel: int, padding: int, stride: int,
             scale: float) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Gradients ``(dv, dlogits)`` of :func:`forward` for the output gradient ``grad`` (contiguous)."""
    B, H, W, C, h, w, nh, dh = _dims(v, logits, kernel)
    kk = kernel * kernel
    dlogits = torch.empty_like(logits)
    lse = torch.empty((B, h, w, nh, kk), device=v.device, dtype=torch.float32)  # per softmax row
    block_d = triton.next_power_of_2(dh)
    grid = (triton.cdiv(h * w, BLOCK_WINDOWS), B, nh)
    _bwd_logits_kernel[grid](v, logits, grad, dlogits, lse, H, W, h, w, C, nh, scale, K=kernel, PAD=padding,
                             S=stride, DH=dh, BLOCK_W=BLOCK_WINDOWS, BLOCK_D=block_d,
                             BLOCK_K=triton.next_power_of_2(kk))  # fmt: skip
    dv = torch.empty_like(v)
    hc, wc = triton.cdiv(H, stride), triton.cdiv(W, stride)
    grid = (triton.cdiv(hc * wc, BLOCK_PIXELS), B * stride * stride, nh)
    _bwd_values_kernel[grid](logits, lse, grad, dv, H, W, h, w, hc, wc, C, nh, scale, K=kernel, PAD=padding, S=stride,
                             DH=dh, BLOCK_P=BLOCK_PIXELS, BLOCK_D=block_d)  # fmt: skip
    return dv, dlogits
