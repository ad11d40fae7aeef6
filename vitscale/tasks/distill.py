"""Online distillation: a teacher in the training process, and the losses that learn from it — the
component the distilling tasks call (classification: DeiT; contrastive: open_clip's
``--distill-model``), configured by the ``distill`` group (:mod:`.distill_config`).

**The teacher** is given like ``checkpoint.init_from`` (any source of
:mod:`vitscale.interop.pretrained`, any model family), built on the meta device and laid out as the
student (FSDP2 / TP of ``parallel.*``) or whole on every rank (``distill.teacher_layout``), its
weights read by rank 0 and broadcast (each rank keeps its shard). It runs in eval mode under
``torch.no_grad`` (no autograd graph, dropout off) with the student's autocast, on the batch's own
images after the student's mixup / cutmix (DeiT's teacher sees the mixed images too), resized to its
input size and re-normalised from ``data.mean`` / ``data.std`` to its own (one affine map per
channel, on the device). The data pipeline is untouched.

**Classification** (DeiT, Touvron et al. 2021, arXiv 2012.12877, section 4; facebookresearch/deit,
``losses.py``): loss = (1 - alpha) x the task's loss on the class logits + alpha x the distillation
loss on the distillation token's logits (a ViT with ``distill_token``; otherwise the class logits):
``hard`` = cross-entropy to the teacher's argmax; ``soft`` = ``KL(softmax(t / tau) || softmax(s /
tau)) x tau^2``, summed and divided by the number of logits (DeiT's ``reduction='sum' / numel``).

**Contrastive** (open_clip ``DistillClipLoss``, ``open_clip/loss.py``): loss = contrastive + weight x
the mean of the image->text and text->image cross-entropies of the student's logits to the teacher's
softmax, each scaled by its own ``logit_scale``, over the whole data-parallel batch (this rank's rows
against every rank's columns, features gathered as the contrastive loss does: the one-process
gradient on any number of ranks).

**Time.** The teacher's forward is timed (CUDA events on a GPU, read at log steps only; wall time on
the CPU) and its share of the step time is logged as ``teacher_time_pct``; MFU and TFLOP/s count the
student's FLOPs only, and the run says so.
"""

from __future__ import annotations

import contextlib
import math
import time
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from vitscale.errors import ConfigError, NonFiniteError, UserError

from .distill_config import DistillConfig


class StepTimer:
    """Seconds spent inside ``with timer():`` since the last :meth:`take` (CUDA events on a GPU: no
    host sync until :meth:`take`, which runs at log steps only)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.pending: list[tuple[Any, Any]] = []
        self.seconds = 0.0

    @contextlib.contextmanager
    def __call__(self):
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
            self.pending.append((start, end))
        else:
            t = time.perf_counter()
            yield
            self.seconds += time.perf_counter() - t

    def take(self) -> float:
        if self.pending:
            self.pending[-1][1].synchronize()
        total = self.seconds + sum(s.elapsed_time(e) / 1000.0 for s, e in self.pending)
        self.pending, self.seconds = [], 0.0
        return total


class Teacher:
    """A teacher model in inference (eval mode, ``no_grad``), with its input adapter and its timer."""

    def __init__(self, model: nn.Module, *, scale: torch.Tensor, shift: torch.Tensor, size: tuple[int, int] | None,
                 interpolation: str, autocast, device: torch.device, class_map: list[int] | None = None,
                 last_step: int = 0):  # fmt: skip
        self.model = model.eval()
        for p in model.parameters():
            p.requires_grad_(False)
        self.scale, self.shift = scale.view(1, -1, 1, 1).to(device), shift.view(1, -1, 1, 1).to(device)  # (1, C, 1, 1)
        self.size, self.interpolation, self.autocast = size, interpolation, autocast
        self.class_map = torch.tensor(class_map, device=device) if class_map is not None else None
        self.timer = StepTimer(device)
        self.watch = FiniteWatch(device, last_step=last_step)

    def images(self, x: torch.Tensor) -> torch.Tensor:
        """The student's normalised images ``(B, C, H, W)`` as the teacher takes them."""
        x = x * self.scale.to(x.dtype) + self.shift.to(x.dtype)  # x * s_std / t_std + (s_mean - t_mean) / t_std
        if self.size is not None and tuple(x.shape[-2:]) != self.size:
            x = F.interpolate(x, size=self.size, mode=self.interpolation, align_corners=False, antialias=True)
        return x

    def __call__(self, images: torch.Tensor, *args, **kwargs):
        with self.timer(), torch.no_grad(), self.autocast():
            return self.model(self.images(images), *args, **kwargs)

    def logits(self, images: torch.Tensor, step: int) -> torch.Tensor:
        """Classification logits ``(B, C)`` in the data's class order (``distill.class_map``), float32.
        Their finiteness is watched (:class:`FiniteWatch`): a teacher that emits NaN or infinity
        stops the run in one line naming the step."""
        self.watch.check()
        t = self(images).float()
        if self.class_map is not None:
            t = t[:, self.class_map]
        self.watch.record(torch.isfinite(t).all(), step)
        return t


