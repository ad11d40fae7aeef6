"""Two numerics switches of the blocks, applied by the parallelize tail (:func:`apply_block_numerics`):

- ``precision.residual``: ``fp32`` (default) keeps the residual stream between blocks in float32 under
  bf16 autocast — the float32 position embedding promotes the patch tokens there, and every residual
  add keeps them so; ``bf16`` holds it in bfloat16 (each block casts its input and its branches'
  outputs), as Megatron-core does by default (``fp32_residual_connection = False``,
  NVIDIA/Megatron-LM ``megatron/core/transformer/transformer_config.py``) and torchtitan's FSDP2
  mixed precision does (bf16 parameters, no float32 stream). Half the bytes of every residual add and
  LayerNorm read; the sums are rounded to bf16 at each add. Needs bf16 autocast; float32 runs are
  untouched (the switch is refused there).
- ``precision.mlp_epilogue``: ``none`` (default); ``cublaslt`` computes each block's GELU MLP through
  :mod:`vitscale.models.common.fused_mlp` (GELU and the bias gradients inside cuBLASLt's matmul
  epilogues, through nvmath-python) — only in models whose activation is ``gelu_tanh``, since
  cuBLASLt's GELU is the tanh form; ``cublaslt_tanh`` also in exact-GELU (erf) models, which then
  compute the tanh approximation instead (a different function, within about 1e-3 of erf's GELU:
  their outputs no longer match timm's). Needs CUDA, bf16 autocast and nvmath-python; not with fp8
  (whose ``Float8Linear`` layers it would bypass) or tensor parallelism.

Each is a one-line :class:`ConfigError` where it cannot apply, before anything runs.
"""

from __future__ import annotations

import typing
from collections.abc import Sequence

import torch
from torch import nn

from vitscale.errors import ConfigError  # a setting that cannot run here: one line from the CLI

from .config import MlpEpilogue, ResidualDtype

RESIDUALS = typing.get_args(ResidualDtype)
EPILOGUES = typing.get_args(MlpEpilogue)
NVMATH_HINT = "pip install nvmath-python (cuBLASLt's epilogues from Python)"


def _needs_bf16(setting: str, autocast: torch.dtype | None) -> None:
    if autocast != torch.bfloat16:
        now = "no autocast (float32)" if autocast is None else f"autocast to {str(autocast).replace('torch.', '')}"
        raise ConfigError(f"{setting} needs bf16 autocast (precision.autocast=bf16, or auto on a GPU); this run has {now}")


def _honouring(blocks: Sequence[nn.Module], switch: str) -> list[nn.Module]:
    """The blocks whose forward reads ``switch`` (the ViT blocks' own forwards: a subclass with its own
    forward, such as CLIP's text ``CausalBlock``, keeps the float32 stream and the plain MLP)."""
    from ..models.vit.model import Block, ParallelBlock

    forwards = {"residual_dtype": (Block.forward, ParallelBlock.forward), "mlp_epilogue": (Block.forward,)}[switch]
    return [b for b in blocks if type(b).forward in forwards]


def epilogue_decision(block: nn.Module, mode: str) -> str | None:
    """None when ``block``'s MLP can go through the cuBLASLt epilogues under ``mode`` (``cublaslt`` or
    ``cublaslt_tanh``), else why not."""
    from ..models.common.mlp import Mlp

    mlp = getattr(block, "mlp", None)
    if not _honouring([block], "mlp_epilogue") or not isinstance(mlp, Mlp):
        return f"{type(block).__name__} has no plain MLP (fc1 -> GELU -> fc2) that reads the switch"
    act = mlp.act
    if not isinstance(act, nn.GELU):
        return f"its activation is {type(act).__name__}, not GELU"
    if act.approximate != "tanh" and mode != "cublaslt_tanh":
        return "its GELU is the exact (erf) form and cuBLASLt's is the tanh form (precision.mlp_epilogue=cublaslt_tanh computes that instead)"
    if mlp.fc1.bias is None or mlp.fc2.bias is None:
        return "its MLP has no biases"
    if mlp.drop1.p > 0 or mlp.drop2.p > 0:
        return "its MLP has dropout"
    if mlp.fc1.out_features % 8 or mlp.fc1.in_features % 8 or mlp.fc2.out_features % 8:
        return "its MLP's widths are not multiples of 8"
    return None


def check_epilogue_device(mlp_epilogue: str, device_type: str) -> None:
    """The cuBLASLt epilogues run on CUDA only: one line elsewhere (``vitscale bench --dry-run`` asks
    before anything is built, :func:`apply_block_numerics` as it applies them)."""
    if mlp_epilogue != "none" and device_type != "cuda":
        raise ConfigError(f"precision.mlp_epilogue={mlp_epilogue} runs cuBLASLt epilogues on CUDA; this run is on {device_type}")


def apply_block_numerics(blocks: Sequence[nn.Module], *, residual: str = "fp32", mlp_epilogue: str = "none",
                         autocast: torch.dtype | None, device: torch.device | str, fp8: str = "none",
                         tp: int = 1) -> dict[str, int]:  # fmt: skip
    """Set ``residual_dtype`` / ``mlp_epilogue`` on the ``blocks`` whose forward reads them (ViT, NaFlex
    and CLIP's vision tower: :class:`vitscale.models.vit.model.Block`, and ``ParallelBlock`` for the
    residual), in place, before compile; refused where no block reads it, or (the epilogues) where one
    that reads it cannot use it. Returns how many blocks took each (``{"residual": n, "mlp_epilogue": m}``)."""
    if residual not in RESIDUALS:
        raise ConfigError(f"precision.residual must be one of {', '.join(RESIDUALS)}; got {residual!r}")
    if mlp_epilogue not in EPILOGUES:
        raise ConfigError(f"precision.mlp_epilogue must be one of {', '.join(EPILOGUES)}; got {mlp_epilogue!r}")
    blocks = list(blocks)
    done = {"residual": 0, "mlp_epilogue": 0}
    if residual == "bf16":
        _needs_bf16("precision.residual=bf16", autocast)
        takers = _honouring(blocks, "residual_dtype")
        if not takers:
            kinds = ", ".join(sorted({type(b).__name__ for b in blocks})) or "none"
            raise ConfigError(f"precision.residual=bf16: this model's blocks ({kinds}) have no bf16 residual stream")
        for b in takers:
            b.residual_dtype = torch.bfloat16
        done["residual"] = len(takers)
    if mlp_epilogue != "none":
        setting = f"precision.mlp_epilogue={mlp_epilogue}"
        check_epilogue_device(mlp_epilogue, torch.device(device).type)
        _needs_bf16(setting, autocast)
        if fp8 != "none":
            raise ConfigError(f"{setting} does not combine with precision.fp8={fp8} (its float8 linears would be bypassed)")
        if tp > 1:
            raise ConfigError(f"{setting} does not combine with tensor parallelism (parallel.tp={tp})")
        from ..models.common.fused_mlp import nvmath_available

        if not nvmath_available():
            raise ConfigError(f"{setting} needs nvmath-python, which is not installed: {NVMATH_HINT}")
        takers = _honouring(blocks, "mlp_epilogue")
        why = sorted({epilogue_decision(b, mlp_epilogue) for b in takers or blocks} - {None})
        if why:
            raise ConfigError(f"{setting}: not every block's MLP can use it: {why[0]}")
        for b in takers:
            b.mlp_epilogue = True
        done["mlp_epilogue"] = len(takers)
    return done


__all__ = ["EPILOGUES", "RESIDUALS", "apply_block_numerics", "check_epilogue_device", "epilogue_decision"]
