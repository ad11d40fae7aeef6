"""``vitscale export``: trained weights -> ONNX or ``torch.export`` graphs + ``export.json``, checked.

The model family says which graphs (``FamilySpec.serving``): a classifier (ViT, VOLO, any family by
default) becomes one graph, ``image`` (normalised images -> logits); CLIP becomes two, ``image`` and
``text`` (token ids -> L2-normalised embeddings). Beside them, ``export.json`` holds what a server
needs (preprocessing constants, class names, the family's tokenizer settings and files, CLIP's logit
scale), each file's SHA-256, and the result of the check run right after writing (the
file loaded back and compared with the eager model on real images and captions; ``check.py``).
docs/using.md describes the layout; ``scripts/serve_onnx.py`` serves it.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

FORMATS = {"onnx": ".onnx", "torch-export": ".pt2"}


def default_out_dir(src: str | Path, fmt: str, ema: bool = False, teacher: bool = False) -> Path:
    """``<run folder>/export/<format>[-ema|-teacher]`` (the folder of a bare ``.safetensors`` file)."""
    p = Path(src)
    return (p if p.is_dir() else p.parent) / "export" / (fmt + ("-ema" if ema else "-teacher" if teacher else ""))


def _io(name: str, dtype: str, shape: list) -> dict:
    return {"name": name, "dtype": dtype, "shape": shape}


def export(src, fmt: str = "onnx", *, out=None, batch: int | None = 1, ema: bool = False, config: str | None = None,
           allow_shell: bool = False, log=print, teacher: bool = False) -> dict:  # fmt: skip
    """Export ``src`` (run folder or ``.safetensors``) as ``fmt`` into ``out`` with a static batch
    size ``batch`` (None = dynamic), check every file, write ``export.json``; returns its content.
    ``allow_shell``: the config's ``pipe:`` data paths are accepted (``load_config``)."""
    from .source import load_source

    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}: choose {' or '.join(FORMATS)}")
    if batch is not None and batch < 1:
        raise ValueError(f"batch size must be positive or dynamic, got {batch}")
    source = load_source(src, ema=ema, config=config, allow_shell=allow_shell, teacher=teacher)
    if source.config_from == "defaults":
        log("note: no config.yaml beside the weights: the preprocessing constants in export.json are vitscale's "
            "defaults (ImageNet mean/std, crop_pct 0.875); pass --config to give the run's")  # fmt: skip
    if not out and default_out_dir(src, fmt, ema, teacher).is_symlink():  # inside the run folder: nothing is followed
        from vitscale.safe_write import FolderLink

        raise FolderLink.at(default_out_dir(src, fmt, ema, teacher))
    out = Path(out) if out else default_out_dir(src, fmt, ema, teacher)
    out.mkdir(parents=True, exist_ok=True)
    # Every file is written into a new folder of this process's (nothing there to follow), then
    # renamed into ``out``: a rename replaces a link at a name there and writes nothing through it.
    work = Path(tempfile.mkdtemp(prefix=".export-", dir=out))
    try:
        info = _export_into(work, out, source, fmt, batch, ema, log)
        info["model"]["teacher"] = teacher
        for f in work.iterdir():
            os.replace(f, out / f.name)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    from vitscale.safe_write import write_atomic  # never through a symbolic link

    write_atomic(out / "export.json", json.dumps(info, indent=1) + "\n")
    return info


def _export_into(out: Path, final: Path, source, fmt: str, batch: int | None, ema: bool, log) -> dict:
    """The graphs (and tokenizer files) of ``source`` written into the folder ``out`` (moved to ``final``
    afterwards, the folder the log names); export.json's content."""
    import torch

    from vitscale.version import __version__

    from .check import check_graph, real_captions, real_images
    from .graphs import MAX_BATCH, build_graphs, capture, write_onnx, write_pt2
    from .spec import class_names, context_length, preprocess_spec, run_class_names, sha256, tokenizer_spec

    model = source.model
    family = source.family
    serving = family.serving_graphs(model)  # the graphs the family serves (CLIP: image and text)
    texts = serving.text_length is not None
    images = real_images(source)
    tokenizer = family.create_tokenizer(context_length(source, serving.text_length)) if texts else None
    tokens = real_captions(source, tokenizer) if texts else None
    b = "batch" if batch is None else batch
    info: dict = {
        "format": fmt,
        "exported_by": f"vitscale {__version__}, torch {torch.__version__}",
        "model": {"name": source.name, "family": family.name, "task": source.task,
                  "overrides": source.overrides, "weights": source.weights, "ema": ema, "step": source.step},
        "batch": "dynamic" if batch is None else batch,
        "preprocess": preprocess_spec(source),
        "graphs": {},
    }  # fmt: skip
    if batch is None:
        info["max_batch"] = MAX_BATCH
    info.update(serving.info)
    if texts:
        info["tokenizer"] = tokenizer_spec(tokenizer, out)
        info["zeroshot"] = {"class_names": run_class_names(source), "templates": list(source.cfg.clip.zeroshot_templates)}
    else:
        with torch.no_grad():
            num_classes = int(model(images[:1]).shape[-1])
        info["num_classes"] = num_classes
        info["labels"] = class_names(source, num_classes)
    for graph in build_graphs(serving, images, tokens):
        path = out / f"{graph.name}{FORMATS[fmt]}"
        log(f"exporting the {graph.name} graph to {final / path.name}")
        program, example = capture(graph, batch)
        if fmt == "onnx":
            write_onnx(program, example, graph, path)
        else:
            write_pt2(program, path)
        check = check_graph(graph, path, fmt, batch)
        verdict = "passed" if check["passed"] else "FAILED"
        log(f"check {verdict}: {check['runtime']} vs eager, max relative error {check['max_rel_error']:.2e} "
            f"(tolerance {check['tolerance']:.0e}) on {check['inputs']}, batch sizes {', '.join(check['max_rel_error_by_batch'])}")  # fmt: skip
        dims = list(example.shape[1:])
        with torch.no_grad():
            out_dim = list(graph.reference(example[:1]).shape[1:])
        info["graphs"][graph.name] = {
            "file": path.name,
            "sha256": sha256(path),
            "input": _io(graph.input_name, str(example.dtype).replace("torch.", ""), [b, *dims]),
            "output": _io(graph.output_name, "float32", [b, *out_dim]),
            "output_is": graph.description,
            "check": check,
        }
        if fmt == "onnx" and (out / f"{path.name}.data").is_file():
            info["graphs"][graph.name]["external_data"] = f"{path.name}.data"
    checks = [g["check"] for g in info["graphs"].values()]
    info["check"] = {"passed": all(c["passed"] for c in checks), "max_rel_error": max(c["max_rel_error"] for c in checks),
                     "tolerance": checks[0]["tolerance"]}  # fmt: skip
    return info


__all__ = ["FORMATS", "default_out_dir", "export"]