class FiniteWatch:
    """A device flag read one call late, without making the host wait: each call copies its flag to
    the host asynchronously (pinned memory and an event on CUDA) and reads the previous call's,
    long done by then. A step whose teacher logits are not finite is also made non-finite itself
    (its loss NaN: :mod:`vitscale.train.nonfinite` does not apply it), so nothing is learnt from it; the
    next call stops the run with a :class:`~vitscale.errors.NonFiniteError` (exit
    code 1: the checkpoints written so far are kept, nothing more is saved or exported)."""

    def __init__(self, device: torch.device, what: str = "the teacher's logits",
                 fix: str = "distill.teacher_mean / teacher_std", last_step: int = 0):  # fmt: skip
        self.cuda = torch.device(device).type == "cuda"
        self.pending: tuple[torch.Tensor, Any, int] | None = None
        self.what, self.fix = what, fix  # the message's subject and the settings to look at
        # the run's last optimizer step (Run.total_steps; 0: unknown): no later call reads its flag, so it is
        # read at once (the host waits for it once), and a non-finite last step stops the run as any other
        self.last_step = last_step

    def record(self, ok: torch.Tensor, step: int) -> None:
        host = torch.empty((), dtype=torch.bool, pin_memory=self.cuda)
        host.copy_(ok, non_blocking=self.cuda)
        event = None
        if self.cuda:
            event = torch.cuda.Event()
            event.record()
        self.pending = (host, event, step)
        if self.last_step and step >= self.last_step:
            self.check()

    def failed_step(self) -> int | None:
        """The step of the previous call if its flag was false, else None (also with no call pending)."""
        if self.pending is None:
            return None
        host, event, step = self.pending
        self.pending = None
        if event is not None:
            event.synchronize()
        return None if bool(host) else step

    def check(self) -> None:
        """The non-finite guard's stop (vitscale.train.nonfinite's error: exit 1, the checkpoints kept) when the
        last step's outputs were not finite."""
        step = self.failed_step()
        if step is not None:
            raise NonFiniteError(f"distill: {self.what} at step {step} are not finite (NaN or infinity): its weights "
                                 f"or its normalisation ({self.fix}) cannot be right; the run stopped (nothing was "
                                 "learnt from that step: it was not applied)")  # fmt: skip


