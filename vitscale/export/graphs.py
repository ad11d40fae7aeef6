"""The graphs of an export: one per input kind, each captured once with ``torch.export`` and written
as a ``torch.export`` archive (``.pt2``) or converted to ONNX.

ONNX goes through PyTorch's dynamo-based exporter (``torch.onnx.export(ExportedProgram, dynamo=True)``,
which translates the exported program with onnxscript's ATen library; no network). Checked on
torch 2.6 and 2.14 with our ViT, VOLO and both CLIP towers, static and dynamic batch. The
TorchScript-based exporter (``dynamo=False``, deprecated by PyTorch) cannot translate VOLO's
``F.fold`` (``col2im``) with a dynamic batch. On torch 2.6 the dynamo exporter cannot translate an
inference BatchNorm of an exported program, so eval-mode Conv2d -> BatchNorm2d pairs are folded
into the convolution first (``torch.nn.utils.fusion.fuse_conv_bn_eval``; VOLO's stem), on every
torch version, so the graphs are the same; the check after writing compares against the unfolded
model.
"""

from __future__ import annotations

import contextlib
import copy
import io
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

MAX_BATCH = 4096
"""Upper bound of a dynamic batch dimension (torch 2.6's export needs a finite one)."""


@dataclass
class Graph:
    """One exported graph: ``module(input) -> output``."""

    name: str
    """``image`` or ``text``: also the file stem (``image.onnx``, ``text.pt2``)."""
    module: nn.Module
    """What is captured (a BatchNorm-folded copy; see the module docstring)."""
    reference: object
    """``fn(input) -> output`` of the trained model itself: the check compares against it."""
    input_name: str
    """What the graph takes: ``image`` (normalised images) or ``tokens`` (token ids)."""
    output_name: str
    example: torch.Tensor
    """A real input whose shape (batch aside) and dtype the graph takes."""
    description: str
    """What the output is, for export.json."""


def fold_batchnorm(module: nn.Module) -> nn.Module:
    """A copy of an eval-mode ``module`` with each Conv2d -> BatchNorm2d pair of an ``nn.Sequential``
    folded into the convolution (the BatchNorm becomes Identity)."""
    from torch.nn.utils.fusion import fuse_conv_bn_eval

    module = copy.deepcopy(module).eval()
    for seq in module.modules():
        if not isinstance(seq, nn.Sequential):
            continue
        keys = list(seq._modules)
        for a, b in zip(keys, keys[1:]):
            conv, bn = seq._modules[a], seq._modules[b]
            if isinstance(conv, nn.Conv2d) and isinstance(bn, nn.BatchNorm2d) and bn.track_running_stats:
                seq._modules[a] = fuse_conv_bn_eval(conv, bn)
                seq._modules[b] = nn.Identity()
    return module


def build_graphs(serving, images: torch.Tensor, tokens: torch.Tensor | None) -> list[Graph]:
    """The graphs the model's family serves (``FamilySpec.serving``: by default one image graph of
    class logits; CLIP: its image and text graphs of L2-normalised embeddings), each with its real
    example input (``images``, or ``tokens`` for a graph of token ids)."""
    examples = {"image": images, "tokens": tokens}
    return [
        Graph(g.name, fold_batchnorm(g.module), g.reference or g.module, g.input, g.output, examples[g.input], g.description)
        for g in serving.graphs
    ]


def capture(graph: Graph, batch: int | None):
    """``torch.export`` the graph with a static ``batch`` (the example is cut / tiled to it) or,
    with ``batch=None``, a dynamic batch dimension (1 .. MAX_BATCH)."""
    x = graph.example
    if batch is None:
        x = x[:2] if x.shape[0] >= 2 else x.repeat(2, *([1] * (x.dim() - 1)))  # 2: not a specialised size
        dims = ({0: torch.export.Dim("batch", min=1, max=MAX_BATCH)},)
    else:
        x = x.repeat(-(-batch // x.shape[0]), *([1] * (x.dim() - 1)))[:batch]
        dims = None
    with torch.no_grad():
        return torch.export.export(graph.module, (x,), dynamic_shapes=dims), x


def write_pt2(program, path: Path) -> None:
    torch.export.save(program, str(path))


def write_onnx(program, example: torch.Tensor, graph: Graph, path: Path) -> None:
    """Convert an exported program to ONNX (dynamo exporter; weights in the file, or beside it in
    ``<name>.onnx.data`` past ONNX's 2 GB limit)."""
    try:
        import onnx  # noqa: F401
        import onnxscript  # noqa: F401
    except ImportError as e:
        raise MissingDependency(e.name) from None
    log = io.StringIO()
    with warnings.catch_warnings(), contextlib.redirect_stdout(log):
        warnings.simplefilter("ignore")
        onnx_program = torch.onnx.export(
            program, (example,), dynamo=True, input_names=[graph.input_name], output_names=[graph.output_name]
        )
        onnx_program.save(str(path))


class MissingDependency(ImportError):
    """An optional package of the export is not installed."""

    def __init__(self, name: str | None):
        super().__init__(f"{name or 'a package'} is not installed: pip install 'vitscale[export]' (onnx, onnxscript, onnxruntime)")
