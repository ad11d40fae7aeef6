"""Teacher feature standardisation for feature distillation (the future ``train.task=feature_distill``):
one :class:`FeatureStandardizer` per teacher and per token kind (summary, patches), chosen by the
teacher's ``standardize`` key (:mod:`.feature_distill_config`). The student's adaptor heads learn the
*standardised* teacher features; :meth:`FeatureStandardizer.destandardize` maps an adaptor's output
back to the teacher's own space (the hand-over: an adaptor that gives the teacher's features).

**PHI-S** (Ranzinger et al. 2024, arXiv 2410.01680, "PHI Standardization"): with ``mu`` and ``C`` the
mean and covariance of the teacher's features and ``C = U diag(e) U^T``, ``y = alpha H U^T (x - mu)``
where ``H`` is a normalised Hadamard matrix (``H H^T = I``, every entry ``+-1/sqrt(D)``) and
``alpha = 1 / sqrt(mean(e))``: one scale for every dimension. Since ``H``'s entries all have the same
magnitude, every dimension of ``y`` has variance ``alpha^2 mean(e) = 1`` (isotropic standardisation).
The same construction as the authors' public code: NVlabs/RADIO at c0f3701,
``examples/common/phi_s.py`` lines 8-26 (``torch.cov``, ``eigh``, negative eigenvalues set to 0,
``whiten = H @ U.T / sqrt(e.mean())``). Inverse: ``x = mu + U H^T y / alpha``.

**Widths that are not a power of two** (:func:`hadamard`): a Hadamard matrix can exist only for
``D = 1, 2`` or a multiple of 4. As RADIO's ``examples/common/hadamard.py`` (lines 20-59) does: a power of
two is Sylvester's construction; otherwise ``D = 2^k m`` with ``m`` a Paley order — ``m = q + 1``
with ``q`` a prime ``= 3 (mod 4)`` (Paley I) or ``m = 2 (q + 1)`` with ``q`` a prime ``= 1 (mod 4)``
(Paley II) — and ``H = Sylvester(2^k) (x) Paley(m)`` (Kronecker product), the largest ``2^k`` tried
first. This covers the common ViT widths (192, 384, 768 = 64 x 12, 1152 = 32 x 36, 1280 = 64 x 20,
1536, 1664 = 16 x 104). A width with none of these (e.g. 6, 10, 1000): RADIO falls back to a random
orthogonal matrix (``get_bernoulli_matrix``, lines 148-156: the QR of a random +-1 matrix); so do we,
from a fixed seed (the same on every rank and every run), and :attr:`FeatureStandardizer.exact` is
False: the dimensions' variances are then 1 on average only.

**Running** mean / standard deviation, per dimension: ``y = (x - mu) / sigma`` (UNIC / DUNE's
teacher standardisation: naver/unic ``utils.py`` lines 304-332, naver/dune ``model/teacher_norm.py``
lines 28-79, which use an EMA of per-batch statistics; here the statistics are the exact ones of
every image seen, see below). ``sigma`` is clamped at ``eps`` (DUNE: ``torch.clamp(self.std,
min=self.eps)``, teacher_norm.py line 63). Inverse: ``x = mu + sigma y``.

**Estimation.** The statistics are the exact moments (count, sum, sum of outer products or of
squares, in float64) of the teacher's features over the first ``images`` images of the run (0 = every
image of the run); then they are frozen. Each update standardises the batch with statistics that
include it (the first step already has a batch's statistics, not the identity). Patch features count
every patch token (DUNE: aggregated over the batch and token dimensions, teacher_norm.py line 19).
A batch holding a non-finite feature (on any rank) is not absorbed: its step is not applied and
stops the run, and the statistics stay those of the batches before it.

**Several ranks.** A rank's batch moments are summed over the data-parallel group with one
``all_reduce`` (:func:`reduce_moments`) before they are absorbed: the sums, hence the statistics,
are the same on every rank, and equal to one process's on the global batch (:func:`combine` is that
sum's arithmetic). The derived statistics (``mean``, ``transform``, ``std``) are buffers computed
from identical sums by the same code: every rank holds the same values.

**Checkpoints.** Everything is a buffer (sums, counts, the derived statistics and the frozen flag):
saved in the task's state and resumed exactly (the derived statistics are stored, not recomputed, so
an ``eigh`` on another device cannot change a resumed run). The Hadamard matrix is a buffer that is
not saved (it follows from the width); :meth:`FeatureStandardizer.init_weights` sets every buffer
afresh (a module built on the meta device).
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn

STANDARDIZERS = ("phi_s", "running", "none")
"""The values of a teacher's ``standardize`` key."""