class Distillation:
    """What a distilling task calls: ``classification_loss`` (DeiT) or ``clip_loss`` (open_clip)."""

    def __init__(self, teacher: Teacher, dc: DistillConfig, lines: list[str]):
        self.teacher, self.cfg, self.lines = teacher, dc, lines

    # ------------------------------------------------------------------ classification (DeiT)
    def classification_loss(self, model: nn.Module, images: torch.Tensor, target: torch.Tensor, labels: torch.Tensor,
                            base_loss, autocast, step: int = 0) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:  # fmt: skip
        """``(1 - alpha) base_loss(class logits, target) + alpha KD(distillation logits, teacher)``;
        ``step`` (the optimizer step) names the step whose teacher logits were not finite."""
        dc = self.cfg
        with autocast():
            if model.distill_head:  # DeiT's distillation token: its own head learns from the teacher
                cls, dst = model(images, distill=True)
            else:
                cls = dst = model(images)
        t = self.teacher.logits(images, step)
        cls, dst = cls.float(), dst.float()
        base = base_loss(cls, target)
        if dc.kind == "soft":
            T = dc.tau
            kd = F.kl_div(F.log_softmax(dst / T, dim=-1), F.log_softmax(t / T, dim=-1), reduction="sum", log_target=True)
            kd = kd * (T * T) / dst.numel()
        else:
            kd = F.cross_entropy(dst, t.argmax(dim=-1))
        loss = (1 - dc.alpha) * base + dc.alpha * kd
        loss = torch.where(torch.isfinite(t).all(), loss, torch.nan)  # argmax of NaN is a class: learn nothing
        metrics = {"train_distill_loss": kd.detach()}
        if target.ndim == 1:
            logits = ((cls + dst) / 2).detach()  # what evaluation scores (the heads' mean)
            metrics["train_top1"] = (logits.argmax(-1) == labels).float().mean() * 100
            metrics["train_teacher_top1"] = (t.argmax(-1) == labels).float().mean() * 100
        return loss, metrics

    # ------------------------------------------------------------------ contrastive (open_clip)
    def clip_loss(self, out: dict, images: torch.Tensor, tokens: torch.Tensor, group=None) -> torch.Tensor:
        """open_clip's distillation term: the student's image-text logits against the teacher's
        softmax, image->text and text->image, over this rank's rows and every rank's columns."""
        from .contrastive_loss import gather_features

        t = self.teacher(images, _fit_tokens(tokens, self.teacher.model), output_dict=True)
        img, txt, scale = out["image_features"].float(), out["text_features"].float(), out["logit_scale"].float()
        t_img, t_txt, t_scale = t["image_features"].float(), t["text_features"].float(), t["logit_scale"].float()
        all_img, all_txt = gather_features(img, group, True), gather_features(txt, group, True)  # (W*B, E)
        t_all_img, t_all_txt = gather_features(t_img, group, False), gather_features(t_txt, group, False)
        i2t = _soft_ce(t_scale * t_img @ t_all_txt.t(), scale * img @ all_txt.t())  # (B, W*B) logits
        t2i = _soft_ce(t_scale * t_txt @ t_all_img.t(), scale * txt @ all_img.t())
        return (i2t + t2i) / 2

    def step_times(self) -> dict[str, float]:
        return {"teacher": self.teacher.timer.take()}


def _soft_ce(teacher_logits: torch.Tensor, student_logits: torch.Tensor) -> torch.Tensor:
    """``-sum softmax(teacher) log_softmax(student)`` per row, averaged (open_clip ``dist_loss``)."""
    return -(teacher_logits.softmax(dim=1) * student_logits.log_softmax(dim=1)).sum(dim=1).mean()


def _fit_tokens(tokens: torch.Tensor, model: nn.Module) -> torch.Tensor:
    """Caption tokens cut to the teacher's text context (its ``example_inputs`` say how long), the last
    kept token becoming the end-of-text token (the highest id) where a caption was longer."""
    context = model.example_inputs(1, "meta")[1].shape[1]
    if tokens.shape[1] <= context:
        return tokens
    cut = tokens[:, :context].clone()
    longer = tokens.argmax(dim=-1) >= context
    cut[:, -1] = torch.where(longer, tokens.max(dim=-1).values, cut[:, -1])
    return cut


