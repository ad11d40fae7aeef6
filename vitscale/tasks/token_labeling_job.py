"""Token labeling's teacher job (``vitscale label-tokens``, :mod:`vitscale.tasks.token_labeling_command`):
dense token labels from a teacher. The teacher's run
(:func:`vitscale.run.assemble`, purpose ``label``) with its weights, over every split in
``teacher.splits``, each labelled by :func:`vitscale.tasks.token_labeling_teacher.label_split`.

The teacher is ``teacher.model`` (else the config's own model) with a vitscale checkpoint, or a timm
architecture (``teacher.timm``) with a timm checkpoint, over the config's data uncropped
(``data.crop_pct=1``, no augmentation). Under torchrun it takes the ``parallel.*`` layout (FSDP, TP)
and each data-parallel rank labels whole batches of a split (the batches of a one-process run:
``EvalShardSampler``) into the same files: the output is the one-process output.
"""

from __future__ import annotations

import dataclasses

from vitscale.config import Config
from vitscale.interop import hub


def teacher_config(cfg: Config, num_classes: int | None = None) -> Config:
    """The run config of the teacher: its model (``teacher.model`` with ``teacher.overrides``, else the
    config's own model; ``num_classes`` = its checkpoint's head) over the config's data, uncropped
    (``data.crop_pct=1``) and at ``teacher.img_size`` (else the teacher's own size)."""
    from vitscale.config.schema import ModelConfig
    from vitscale.models import get_model_config

    t = cfg.teacher
    name = t.model or cfg.model.name
    overrides = dict(t.overrides if t.model else cfg.model.overrides)
    if num_classes is not None and "num_classes" in {f.name for f in dataclasses.fields(get_model_config(name))}:
        overrides["num_classes"] = num_classes
    data = dataclasses.replace(cfg.data, crop_pct=1.0, img_size=None)
    return dataclasses.replace(cfg, model=ModelConfig(name=name, overrides=overrides), data=data)


def teacher_run(cfg: Config):
    """The assembled run of the teacher (``vitscale.run.assemble``, purpose ``label``), weights loaded."""
    t = cfg.teacher
    if not t.checkpoint:
        raise ValueError("set teacher.checkpoint (a .safetensors file, run folder or checkpoint)")
    from vitscale.run import assemble, head_classes

    if t.timm:
        from vitscale.interop import load_timm_checkpoint

        checkpoint, arch = _from_cache(t.checkpoint, "teacher.checkpoint"), t.timm
        if hub.is_hub_id(arch):  # timm would fetch the architecture's config.json from the Hub: read the cached one
            arch = f"local-dir:{hub.resolve(arch, 'teacher.timm')}"
        teacher = load_timm_checkpoint(checkpoint, arch, **dict(t.overrides))
        return assemble(teacher_config(cfg), "label", model=teacher, **_settings(t))
    from vitscale.checkpoint import load_model_weights, read_weights

    sd = read_weights(_from_cache(t.checkpoint, "teacher.checkpoint"), t.weights)
    run = assemble(teacher_config(cfg, head_classes(sd)), "label", **_settings(t))
    load_model_weights(run.model, sd, strict=True, source=f"teacher.checkpoint={t.checkpoint}")
    return run


def _settings(t) -> dict:
    """What the teacher's pass takes from ``teacher.*`` instead of the run's data and evaluation
    settings: its image side and batch."""
    return {"side": ("teacher.img_size", t.img_size), "batch_size": t.batch_size}


def _from_cache(source: str, setting: str) -> str:
    """``hf-hub:org/name`` as its weights file in the local Hugging Face cache (never downloaded,
    :mod:`vitscale.interop.hub`); any other source as given."""
    if not hub.is_hub_id(source):
        return source
    from vitscale.interop.pretrained import HUB_LAYOUTS

    folder = hub.resolve(source, setting)
    for _, _, files in HUB_LAYOUTS:
        found = next((folder / f for f in files if (folder / f).is_file()), None)
        if found is not None:
            return str(found)
    return str(folder)  # a vitscale export or run folder in the cache


def label_tokens(cfg: Config, out: str) -> dict:
    """Label every split in ``cfg.teacher.splits`` into ``out``; returns a summary (the teacher's
    accuracy per split, and the layout under torchrun). Every rank returns the same summary."""
    from vitscale.distributed.fsdp import autocast_factory

    from .token_labeling_teacher import label_split

    t = cfg.teacher
    if cfg.data.format == "webdataset" and cfg.data.webdataset_mode == "stream":
        raise ValueError("label-tokens labels every image by its index: use data.webdataset_mode=index")
    run = teacher_run(cfg)
    teacher = run.model.eval()
    autocast = autocast_factory(run.device, run.precision.autocast)
    summary: dict = {"out": out, "splits": {}}
    for split in t.splits:
        loader = {"train": run.loaders.train, "val": run.loaders.val}.get(split)
        if loader is None:
            raise ValueError(f"the dataset has no {split!r} split")
        info = {"teacher": t.model or t.timm or cfg.model.name, "teacher_checkpoint": str(t.checkpoint),
                "teacher_img_size": list(run.img_size), "dataset": cfg.data.format}  # fmt: skip
        summary["splits"][split] = label_split(
            teacher, loader, out, split, topk=t.topk, info=info, device=run.device, autocast=autocast,
            group=run.dims.dp_group(), writes=run.dims.tp_rank == 0,
        )  # fmt: skip
    if run.dims.distributed:
        summary["layout"] = run.dims.describe()
    return summary


__all__ = ["label_tokens", "teacher_config", "teacher_run"]
