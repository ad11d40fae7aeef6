"""The training step never reads a device value on the host (issue 6: "no host synchronisation
inside the step; loss read back only at log steps").

CI has no GPU, so the step runs on the ``meta`` device instead: a meta tensor has no data, so
everything that would make the host wait for a GPU — ``.item()``, ``int()`` / ``bool()`` of a
tensor, ``.cpu()`` / ``.numpy()`` of a device tensor, reading with a boolean mask (``x[mask]``,
``nonzero``) — raises there. (Writing through a mask, ``x[mask] = v``, does not raise on meta
although it syncs on CUDA; the code uses ``torch.where`` / ``masked_fill`` for that.) Host-side work (the data loader, the optimizer's CPU step counters, token labels read from a
memory map by the host copy of the indices) is allowed, exactly as on CUDA. One read is by design:
with a non-fused optimizer (``optim.fused=foreach|none``, which the meta runs use) the trainer reads
the step's finite flag to skip a non-finite step (``vitscale/train/nonfinite.py``); the meta runs
let exactly that read through, one per step. The fused optimizers a run builds by default (CUDA, and
the CPU since torch 2.4) skip a non-finite step on the device through ``found_inf``:
``test_fused_step_reads_nothing_back`` shows that step reads nothing. ``test_a_real_run_reads_nothing_back_between_log_steps``
runs the whole loop of a real run on the CPU and finds no read between log steps. A blocking copy from
the host to the device also waits for the GPU (PyTorch synchronises the stream after it), so the
steps also run under a dispatch mode that records every host-to-device copy made without
``non_blocking=True`` — the loader's own move to the device and normalisation included.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from vitscale.config import load_config
from vitscale.train.trainer import Trainer

FAST = ["data.num_workers=0", "log.flops=false", "checkpoint.every=0", "eval.every=0", "log.progress=none",
        "log.report=false"]  # fmt: skip


class _BlockingCopies(TorchDispatchMode):
    """Records host-to-device copies that would block: a ``.to(device)`` / ``copy_`` from the CPU
    without ``non_blocking=True`` synchronises the CUDA stream (as ``torch.tensor(data,
    device=...)`` does, seen here as ``lift_fresh`` of a device tensor)."""

    def __init__(self):
        super().__init__()
        self.found: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = str(func)
        if func is torch.ops.aten._to_copy.default:
            dev = kwargs.get("device")
            if args[0].device.type == "cpu" and dev is not None and torch.device(dev).type == "meta":
                if not kwargs.get("non_blocking", False):
                    self.found.append(f"{name} {tuple(args[0].shape)}")
        elif func is torch.ops.aten.copy_.default:
            nb = args[2] if len(args) > 2 else kwargs.get("non_blocking", False)
            if args[0].device.type == "meta" and args[1].device.type == "cpu" and args[1].dim() > 0 and not nb:
                self.found.append(f"{name} {tuple(args[1].shape)}")
        elif func is torch.ops.aten.lift_fresh.default and args[0].device.type == "meta":
            self.found.append(f"{name} (torch.tensor(..., device=...)) {tuple(args[0].shape)}")
        return func(*args, **kwargs)


class _ScalarReads(TorchDispatchMode):
    """Records every read by the host of the value of a tensor on ``device`` (``bool()``, ``.item()``);
    a meta tensor's read is answered True (the finite flag of a healthy step) so the step goes on."""

    def __init__(self, device: str = "meta"):
        super().__init__()
        self.device = device
        self.found: list[tuple[str, tuple]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.is_nonzero.default):
            if args[0].device.type == self.device:
                self.found.append((str(func), tuple(args[0].shape)))
            if args[0].device.type == "meta":
                return True
        return func(*args, **(kwargs or {}))


def _trainer_on_meta(config: str, overrides: list[str], tmp_path) -> Trainer:
    """A trainer built on the CPU, then moved to the meta device: model, EMA, task, and the loader,
    which now moves each batch there itself (and keeps its host copy, as on a GPU)."""
    # foreach optimizers: a fused kernel need not have a meta implementation in every torch
    cfg = load_config(config, [*FAST, f"train.output_dir={tmp_path / 'run'}", "train.device=cpu", "optim.fused=foreach", *overrides])
    t = Trainer(cfg)
    meta = torch.device("meta")
    t.module.to(meta)  # the model and the task's parts: the same Parameter objects, the optimizer still holds them
    if t.ema is not None:
        t.ema.module.to(meta)
    t.device = t.task.device = t.loaders.train.device = meta
    t.guard.to(meta)
    if getattr(t.task, "_caption_tokens", None) is not None:
        t.task._caption_tokens = t.task._caption_tokens.to(meta)
    return t