# ---------------------------------------------------------------------------------- building
def build(run, dc: DistillConfig, autocast, *, classes: bool) -> Distillation:
    """The teacher of ``distill.teacher`` for ``run`` (its layout, device, data settings) and the lines
    the run prints about it. ``classes``: the teacher's classifier must predict the data's classes."""
    import dataclasses

    import torch.distributed as dist

    from vitscale.config.ranges import MAX_IMAGE_SIDE
    from vitscale.distributed.init import init_weights
    from vitscale.distributed.parallel_dims import ParallelDims
    from vitscale.distributed.parallelize import parallelize
    from vitscale.interop.pretrained import file_classes, load_pretrained, read_source, to_vitscale
    from vitscale.models.registry import get_family, resolve_model

    where = f"distill.teacher={dc.teacher}"
    family = get_family(dc.teacher_model) if dc.teacher_model else run.family
    # rank 0 reads the source once to name the teacher's model, preprocessing and class count (the
    # weights themselves are read again, by rank 0, when loaded)
    info, err, src = None, None, None
    if run.dims.is_main:
        try:
            src = read_source(dc.teacher, family, dc.teacher_format, weights=dc.teacher_weights, setting="distill.teacher",
                              format_key="distill.teacher_format")  # fmt: skip
            name = dc.teacher_model or src.model
            if name is None:
                raise ConfigError(f"{where}: its weights do not name their model: set distill.teacher_model (a variant "
                                  "of `vitscale models`) and distill.teacher_overrides")  # fmt: skip
            if dc.teacher_overrides and not dc.teacher_model:
                raise ConfigError("distill.teacher_overrides change the variant named by distill.teacher_model: set it "
                                  f"too (the weights name {name}), or leave the overrides out")  # fmt: skip
            overrides = dict(dc.teacher_overrides) if dc.teacher_model else dict(src.overrides)
            key = "distill.teacher_overrides" if dc.teacher_model else f"{where}: its stored model overrides"
            try:  # a misspelt field: one line naming the key (and the closest field)
                teacher = resolve_model(name, **overrides)
            except (TypeError, ValueError) as e:
                raise ConfigError(f"{key}: {e}") from None
            if "num_classes" in teacher.fields and "num_classes" not in overrides:
                n = file_classes(teacher.family, to_vitscale(src, teacher.family, teacher.cfg, where))
                if n is not None:
                    overrides["num_classes"] = n
            info = (name, overrides, dict(src.preprocess), src.format, str(src.path), src.label_names)
        except Exception as e:  # every rank must hear of it
            err = e
    if run.dims.distributed:
        box = [info if err is None else str(err)]
        dist.broadcast_object_list(box, src=0)
        if err is None and isinstance(box[0], str):
            raise UserError(box[0])
        info = box[0]
    if err is not None:
        raise err
    name, overrides, pre, fmt, path, teacher_names = info
    sides = (dc.teacher_img_size,) if dc.teacher_img_size else tuple(pre.get("img_size") or (None,))
    for v in sides:  # a source's 20000x20000 or -32 would fail allocating, or deep in a resize
        if v is not None and not 1 <= v <= MAX_IMAGE_SIDE:
            said = "distill.teacher_img_size" if dc.teacher_img_size else "the teacher's source"
            raise ConfigError(f"{where}: teacher image size {'x'.join(map(str, sides))} ({said}) is not usable: use "
                              f"1 to {MAX_IMAGE_SIDE} pixels a side (set distill.teacher_img_size)")  # fmt: skip
    side = sides[0]
    teacher = resolve_model(name, **overrides)  # every rank: rank 0 sent the name and overrides
    base = teacher.cfg
    if side and {"img_h", "img_w"} <= teacher.fields:
        try:  # a side that is no multiple of its patch size: one line naming the setting, not a ValueError
            teacher = teacher.with_overrides({**overrides, "img_h": side, "img_w": side})
        except (TypeError, ValueError) as e:
            said = "distill.teacher_img_size" if dc.teacher_img_size else "the teacher's source"
            raise ConfigError(f"{where}: its model {name} cannot take {side}x{side} images ({said}): {e} (give a "
                              "multiple of its patch size)") from None  # fmt: skip
    size = (side, side) if side else (base.img_h, base.img_w)

    model = teacher.create(device="meta")
    class_map = (_class_map(dc, where, name, model.num_classes, teacher_names, run.class_names, run.num_classes)
                 if classes else None)  # fmt: skip
    n_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    layout = dc.teacher_layout
    if layout == "auto":
        layout = "replicated" if n_bytes <= dc.replicate_max_mb * 2**20 or not run.dims.distributed else "sharded"
    dims = run.dims if layout == "sharded" and run.dims.distributed else ParallelDims(device=run.device)
    no_fp8 = dataclasses.replace(run.cfg.precision, fp8="none", residual="fp32", mlp_epilogue="none")  # any family
    no_ac = dataclasses.replace(run.cfg.parallel, activation_checkpointing="none")
    parallelize(model, teacher.family.plan(), dims, no_ac, no_fp8, bool(run.cfg.train.compile), run.cfg.train.compile_mode,
                run.cfg.train.compile_backend)  # fmt: skip
    model.to_empty(device=run.device)
    init_weights(model, dims, 0, None, "sharded")  # non-persistent buffers; every weight is then loaded
    _, loaded, _ = load_pretrained(model, dc.teacher, fmt, setting="distill.teacher", format_key="distill.teacher_format",
                                label=name, weights=dc.teacher_weights, from_rank0=True, complete=True, source=src)  # fmt: skip
    mean, std, said = _normalisation(dc, pre, run.cfg.data)
    mean, std = _channels(mean, base), _channels(std, base)
    _check_normalisation(mean, std, said, where)
    s_mean, s_std = _channels(run.cfg.data.mean, base), _channels(run.cfg.data.std, base)
    scale = torch.tensor(s_std) / torch.tensor(std)
    shift = (torch.tensor(s_mean) - torch.tensor(mean)) / torch.tensor(std)
    interp = dc.teacher_interpolation or (pre.get("interpolation") if pre.get("interpolation") in ("bilinear", "bicubic") else "bicubic")
    teacher = Teacher(model, scale=scale, shift=shift, size=size, interpolation=interp, autocast=autocast, device=run.device,
                      class_map=class_map, last_step=run.total_steps)  # fmt: skip
    n_params = sum(p.numel() for p in model.parameters())
    lines = [*loaded, f"distill: teacher {name} ({n_params / 1e6:.2f}M params, {layout}) at {size[0]}x{size[1]}, "
             f"mean {_fmt(mean)} std {_fmt(std)} ({said}), eval mode without gradients",
             "distill: TFLOP/s and MFU count the student's FLOPs only (the teacher's forward is not counted); "
             "teacher_time_pct is its share of the step time"]  # fmt: skip
    return Distillation(teacher, dc, lines)


