"""fp8 training: which linear layers compute in float8, and the FSDP2 hooks that go with it.

Built on torchao's float8 training (``torchao.float8``, github.com/pytorch/ao/tree/main/torchao/float8)
rather than NVIDIA Transformer Engine: torchao swaps ``nn.Linear`` for a ``Float8Linear`` that is
plain PyTorch (tensor subclasses + ``torch._scaled_mm``), so the model stays our model — same
parameter names, same safetensors / DCP checkpoints, same per-block ``torch.compile`` — and it
composes with FSDP2 (including all-gathering the weights in float8) and DTensor, the engine vitscale
is built on. Transformer Engine brings its own layer classes and its own FSDP/TP integration, which
would need a second model definition and a second parallel path. torchao also offers an emulation
mode (float8 rounding with high-precision matmuls) that runs on a CPU, so the conversion and its
numerics are tested without a GPU.

Recipes (``precision.fp8``), as torchao names them:

- ``tensorwise``: one dynamic scale per tensor, cuBLAS fp8 GEMMs; the only recipe whose weights
  FSDP2 can all-gather in float8 (``precision.fp8_all_gather``), which then wants the scales of all
  weights computed in one pass after each optimizer step (:func:`precompute_float8_scales`).
- ``rowwise``: one scale per row, CUTLASS rowwise GEMMs; more accurate with outliers, slower kernels.
- ``rowwise_with_gw_hp``: rowwise, with the weight-gradient GEMM kept in high precision.

What is converted (:func:`float8_decision`): only the ``nn.Linear`` layers inside the model's
repeated blocks — the patch embedding, the MAP / classifier heads and everything outside the blocks
stay in the compute dtype (bf16): the first and last layers are the most sensitive to precision
and hold a negligible share of the FLOPs. Inside the blocks a layer is kept in bf16 when its
in / out features are not multiples of 16 (fp8 GEMMs need them) and, with ``precision.fp8_filter=auto``
(the default), when its shape is one that torchao's H100 measurements show running slower in fp8
than in bf16 (torchao/float8/README.md "Performance"; the same thresholds as torchao's own
``_auto_filter_for_recipe``): tensorwise needs ``out > 1024`` or ``in > 4096``; rowwise needs
``out > 2048``, ``in > 1024`` and not both ``out <= 4096`` and ``in <= 2048``. ``fp8_filter=torchao``
asks torchao's own ``_auto_filter_for_recipe`` instead (tensorwise and rowwise only): the same
thresholds today, whatever a later torchao changes them to.
"""

from __future__ import annotations

import dataclasses
import logging
import typing
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
from torch import nn

from vitscale.errors import ConfigError  # a setting that cannot run here: one line from the CLI

from .config import Fp8Filter, Fp8Recipe

RECIPES = typing.get_args(Fp8Recipe)  # the choices of precision.fp8, declared once in its config field
FILTERS = typing.get_args(Fp8Filter)
INSTALL_HINT = "pip install 'vitscale[fp8]' (torchao; with torch 2.6: pip install torchao==0.10.0)"


def require_torchao():
    """``torchao.float8``, or one readable line saying how to get it."""
    pytree_log = logging.getLogger("torch.utils._pytree")
    level = pytree_log.level
    pytree_log.setLevel(logging.ERROR)  # torchao 0.18 registers an Enum that newer torch warns about
    try:
        import torchao.float8 as float8
    except ImportError:
        raise ConfigError(f"precision.fp8 needs torchao, which is not installed: {INSTALL_HINT}") from None
    except Exception as err:  # e.g. a torchao newer than the installed torch supports (0.18 on torch 2.6)
        from importlib.metadata import PackageNotFoundError, version

        try:
            found = version("torchao")
        except PackageNotFoundError:  # imported from a path, not installed
            found = "?"
        raise ConfigError(
            f"precision.fp8: torchao {found} does not work with torch "
            f"{torch.__version__} ({type(err).__name__}: {err}); {INSTALL_HINT}"
        ) from None
    finally:
        pytree_log.setLevel(level)
    return float8