_FALLBACK_SEED = 0
"""Seed of the random orthogonal rotation of a width without a Hadamard construction."""


# ---------------------------------------------------------------------------------- Hadamard matrices
def _is_prime(n: int) -> bool:
    if n < 2:
        return False
    return all(n % p for p in range(2, math.isqrt(n) + 1))


def _sylvester(n: int) -> torch.Tensor:
    """Sylvester's +-1 Hadamard matrix of order ``n`` (a power of two): ``[[A, A], [A, -A]]`` doubled."""
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


def _jacobsthal(q: int) -> torch.Tensor:
    """The Jacobsthal matrix of the prime ``q``: ``Q[a, b] = chi(a - b)``, the quadratic character mod q."""
    squares = {(i * i) % q for i in range(1, q)}
    chi = torch.tensor([0.0] + [1.0 if r in squares else -1.0 for r in range(1, q)], dtype=torch.float64)
    idx = torch.arange(q)
    return chi[(idx[:, None] - idx[None, :]) % q]


def _paley(m: int) -> torch.Tensor | None:
    """A +-1 Hadamard matrix of order ``m`` by Paley's constructions (q prime), or None."""
    q = m - 1
    if _is_prime(q) and q % 4 == 3:  # Paley I: I + [[0, 1^T], [-1, Q]] (Q skew-symmetric)
        s = torch.zeros(m, m, dtype=torch.float64)
        s[0, 1:], s[1:, 0], s[1:, 1:] = 1.0, -1.0, _jacobsthal(q)
        return torch.eye(m, dtype=torch.float64) + s
    if m % 2 == 0:
        q = m // 2 - 1
        if _is_prime(q) and q % 4 == 1:  # Paley II: C (x) [[1, 1], [1, -1]] + I (x) [[1, -1], [-1, -1]]
            c = torch.zeros(q + 1, q + 1, dtype=torch.float64)  # the symmetric conference matrix
            c[0, 1:], c[1:, 0], c[1:, 1:] = 1.0, 1.0, _jacobsthal(q)
            a = torch.tensor([[1.0, 1.0], [1.0, -1.0]], dtype=torch.float64)
            b = torch.tensor([[1.0, -1.0], [-1.0, -1.0]], dtype=torch.float64)
            return torch.kron(c, a) + torch.kron(torch.eye(q + 1, dtype=torch.float64), b)
    return None