def _channels(values, cfg) -> list[float]:
    """Per-channel statistics for a model of ``cfg`` (a 1-channel model given RGB ones: their mean, as
    the loader does)."""
    values = [float(v) for v in values]
    if len(values) == 3 and cfg.num_channels == 1:
        values = [sum(values) / 3]
    return values


def _check_normalisation(mean: list[float], std: list[float], said: str, where: str) -> None:
    """A teacher's mean / std that cannot be right (a zero or negative std, infinity, NaN) would feed it
    infinite or NaN images: its logits NaN, their argmax one class. Refused in one line."""
    if not all(math.isfinite(v) for v in (*mean, *std)) or min(std) <= 0:
        raise ConfigError(f"{where}: the teacher's normalisation mean {list(mean)} std {list(std)} ({said}) must be "
                          "finite with every std > 0: set distill.teacher_mean / distill.teacher_std")  # fmt: skip


def _class_map(dc: DistillConfig, where: str, name: str, n_teacher: int, teacher_names: list[str] | None,
               data_names: list[str], n_data: int) -> list[int] | None:
    """The teacher's class of each data class (None: the same order). Compared by name when both the
    teacher's source and the data name their classes: another order is refused unless
    ``distill.class_map`` gives it (the count alone let a permuted teacher teach the wrong classes)."""
    if dc.class_map is not None:
        cm = list(dc.class_map)
        if len(cm) != n_data or not all(isinstance(i, int) and 0 <= i < n_teacher for i in cm):
            raise ConfigError(f"distill.class_map: give the teacher's class index (0 to {n_teacher - 1}) of each of the "
                              f"data's {n_data} classes, in the data's order; got {len(cm)} entries")  # fmt: skip
        if len(set(cm)) != len(cm):  # two data classes taught by one teacher class (all zeros: every class as class 0)
            twice = next(i for i in cm if cm.count(i) > 1)
            raise ConfigError(f"distill.class_map names the teacher's class {twice} for {cm.count(twice)} data classes: "
                              "each data class needs a teacher class of its own")  # fmt: skip
        data_n, teacher_n = _named(data_names), _named(teacher_names)
        if teacher_n and len(data_n) == n_data and len(teacher_n) == n_teacher:  # both named: the map must agree
            bad = next((i for i, t in enumerate(cm) if teacher_n[t] != data_n[i]), None)
            if bad is not None:
                raise ConfigError(f"distill.class_map maps data class {bad} ({data_n[bad]!r}) to the teacher's class "
                                  f"{cm[bad]} ({teacher_n[cm[bad]]!r}): the names contradict the map; give the "
                                  "teacher's index of the class of the same name")  # fmt: skip
        return cm
    if n_teacher != n_data:
        raise ConfigError(f"{where}: the teacher ({name}) predicts {n_teacher} classes, the data has {n_data}: a "
                          "classification teacher must predict the data's classes, in its order (or set "
                          "distill.class_map)")  # fmt: skip
    data_names, teacher_names = _named(data_names), _named(teacher_names)
    if not teacher_names or len(data_names) != n_data or teacher_names == data_names:
        return None
    where_t = {n: i for i, n in enumerate(teacher_names)}
    first = next(i for i, (a, b) in enumerate(zip(teacher_names, data_names)) if a != b) if len(teacher_names) == n_data else 0
    hint = (f"; by name it is distill.class_map=[{','.join(str(where_t[n]) for n in data_names)}]"
            if sorted(teacher_names) == sorted(data_names) and len(set(data_names)) == n_data else "")
    raise ConfigError(f"{where}: the teacher's classes are not the data's, by name (class {first}: teacher "
                      f"{teacher_names[first]!r}, data {data_names[first]!r}): set distill.class_map (the teacher's "
                      f"index of each data class){hint}")  # fmt: skip


def _named(names: list[str] | None) -> list[str]:
    """Class names that name something: not none, and not the numbers a source without names counts with."""
    names = list(names or [])
    return [] if names == [str(i) for i in range(len(names))] else names


def _normalisation(dc: DistillConfig, pre: dict, data) -> tuple[list[float], list[float], str]:
    """The teacher's mean / std and where they came from: the config, the source, else the student's data."""
    if dc.teacher_mean is not None and dc.teacher_std is not None:
        return list(dc.teacher_mean), list(dc.teacher_std), "distill.teacher_mean / teacher_std"
    if "mean" in pre and "std" in pre:
        return list(pre["mean"]), list(pre["std"]), "from the teacher's source"
    return list(data.mean), list(data.std), "data.mean / data.std: the source does not say; set distill.teacher_mean / teacher_std"


def _fmt(v) -> str:
    return "[" + ", ".join(f"{x:.3g}" for x in v) + "]"


__all__ = ["Distillation", "StepTimer", "Teacher", "build"]