def _run_steps(t: Trainer, steps: int = 2) -> tuple[torch.Tensor, dict, torch.Tensor]:
    """One warm-up step (first-use caches), then ``steps`` steps, loading included, in which no
    blocking host-to-device copy may happen."""
    batches = t._batches()
    t.step += 1
    with _ScalarReads():
        t.train_step(batches)
    with _BlockingCopies() as mode, _ScalarReads() as reads:
        for _ in range(steps):  # the later steps run the optimizer with state from the first
            t.step += 1
            out = t.train_step(batches)
    assert not mode.found, f"blocking host-to-device copies inside the step: {mode.found}"
    assert not t.skip_on_device and reads.found == [("aten._local_scalar_dense.default", ())] * steps, reads.found
    return out


@pytest.mark.parametrize(
    "config, overrides",
    [
        # softmax CE + mixup/cutmix + EMA + clipping + 2 micro-batches + stochastic depth + patch dropout + erasing
        ("digits_vit", ["model.num_layers=1", "train.batch_size=8", "train.grad_accum=2", "train.ema_decay=0.9",
                        "train.grad_clip=1.0", "data.mixup_alpha=0.8", "data.cutmix_alpha=1.0",
                        "model.drop_path_rate=0.1", "model.drop_patch_rate=0.25", "data.random_erasing=1.0"]),
        # sigmoid CE (ViT-22B's loss) on the parallel block with QK norm, label smoothing
        ("digits_vit", ["model.num_layers=1", "train.batch_size=8", "train.loss=sigmoid", "train.label_smoothing=0.1",
                        "model.parallel_block=true", "model.qk_norm=true"]),
        # CLIP InfoNCE with templated captions; SGD
        ("digits_clip", ["train.batch_size=8", "optim.name=sgd"]),
        # SigLIP
        ("digits_clip", ["train.batch_size=8", "train.loss=sigmoid"]),
        # MAE: keyed masks drawn on the host, the encoder on the visible patches, the decoder, 2 micro-batches
        ("digits_mae", ["model.num_layers=1", "train.batch_size=8", "train.grad_accum=2", "mae.decoder_depth=1",
                        "mae.decoder_width=16", "mae.decoder_heads=2"]),
        # DINO: keyed crops and masks drawn on the host, the teacher's update, Sinkhorn-Knopp, iBOT, KoLeo
        ("digits_dino", ["model.num_layers=1", "train.batch_size=8", "train.grad_accum=2", "dino.local_crops_number=1",
                         "dino.head_n_prototypes=32", "dino.head_hidden_dim=32", "dino.head_bottleneck_dim=16"]),
    ],
)  # fmt: skip
def test_train_step_reads_nothing_back(config, overrides, tmp_path):
    t = _trainer_on_meta(config, overrides, tmp_path)
    loss, metrics, grad_norm = _run_steps(t)
    assert loss.device.type == "meta" and grad_norm.device.type == "meta"
    assert all(v.device.type == "meta" for v in metrics.values())
    assert all(p.device.type == "meta" for p in t.model.parameters())


def test_token_labeling_step_reads_nothing_back(tmp_path):
    from vitscale.data.token_labels import TokenLabelWriter

    n, grid, classes = 1497, (4, 4), 10  # the digits train split; a VOLO debug student on 32 px
    g = torch.Generator().manual_seed(0)
    w = TokenLabelWriter(tmp_path / "labels", "train", n, grid, 3, classes)
    w.write(torch.arange(n), torch.rand(n, *grid, classes, generator=g).softmax(-1),
            torch.rand(n, classes, generator=g).softmax(-1))  # fmt: skip
    w.close()
    variants = (("ground_truth", []), ("teacher", []),
                ("crop", ["token_label.ground_truth_mix=true", "token_label.reference_box=true"]))  # fmt: skip
    for n, (cls_target, more) in enumerate(variants):
        t = _trainer_on_meta(
            "digits_volo",
            ["model.layers=[1,1]", "train.batch_size=8", f"token_label.path={tmp_path / 'labels'}",
             "token_label.mix_token_prob=1.0", f"token_label.cls_target={cls_target}", *more],  # fmt: skip
            tmp_path / f"run{n}",
        )
        loss, metrics, _ = _run_steps(t)
        assert loss.device.type == "meta" and "train_token_loss" in metrics


def test_meta_device_catches_a_host_read():
    """The premise of the tests above: reading a meta tensor on the host fails loudly."""
    x = torch.ones(3, device="meta")
    for read in (lambda: x.sum().item(), lambda: x.cpu(), lambda: bool(x.any()), lambda: x[x > 0]):
        with pytest.raises((RuntimeError, NotImplementedError)):
            read()


def test_clip_caption_cut_reads_nothing_back(tmp_path):
    """Captions longer than the text tower's context are cut on the device (the shard path), with
    ``torch.where`` rather than a masked write (which would sync on CUDA, though not on meta)."""
    t = _trainer_on_meta("digits_clip", ["train.batch_size=8"], tmp_path)
    L = t.cfg.clip.context_length
    host = t.task.tokenizer(["a photo of the digit seven " * 8, "seven"], context_length=3 * L)
    cut = t.task.fit_context(host.to("meta"))
    assert cut.shape == (2, L) and cut.device.type == "meta"
    ref = t.task.fit_context(host)  # the same code on real values: the long row ends in end-of-text
    assert ref[0, -1] == t.task.tokenizer.eot_token_id and torch.equal(ref[1], host[1, :L])