def check_recipe(recipe: str, fp8_filter: str = "auto") -> None:
    if recipe not in RECIPES:
        raise ConfigError(f"precision.fp8 must be one of {', '.join(RECIPES)}; got {recipe!r}")
    if fp8_filter not in FILTERS:
        raise ConfigError(f"precision.fp8_filter must be one of {', '.join(FILTERS)}; got {fp8_filter!r}")
    if fp8_filter == "torchao" and recipe not in ("none", "tensorwise", "rowwise"):
        raise ConfigError(f"precision.fp8_filter=torchao: torchao's shape filter has no rule for {recipe}; use auto or all")


def fp8_emulated(device: torch.device) -> bool:
    """Whether float8 must be emulated on ``device`` (CPU: numerics only, no speed-up). A CUDA GPU
    without fp8 tensor cores (compute capability below 8.9) is refused with the reason."""
    device = torch.device(device)
    if device.type == "cpu":
        return True
    if device.type == "cuda":
        cap = torch.cuda.get_device_capability(device)
        if cap < (8, 9):
            name = torch.cuda.get_device_name(device)
            raise ConfigError(
                f"precision.fp8 needs a GPU with fp8 tensor cores (compute capability 8.9+: L4, L40, H100, "
                f"B200); {name} is sm_{cap[0]}{cap[1]}: train with precision.fp8=none"
            )
        return False
    raise ConfigError(f"precision.fp8 runs on CUDA (or emulated on CPU), not on {device.type}")


def float8_decision(linear: nn.Linear, recipe: str, fp8_filter: str = "auto") -> str | None:
    """None when ``linear`` (inside a block) should compute in float8, else why it stays in bf16."""
    out_f, in_f = linear.out_features, linear.in_features
    if in_f % 16 or out_f % 16:
        return "features not multiples of 16"
    if fp8_filter == "all":
        return None
    if fp8_filter == "torchao":
        keep = require_torchao()._auto_filter_for_recipe(recipe, filter_fqns=[])
        return None if keep(linear, "") else f"torchao's shape filter for {recipe} keeps it in bf16"
    if recipe == "tensorwise" and out_f <= 1024 and in_f <= 4096:
        return "too small for tensorwise to pay (needs out > 1024 or in > 4096)"
    if recipe.startswith("rowwise") and (out_f <= 2048 or in_f <= 1024 or (out_f <= 4096 and in_f <= 2048)):
        return "too small for rowwise to pay (needs out > 2048, in > 1024, not both out <= 4096 and in <= 2048)"
    return None


@dataclass
class Float8Report:
    """What :func:`apply_float8` did (logged by the trainer, checked by the tests)."""

    recipe: str
    converted: list[str] = field(default_factory=list)
    """Qualified names of the linear layers now computing in float8."""
    kept: dict[str, str] = field(default_factory=dict)
    """Linear layers inside the blocks left in bf16, with the reason."""
    emulate: bool = False
    """torchao's emulation (CPU): float8 rounding, high-precision matmuls."""
    fsdp_float8_all_gather: bool = False
    """FSDP2 all-gathers these weights in float8 (tensorwise)."""

    @property
    def precompute_scales(self) -> bool:
        """Call :func:`precompute_float8_scales` after every optimizer step (float8 all-gather)."""
        return self.fsdp_float8_all_gather and bool(self.converted)

    def summary(self) -> str:
        """One line, e.g. ``fp8 tensorwise: 48 linear layers in float8, 48 in bf16 (48 too small ...)``."""
        line = f"fp8 {self.recipe}: {len(self.converted)} linear layers in float8, {len(self.kept)} in bf16"
        if self.kept:
            counts = Counter(self.kept.values())
            line += " (" + "; ".join(f"{n} {reason}" for reason, n in counts.most_common()) + ")"
        if self.fsdp_float8_all_gather:
            line += ", FSDP2 all-gathers them in float8"
        if self.emulate:
            line += ", emulated on CPU (numerics only, no speed-up)"
        return line