def hadamard(n: int) -> torch.Tensor | None:
    """The normalised Hadamard matrix of order ``n`` (float64, ``H H^T = I``, entries ``+-1/sqrt(n)``)
    by Sylvester's or Paley's construction (module docstring), or None when neither gives one."""
    if n < 1:
        raise ValueError(f"a Hadamard matrix has a positive order, not {n}")
    two = n & -n  # the largest power of two dividing n
    if two == n:
        return _sylvester(n) / math.sqrt(n)
    k = two
    while k >= 1:
        p = _paley(n // k)
        if p is not None:
            return torch.kron(_sylvester(k), p) / math.sqrt(n)
        k //= 2
    return None


def rotation(n: int) -> tuple[torch.Tensor, bool]:
    """PHI-S's rotation of width ``n`` (float64, orthogonal) and whether it is a true Hadamard matrix;
    else a fixed random orthogonal matrix (RADIO's fallback, module docstring)."""
    h = hadamard(n)
    if h is not None:
        return h, True
    g = torch.Generator().manual_seed(_FALLBACK_SEED)
    a = (torch.rand(n, n, generator=g, dtype=torch.float64) > 0.5).double() * 2 - 1
    q, r = torch.linalg.qr(a)
    return q * torch.where(r.diagonal() < 0, -1.0, 1.0)[None, :], False  # signs fixed: one answer


# ---------------------------------------------------------------------------------- moments
def moments(x: torch.Tensor, full: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(count, sum, second)`` of the vectors ``x (..., D)`` in float64: ``second`` is the sum of
    outer products ``x^T x`` (D, D) when ``full`` (PHI-S needs the covariance), else of squares (D,)."""
    v = x.detach().reshape(-1, x.shape[-1]).double()
    count = torch.tensor(float(v.shape[0]), dtype=torch.float64, device=v.device)
    second = v.T @ v if full else (v * v).sum(0)
    return count, v.sum(0), second


def combine(*shards: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """The moments of the union of shards (each ``(count, sum, second, ...)``): their element-wise
    sum — what :func:`reduce_moments`'s ``all_reduce`` computes over the ranks."""
    return tuple(torch.stack([s[i] for s in shards]).sum(0) for i in range(len(shards[0])))


def reduce_moments(parts: tuple[torch.Tensor, ...], group=None) -> tuple[torch.Tensor, ...]:
    """``parts`` summed over the process group ``group`` (None = the world) with one ``all_reduce``
    of their concatenation; as they are without torch.distributed or with one rank."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) == 1:
        return parts
    flat = torch.cat([p.reshape(-1) for p in parts])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
    out, i = [], 0
    for p in parts:
        out.append(flat[i : i + p.numel()].view_as(p))
        i += p.numel()
    return tuple(out)


# ---------------------------------------------------------------------------------- the module
class FeatureStandardizer(nn.Module):
    """Standardises one teacher's features of one token kind (``dim`` wide) as ``kind`` says
    (``phi_s`` | ``running`` | ``none``), its statistics estimated over the first ``images`` images
    (0 = the whole run). ``forward(x, group)`` updates the statistics (in training mode, until
    frozen) and returns ``x`` standardised; :meth:`standardize` / :meth:`destandardize` apply the
    current statistics and their inverse, with no update."""

    def __init__(self, dim: int, kind: str = "phi_s", images: int = 0, eps: float = 1e-6):
        super().__init__()
        if kind not in STANDARDIZERS:
            raise ValueError(f"standardize={kind!r}: choose one of {', '.join(STANDARDIZERS)}")
        if dim < 1 or images < 0 or not eps > 0:
            raise ValueError(f"FeatureStandardizer(dim={dim}, images={images}, eps={eps}): dim >= 1, images >= 0, eps > 0")
        self.dim, self.kind, self.images, self.eps = dim, kind, images, eps
        self._frozen = False
        full = kind == "phi_s"
        f64 = torch.float64
        self.register_buffer("count", torch.empty((), dtype=f64))  # vectors seen
        self.register_buffer("seen", torch.empty((), dtype=torch.int64))  # images seen
        self.register_buffer("frozen", torch.empty((), dtype=torch.bool))
        self.register_buffer("sum", torch.empty(dim, dtype=f64))
        self.register_buffer("second", torch.empty((dim, dim) if full else (dim,), dtype=f64))
        self.register_buffer("mean", torch.empty(dim))
        self.exact = True
        if full:
            self.exact = rotation(dim)[1]
            self.register_buffer("hadamard", torch.empty(dim, dim), persistent=False)  # from dim: not saved
            self.register_buffer("transform", torch.empty(dim, dim))  # y = transform @ (x - mean)
            self.register_buffer("inverse", torch.empty(dim, dim))  # x = mean + inverse @ y
            self.register_buffer("scale", torch.empty(()))  # alpha
        else:
            self.register_buffer("std", torch.empty(dim))
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """The statistics of no image: zero sums, the identity transform (also after a ``to_empty``
        from the meta device)."""
        for name in ("count", "seen", "frozen", "sum", "second", "mean"):
            getattr(self, name).zero_()
        self._frozen = False
        if self.kind == "phi_s":
            self.hadamard.copy_(rotation(self.dim)[0])
            self.transform.copy_(torch.eye(self.dim))
            self.inverse.copy_(torch.eye(self.dim))
            self.scale.fill_(1.0)
        else:
            self.std.fill_(1.0)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, kind={self.kind}, images={self.images}, exact={self.exact}"

    def describe(self) -> str:
        """A line for the run: what this standardiser does and over how many images."""
        over = f"the first {self.images} images" if self.images else "every image of the run"
        if self.kind == "none":
            return f"none (width {self.dim})"
        if self.kind == "running":
            return f"running mean / std over {over} (width {self.dim})"
        rot = "a Hadamard rotation" if self.exact else (
            "a fixed random rotation (no Hadamard construction of this width: the dimensions' variances are 1 on average only)")  # fmt: skip
        return f"PHI-S over {over}: {rot} and one scale (width {self.dim})"

    @torch.no_grad()
    def update(self, x: torch.Tensor, images: int, group=None) -> None:
        """Absorb the moments of ``x (..., D)`` — ``images`` images of this rank — summed over the
        ranks of ``group`` (every rank calls it, with its own batch)."""
        if self.kind == "none" or self._frozen:
            return
        if x.shape[-1] != self.dim:
            raise ValueError(f"features of width {x.shape[-1]} given to a standardiser of width {self.dim}")
        with torch.autocast(x.device.type, enabled=False):
            parts = moments(x, self.kind == "phi_s")
        parts = reduce_moments((*parts, torch.tensor(float(images), dtype=torch.float64, device=x.device)), group)
        # a batch with a non-finite feature on any rank (summed: non-finite on every rank alike) is not
        # absorbed — its step is not applied and stops the run (the task's FiniteWatch): the statistics a
        # checkpoint of that step saves are the ones before it (on the device: no host read)
        ok = torch.stack([torch.isfinite(p).all() for p in parts]).all()
        self.absorb(tuple(torch.where(ok, p, torch.zeros_like(p)) for p in parts))

    @torch.no_grad()
    def absorb(self, parts: tuple[torch.Tensor, ...]) -> None:
        """Add moments ``(count, sum, second, images)`` (already summed over the ranks) and recompute
        the statistics; freeze them once ``images`` images were seen."""
        count, total, second, images = (p.to(self.sum.device) for p in parts)
        self.count += count
        self.sum += total
        self.second += second
        self.seen += images.round().long()
        with torch.autocast(self.sum.device.type, enabled=False):
            self._derive()
        if self.images and int(self.seen) >= self.images:  # a host read during the estimation only
            self.frozen.fill_(True)
            self._frozen = True

    def _load_from_state_dict(self, *args, **kwargs):
        super()._load_from_state_dict(*args, **kwargs)
        self._frozen = bool(self.frozen)  # the host's copy of the flag (no device read per step)

    def _derive(self) -> None:
        n = self.count.clamp_min(1.0)
        mu = self.sum / n
        if self.kind == "running":
            var = (self.second - n * mu * mu) / (n - 1.0).clamp_min(1.0)  # unbiased, as torch.std
            self.mean.copy_(mu)
            self.std.copy_(var.clamp_min(0).sqrt().clamp_min(self.eps))
            return
        cov = (self.second - n * torch.outer(mu, mu)) / (n - 1.0).clamp_min(1.0)  # torch.cov's (unbiased)
        e, u = torch.linalg.eigh((cov + cov.T) / 2)
        e = e.clamp_min(0)  # RADIO phi_s.py lines 16-17: negative eigenvalues (round-off) are 0
        alpha = 1.0 / e.mean().clamp_min(self.eps * self.eps).sqrt()
        rot = self.hadamard.double() @ u.T  # H U^T
        self.mean.copy_(mu)
        self.scale.copy_(alpha)
        self.transform.copy_(alpha * rot)
        self.inverse.copy_(rot.T / alpha)

    def forward(self, x: torch.Tensor, group=None) -> torch.Tensor:
        """``x (..., D)`` standardised; in training mode (and until frozen) the statistics absorb
        ``x`` first, ``x.shape[0]`` images (summed over ``group``)."""
        if self.training:
            self.update(x, x.shape[0], group)
        return self.standardize(x)

    def standardize(self, x: torch.Tensor) -> torch.Tensor:
        """``x (..., D)`` in the standardised space (float32, outside any autocast: DUNE standardises
        under an autocast to float32, ``model/teacher_norm.py`` line 62), with the current statistics."""
        with torch.autocast(x.device.type, enabled=False):
            x = x.float()
            if self.kind == "none":
                return x
            if self.kind == "running":
                return (x - self.mean) / self.std
            return (x - self.mean) @ self.transform.T

    def destandardize(self, y: torch.Tensor) -> torch.Tensor:
        """The inverse of :meth:`standardize`: an adaptor's output ``y (..., D)`` in the teacher's space."""
        with torch.autocast(y.device.type, enabled=False):
            y = y.float()
            if self.kind == "none":
                return y
            if self.kind == "running":
                return y * self.std + self.mean
            return y @ self.inverse.T + self.mean


__all__ = ["STANDARDIZERS", "FeatureStandardizer", "combine", "hadamard", "moments", "reduce_moments", "rotation"]