def test_fused_step_reads_nothing_back(tmp_path):
    """With a fused optimizer (what ``optim.fused=auto`` picks on a GPU) a non-finite step is skipped on
    the device (``found_inf``): the step reads no value back. Fused kernels do not run on the meta
    device, so this runs on the CPU (which has them) and counts the host's reads of tensor values."""
    cfg = load_config("digits_vit", [*FAST, f"train.output_dir={tmp_path / 'run'}", "train.device=cpu",
                                     "model.num_layers=1", "train.batch_size=8", "train.ema_decay=0.9",
                                     "optim.fused=fused"])  # fmt: skip
    t = Trainer(cfg)
    loader = t._batches()
    t.step += 1
    t.train_step(loader)
    batches = iter([next(loader), next(loader)])  # loaded first: the loader reads host data on the host
    with _ScalarReads("cpu") as reads:
        for _ in range(2):
            t.step += 1
            t.train_step(batches)
    assert t.skip_on_device and reads.found == []
    t.close()


class _HostReadsByStep(TorchDispatchMode):
    """Every read of a tensor's value by the host during a real run on the CPU, keyed by the trainer's
    step: ``.item()`` / ``int()`` / ``float()`` / ``bool()`` (``aten._local_scalar_dense``,
    ``aten.is_nonzero``), ``torch.equal``, and ``.tolist()`` / ``.numpy()`` (which do not pass the
    dispatcher on a CPU tensor: counted by :func:`_count_python_reads`). The loader's own host work —
    decoding, augmenting, reading its host tensors — is not counted: on a GPU those tensors are host
    tensors (the loader's device work is covered by the meta-device tests above)."""

    READS = (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.is_nonzero.default, torch.ops.aten.equal.default)

    def __init__(self, trainer: Trainer):
        super().__init__()
        self.trainer, self.loading, self.found = trainer, False, []

    def note(self, what: str) -> None:
        if not self.loading:
            self.found.append((self.trainer.step, what))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in self.READS:
            self.note(str(func))
        return func(*args, **(kwargs or {}))


def _count_python_reads(monkeypatch, mode: _HostReadsByStep) -> None:
    for name in ("tolist", "numpy"):
        original = getattr(torch.Tensor, name)

        def read(self, *a, _original=original, _name=name, **kw):
            mode.note(f"Tensor.{_name}")
            return _original(self, *a, **kw)

        monkeypatch.setattr(torch.Tensor, name, read)


@pytest.mark.parametrize(
    "config, overrides",
    [
        # the defaults of a CPU run (fused AdamW: a non-finite step skipped on the device), with EMA,
        # clipping, 2 micro-batches, mixup / cutmix and random erasing
        ("digits_vit", ["model.num_layers=1", "train.batch_size=8", "train.grad_accum=2", "train.ema_decay=0.9",
                        "data.mixup_alpha=0.8", "data.cutmix_alpha=1.0", "data.random_erasing=0.5"]),
        # CLIP's InfoNCE with templated captions and its logit scale
        ("digits_clip", ["train.batch_size=8"]),
    ],
)  # fmt: skip
def test_a_real_run_reads_nothing_back_between_log_steps(config, overrides, tmp_path, monkeypatch):
    """The whole loop of ``Trainer.fit`` on the CPU, 9 steps logging at 1, 4, 8 and 9 (and evaluating
    at the end): no value is read back by the host in steps 2, 3, 5, 6 and 7 — not the loss, the
    metrics, the gradient norm nor the non-finite flag — while the log steps do read them."""
    cfg = load_config(config, [*FAST, f"train.output_dir={tmp_path / 'run'}", "train.device=cpu", "train.max_steps=9",
                               "train.log_every=4", *overrides])  # fmt: skip
    t = Trainer(cfg)
    assert t.skip_on_device  # the CPU default: fused kernels, found_inf
    mode = _HostReadsByStep(t)
    batches = t._batches

    def loading():
        it = batches()
        while True:
            mode.loading = True
            try:
                batch = next(it)
            finally:
                mode.loading = False
            yield batch

    monkeypatch.setattr(t, "_batches", loading)
    _count_python_reads(monkeypatch, mode)
    with mode:
        summary = t.fit()
    assert summary["steps"] == 9
    steps = {step for step, _ in mode.found}
    assert steps - {1, 4, 8, 9} == set(), [r for r in mode.found if r[0] not in (1, 4, 8, 9)]
    assert {4, 8} <= steps  # the log steps read the record (the mode sees the reads it must see)