def apply_float8(
    model: nn.Module,
    blocks: Iterable[nn.Module],
    recipe: str,
    *,
    device: torch.device | str = "cuda",
    fp8_filter: str = "auto",
    fsdp_all_gather: bool = False,
) -> Float8Report:
    """Swap the ``nn.Linear`` layers inside ``blocks`` (the model's repeated blocks) for torchao's
    ``Float8Linear`` under ``recipe``, in place; works on the meta device. Call before tensor
    parallelism, activation checkpointing, compile and FSDP2 (torchtitan's order; the parallelize
    tail does). Returns :func:`float8_report` of the result.

    ``fsdp_all_gather``: the model will be sharded by FSDP2 — with ``tensorwise`` its float8 weights
    are then all-gathered in float8 (half the bytes of bf16); ignored for the rowwise recipes.
    """
    check_recipe(recipe, fp8_filter)
    blocks = list(blocks)
    if recipe == "none":
        return float8_report(model, blocks, recipe, fp8_filter)
    float8 = require_torchao()
    emulate = fp8_emulated(torch.device(device))
    config = dataclasses.replace(
        float8.Float8LinearConfig.from_recipe_name(recipe),
        emulate=emulate,
        enable_fsdp_float8_all_gather=bool(fsdp_all_gather and recipe == "tensorwise"),
    )

    def convert(module: nn.Module, fqn: str) -> bool:
        return isinstance(module, nn.Linear) and float8_decision(module, recipe, fp8_filter) is None

    for block in blocks:
        float8.convert_to_float8_training(block, module_filter_fn=convert, config=config)
    return float8_report(model, blocks, recipe, fp8_filter)


def float8_report(model: nn.Module, blocks: Iterable[nn.Module], recipe: str, fp8_filter: str = "auto") -> Float8Report:
    """What the linear layers inside ``blocks`` compute in — read from the model (before or after
    tensor parallelism, activation checkpointing and FSDP2, which keep the layers' classes, features
    and torchao configs): ``Float8Linear`` layers are converted, the other linears kept, with the reason."""
    report = Float8Report(recipe=recipe)
    if recipe == "none":
        return report
    from torchao.float8.float8_linear import Float8Linear

    names = {id(m): n for n, m in model.named_modules()}
    for block in blocks:
        prefix = names.get(id(block), "")
        for fqn, module in block.named_modules():
            if not isinstance(module, nn.Linear):
                continue
            name = ".".join(part for part in (prefix, fqn) if part)
            if isinstance(module, Float8Linear):
                report.converted.append(name)
                report.emulate |= module.config.emulate
                report.fsdp_float8_all_gather |= module.config.enable_fsdp_float8_all_gather
            else:
                report.kept[name] = float8_decision(module, recipe, fp8_filter) or "not converted"
    return report


def fsdp_float8_all_gather(precision, dims) -> bool:
    """Whether FSDP2 will all-gather float8 weights: ``tensorwise`` with ``precision.fp8_all_gather``
    and parameters sharded over several ranks (``parallel.dp_shard > 1``)."""
    return precision.fp8 == "tensorwise" and precision.fp8_all_gather and dims.distributed and dims.dp_shard > 1


def precompute_float8_scales(model: nn.Module, report: Float8Report) -> None:
    """After the optimizer step: the float8 scales of all FSDP2-sharded weights in one all-reduce
    (instead of one per weight at the next all-gather). A no-op unless float8 all-gather is on."""
    if report.precompute_scales:
        require_torchao().precompute_float8_dynamic_scale_for_fsdp(model)


__all__ = [
    "FILTERS",
    "RECIPES",
    "Float8Report",
    "apply_float8",
    "check_recipe",
    "float8_decision",
    "float8_report",
    "fp8_emulated",
    "fsdp_float8_all_gather",
    "precompute_float8_scales",
    "require_torchao",
]
