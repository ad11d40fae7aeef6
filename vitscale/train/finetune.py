"""Fine-tuning controls of the optimizer's side: ``model.freeze`` (parameters left out of training)
and ``optim.layer_decay`` (BEiT's layer-wise LR decay), kept apart from :mod:`.optim` so each is one
function.

- :func:`freeze`: every parameter whose name matches a ``model.freeze`` glob gets
  ``requires_grad=False`` (no gradient, no gradient reduction under FSDP2 — which lets frozen and
  trainable parameters share a unit — and :func:`vitscale.train.optim.param_groups` leaves it out of
  the optimizer). The task's own locks (CLIP's ``clip.lock_image``) come from ``Task.setup``.
- :func:`layer_decay_groups`: each optimizer group split by layer, its LR scaled by
  ``layer_decay ** k`` where the model's family says ``k`` (``FamilySpec.layer_decay``: the embeddings
  ``L + 1``, block i ``L - i``, the rest 0), as timm's ``param_groups_layer_decay`` (after BEiT,
  Bao et al. 2021, arXiv 2106.08254, ``optim_factory.py``).
- :func:`group_lines`: the groups, printed once at the start.
"""

from __future__ import annotations

import fnmatch

from torch import nn

from vitscale.errors import ConfigError
from vitscale.models.registry import family_of
from vitscale.tools.units import count


def plain_name(name: str) -> str:
    """A parameter's name without what wrappers (torch.compile, activation checkpointing, DDP) insert."""
    for token in ("_orig_mod.", "_checkpoint_wrapped_module.", "module."):
        name = name.replace(token, "")
    return name


def freeze(model: nn.Module, patterns: tuple[str, ...] | list[str]) -> list[str]:
    """Freeze the parameters matching any glob of ``patterns`` (``model.freeze``); a pattern matching
    no parameter is a :class:`ConfigError` naming some. Returns the lines the run prints."""
    if not patterns:
        return []
    names = [(plain_name(n), p) for n, p in model.named_parameters()]
    frozen = 0
    for pattern in patterns:
        hits = [p for n, p in names if fnmatch.fnmatchcase(n, pattern)]
        if not hits:
            some = ", ".join(n for n, _ in names[:6])
            raise ConfigError(f"model.freeze: {pattern!r} matches no parameter of the model (its parameters: {some}, ...; "
                              "globs such as blocks.[0-5].* or patch_embed.*)")  # fmt: skip
        for p in hits:
            if p.requires_grad:
                frozen += p.numel()
            p.requires_grad_(False)
    total = sum(p.numel() for _, p in names)
    tensors = sum(not p.requires_grad for _, p in names)
    return [f"model.freeze: {tensors} tensors ({count(frozen)} of {count(total)} parameters) frozen"]


def _match(name: str, exponents: dict[str, int], prefixes: list[str]) -> tuple[str, int]:
    """(the prefix ``name`` falls under, its exponent); a name under none: (its module path, 0)."""
    for k in prefixes:  # longest first
        if name == k or name.startswith(k + "."):
            return k, exponents[k]
    return name.rsplit(".", 1)[0], 0


def _exponents(model: nn.Module) -> tuple[dict[str, int], list[str]]:
    try:
        exponents = family_of(model).layer_decay_exponents(model)
    except NotImplementedError as e:
        raise ConfigError(f"optim.layer_decay: {e}") from None
    return exponents, sorted(exponents, key=len, reverse=True)


def layer_decay_groups(model: nn.Module, groups: list[dict], decay: float) -> list[dict]:
    """``groups`` (of :func:`vitscale.train.optim.param_groups`) split by layer: each group's parameters
    of one exponent ``k`` form a group ``<name>.k<k>`` with ``lr_scale = decay ** k`` (times the group's
    own ``lr_scale``: DINOv2's patch-embedding multiplier) and ``layer_exponent = k``."""
    exponents, prefixes = _exponents(model)
    names = {id(p): plain_name(n) for n, p in model.named_parameters()}
    out = []
    for g in groups:
        by: dict[int, list] = {}
        for p in g["params"]:
            by.setdefault(_match(names[id(p)], exponents, prefixes)[1], []).append(p)
        for k in sorted(by, reverse=True):
            out.append({**g, "name": f"{g['name']}.k{k}", "params": by[k], "lr_scale": g.get("lr_scale", 1.0) * decay**k,
                        "layer_exponent": k})
    return out


def group_lines(model: nn.Module, optimizer, layer_decay: float | None, peak_lr: float) -> list[str]:
    """With ``optim.layer_decay``, the optimizer's groups (printed once at the start): a line per
    exponent ``k`` with its LR scale, the layers in it and its tensors per weight decay."""
    if not layer_decay:
        return []
    names = {id(p): plain_name(n) for n, p in model.named_parameters()}
    lines = [f"optim.layer_decay={layer_decay:g}: the LR of each layer group x layer_decay^k (peak lr {peak_lr:.3e})"]
    exponents, prefixes = _exponents(model)
    by: dict[int, list] = {}
    for g in optimizer.param_groups:
        if "layer_exponent" in g:  # the model's groups (a task's own, its heads, are not split by layer)
            by.setdefault(g["layer_exponent"], []).append(g)
    for k in sorted(by, reverse=True):
        gs = by[k]
        layers = sorted({_match(names[id(p)], exponents, prefixes)[0] for g in gs for p in g["params"]})
        shown = ", ".join(layers[:4]) + (f", ... ({len(layers)} in all)" if len(layers) > 4 else "")
        kinds = ", ".join(f"{len(g['params'])} tensors wd {g['weight_decay']:g}" for g in gs)
        lines.append(f"  k={k} lr x{layer_decay**k:.4g}: {shown} ({kinds})")
    return lines


__all__ = ["freeze", "group_lines", "layer_decay_groups", "plain_name"]
