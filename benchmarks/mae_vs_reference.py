"""``digits_mae`` against facebookresearch/mae's own model: the same shape, data, steps, images, seed and
evaluation, several seeds.

The reference is MAE's ``models_mae.py`` (``MaskedAutoencoderViT``) read from a source checkout given
with ``--mae-src`` (github.com/facebookresearch/mae; its ``util/pos_embed.py`` beside it); nothing of
MAE's is copied here and no MAE code ships in the package. Two adaptations let that 2021 file run on
today's libraries, neither touching what it computes: ``numpy.float`` (removed in numpy 1.24, read by
``util/pos_embed.py``) is set to ``float``, and timm's ``Block`` is called without ``qk_scale`` (an
argument timm dropped; MAE passes ``None``, the default scaling).

Per seed:

- **vitscale**: ``vitscale train digits_mae train.seed=SEED`` as a user types it (a subprocess), in a
  temporary folder;
- **reference**: ``MaskedAutoencoderViT`` of the recipe's shape (image 32, patch 4, width 96, 4 blocks of
  4 heads, MLP ratio 2 — MAE's decoder blocks take the encoder's, as the recipe's
  ``mae.decoder_mlp_ratio`` — decoder 2 x 64 with 4 heads, LayerNorm eps 1e-6, ``norm_pix_loss``),
  seeded as MAE's ``main_pretrain.py`` seeds (``torch.manual_seed(seed)``, ``np.random.seed(seed)``),
  its own initialisation and masking, AdamW over MAE's parameter groups (timm's
  ``param_groups_weight_decay``, which ``main_pretrain.py`` line 179 calls as ``add_weight_decay``) with
  the recipe's betas and weight decay, trained on **the batches of vitscale's own training loader** for
  that run (the same images, crops and order: ``vitscale.run.assemble`` of the same config) for the
  same steps, at the learning rate vitscale's schedule gives each step (``Schedule.build`` of the run's ``schedule``), on the
  recipe's thread count;
- **reference without its final LayerNorm**: the same with ``model.norm`` replaced by the identity
  before training (the decoder then reads the blocks' output, as vitscale's MAE did on a mean-pooled
  ViT before it read the tokens through ``fc_norm``);
- **reference from vitscale's initial encoder** (``--sides reference_vitscale_init``, an ablation): the
  reference with its encoder's initial weights replaced by those of the vitscale run of the same seed
  (the model ``vitscale.run.assemble`` builds for it, in timm's naming by vitscale's timm adapter; MAE's
  Xavier-uniform linear layers and N(0, 0.02) class token become vitscale's truncated normal 0.02 and
  N(0, 1e-6)), its decoder still MAE's.

Every encoder is then evaluated by ``vitscale eval`` (in this process: ``vitscale.cli.main``) with the
vitscale run's own ``config.yaml`` — the MAE task's default evaluations, DINO's k-NN (k = 20, T = 0.07)
and the linear probe, on the same splits — from a vitscale ``.safetensors`` file of its encoder (the
reference's converted from timm's naming by vitscale's timm adapter; the classifier, which neither
evaluation reads, is the vitscale run's). Three read-outs of the encoder, each the same for every side:

- ``normed_of_mean``: the final LayerNorm of the mean patch token (``pool: avg`` with ``fc_norm``: how
  ``digits_mae`` pools, and the figures its run reports);
- ``mean_of_normed``: the mean of the patch tokens through the final LayerNorm (the decoder's input,
  averaged: ``model.overrides.fc_norm=false``);
- ``class_token``: the class token through the final LayerNorm (MAE's linear probe's default,
  ``main_linprobe.py`` line 73: ``global_pool=False``; ``model.overrides.pool=token``).

The reference without its final LayerNorm is read through a LayerNorm at its initialisation (weight 1,
bias 0), as vitscale's frozen ``fc_norm`` read the encoder before.

    git clone https://github.com/facebookresearch/mae /tmp/mae_src   # (efb2a80)
    nice -n 10 python benchmarks/mae_vs_reference.py --mae-src /tmp/mae_src --seeds 0 1 2 \\
        --json benchmarks/results/mae_vs_reference_cpu_202612.json \\
        2>&1 | tee benchmarks/results/mae_vs_reference_cpu_202612.log

Runs go one after another (each side on the recipe's one thread). The JSON holds per run the wall time
of its training (vitscale: process start to end, evaluations included; the reference: its training loop),
its last logged loss and every read-out's k-NN top-1 / top-5 and probe top-1; per side the mean and
spread over the seeds; and vitscale minus the reference per read-out.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.util
import io
import json
import os
import statistics
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from ssl_digits import QUIET, train  # noqa: E402  (the benchmarks' one `vitscale train` runner)

CONFIG = "digits_mae"
READOUTS = {  # name -> (model overrides of the evaluation, the key the final LayerNorm is loaded under)
    "normed_of_mean": ([], "fc_norm"),
    "mean_of_normed": (["model.overrides.fc_norm=false"], "norm"),
    "class_token": (["model.overrides.pool=token"], "norm"),
}
SIDES = ("vitscale", "reference", "reference_no_final_norm", "reference_vitscale_init")
DEFAULT_SIDES = SIDES[:3]


# ----------------------------------------------------------------------------- the reference's code
def load_reference(src: Path):
    """MAE's ``models_mae`` module from the checkout ``src`` (its ``util/pos_embed.py`` as ``util.pos_embed``),
    with the two adaptations of the module docstring."""
    import types

    import numpy as np
    from timm.models import vision_transformer as timm_vit

    if not hasattr(np, "float"):
        np.float = float  # util/pos_embed.py line 56 reads np.float (numpy < 1.24)

    def module(name: str, path: Path):
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
        return mod

    for need in ("models_mae.py", "util/pos_embed.py"):
        if not (src / need).is_file():
            raise SystemExit(f"--mae-src {src}: no {need} (a checkout of github.com/facebookresearch/mae)")
    sys.modules.setdefault("util", types.ModuleType("util"))
    sys.modules["util"].pos_embed = module("util.pos_embed", src / "util" / "pos_embed.py")
    mae = module("models_mae", src / "models_mae.py")

    def block(*args, qk_scale=None, **kwargs):  # timm >= 0.9 has no qk_scale; MAE passes None (the default)
        return timm_vit.Block(*args, **kwargs)

    mae.Block = block
    return mae


def reference_model(mae, cfg, final_norm: bool):
    """``MaskedAutoencoderViT`` of the run's shape (its model and ``mae`` group), built from the global RNG."""
    from torch import nn

    from vitscale.run.assemble import resolve_run_model

    m, mc = resolve_run_model(cfg).cfg, cfg.mae
    ratio = m.ffn_hidden_size / m.hidden_size
    if mc.decoder_mlp_ratio != ratio or m.img_h != m.img_w:
        raise SystemExit(f"MAE's model has one MLP ratio for encoder and decoder and square images: the config has "
                         f"{ratio} / {mc.decoder_mlp_ratio}, {m.img_h}x{m.img_w}")  # fmt: skip
    model = mae.MaskedAutoencoderViT(
        img_size=m.img_h, patch_size=m.patch_dim, in_chans=m.num_channels, embed_dim=m.hidden_size, depth=m.num_layers,
        num_heads=m.num_attention_heads, decoder_embed_dim=mc.decoder_width, decoder_depth=mc.decoder_depth,
        decoder_num_heads=mc.decoder_heads, mlp_ratio=ratio, norm_layer=partial(nn.LayerNorm, eps=m.norm_eps),
        norm_pix_loss=mc.norm_pix_loss,
    )  # fmt: skip
    if not final_norm:
        model.norm = nn.Identity()
    return model


def train_reference(mae, seed: int, final_norm: bool, work: Path, extra: list[str], vitscale_init: bool = False) -> dict:
    """MAE's model trained on vitscale's batches of ``digits_mae train.seed=SEED`` (module docstring; with
    ``vitscale_init`` its encoder starting from vitscale's initial weights). Returns its encoder's tensors
    in timm's naming, the vitscale model's (unread) classifier, its wall time and its losses."""
    import itertools

    import numpy as np
    import torch
    from timm.optim import param_groups_weight_decay

    from vitscale.config import load_config
    from vitscale.run import assemble
    from vitscale.train.optim import scaled_lr
    from vitscale.train.schedules import Schedule

    cfg = load_config(CONFIG, [*extra, f"train.seed={seed}", f"train.output_dir={work}", *QUIET])
    run = assemble(cfg, "train")  # the loaders of that run (and a vitscale model, unused)
    if run.claim is not None:
        run.claim.release()
    torch.set_num_threads(cfg.train.cpu_threads or torch.get_num_threads())
    torch.manual_seed(seed)  # main_pretrain.py lines 116-118
    np.random.seed(seed)
    model = reference_model(mae, cfg, final_norm).train()
    if vitscale_init:  # the encoder from the vitscale run's initial weights (timm's naming): the decoder stays MAE's
        from vitscale.interop import to_timm

        start = {("norm." + k[8:] if k.startswith("fc_norm.") else k): v for k, v in to_timm(run.model).items()
                 if not k.startswith("head.")}  # fmt: skip
        got = model.load_state_dict(start, strict=False)
        if got.unexpected_keys or not all(k.startswith(("decoder_", "mask_token")) for k in got.missing_keys):
            raise SystemExit(f"vitscale's encoder does not fit the reference's: {got}")
    peak = scaled_lr(cfg.optim, cfg.train.batch_size)
    groups = param_groups_weight_decay(model, cfg.optim.weight_decay)  # MAE's add_weight_decay (line 179)
    opt = torch.optim.AdamW(groups, lr=peak, betas=tuple(cfg.optim.betas))  # line 180
    for g in opt.param_groups:
        g["initial_lr"] = peak
    schedule = Schedule.build(cfg.schedule, optimizer=opt, peak_lr=peak, steps_per_epoch=run.steps_per_epoch,
                              total_steps=run.total_steps)
    batches = (b for _ in itertools.count() for b in run.loaders.train)
    losses, t0 = {}, time.perf_counter()
    for step in range(1, run.total_steps + 1):
        schedule.apply(step)
        loss, _, _ = model(next(batches)["image"], mask_ratio=cfg.mae.mask_ratio)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % cfg.train.log_every == 0 or step == run.total_steps:
            losses[step] = float(loss.detach())
    wall = time.perf_counter() - t0
    sd = {k: v.detach().clone() for k, v in model.state_dict().items() if not k.startswith(("decoder_", "mask_token"))}
    if not final_norm:  # read through a LayerNorm at its initialisation (module docstring)
        D = sd["cls_token"].shape[-1]
        sd["norm.weight"], sd["norm.bias"] = torch.ones(D), torch.zeros(D)
    head = {k: v.detach().clone() for k, v in run.model.state_dict().items() if k.startswith("head.")}
    return {"encoder_timm": sd, "head": head, "wall_s": wall, "losses": losses}


# ----------------------------------------------------------------------------- the evaluation
def encoder_files(encoder: dict, head: dict, out: Path) -> dict[str, Path]:
    """A vitscale ``.safetensors`` file per read-out: ``encoder`` (vitscale's naming, the final LayerNorm as
    ``final.*``) with that LayerNorm under the read-out's key, and ``head`` (never read)."""
    from safetensors.torch import save_file

    files = {}
    out.mkdir(parents=True, exist_ok=True)
    for name, (_, key) in READOUTS.items():
        sd = {(key + k[5:] if k.startswith("final.") else k): v.contiguous() for k, v in encoder.items()}
        files[name] = out / f"{name}.safetensors"
        save_file({**sd, **head}, files[name])
    return files


def evaluate(config: list[str], files: dict[str, Path], out: Path) -> dict:
    """``vitscale eval CONFIG checkpoint.path=FILE`` of each read-out (``config``: the vitscale run's
    ``config.yaml``, or the recipe's name and overrides): its k-NN and probe figures."""
    from vitscale.cli import main

    res = {}
    for name, path in files.items():
        dest = out / f"eval_{name}.json"
        with contextlib.redirect_stdout(io.StringIO()):
            rc = main(["eval", *config, f"checkpoint.path={path}", *READOUTS[name][0], "--output", str(dest)])
        if rc != 0:
            raise SystemExit(f"vitscale eval of {path} ({name}) failed: exit {rc}")
        got = json.loads(dest.read_text())
        res[name] = {k: got[k] for k in ("knn_top1", "knn_top5", "linear_probe_top1")}
    return res


def vitscale_side(seed: int, work: Path, extra: list[str]) -> tuple[dict, dict, dict]:
    """``vitscale train digits_mae train.seed=SEED``: its record, its encoder (``final.*``) and its head."""
    from safetensors.torch import load_file

    run = work / f"vitscale_{seed}"
    summary, rows, wall = train([CONFIG, *extra, f"train.seed={seed}"], run)
    sd = load_file(run / "model.safetensors")
    head = {k: v for k, v in sd.items() if k.startswith("head.")}
    encoder = {("final." + k[8:] if k.startswith("fc_norm.") else k): v for k, v in sd.items() if not k.startswith("head.")}
    record = {"seed": seed, "wall_s": wall, "last_loss": [r["loss"] for r in rows if "loss" in r][-1],
              "run_summary": {k: summary[k] for k in ("knn_top1", "knn_top5", "linear_probe_top1")}}  # fmt: skip
    return record, encoder, head


def reference_side(mae, seed: int, final_norm: bool, work: Path, extra: list[str], vitscale_init: bool = False
                   ) -> tuple[dict, dict, dict]:  # fmt: skip
    """The reference trained (``final_norm``: with its final LayerNorm; ``vitscale_init``: from vitscale's
    initial encoder): its record, its encoder (``final.*``, checked to hold the tensors of vitscale's
    model of the recipe, of the same shapes) and the vitscale model's classifier."""
    import torch

    from vitscale.config import load_config
    from vitscale.models.vit.state_dict_adapter import state_dict_from_timm
    from vitscale.run.assemble import resolve_run_model

    got = train_reference(mae, seed, final_norm, work / f"reference_data_{seed}_{int(final_norm)}_{int(vitscale_init)}",
                          extra, vitscale_init)  # fmt: skip
    resolved = resolve_run_model(load_config(CONFIG, extra))
    sd = state_dict_from_timm(got["encoder_timm"], resolved.cfg)  # vitscale's timm adapter: qkv rows per head
    encoder = {("final." + k[5:] if k.startswith("norm.") else k): v for k, v in sd.items()}
    with torch.device("meta"):  # the recipe's vitscale model, shapes only
        like = {("final." + k[8:] if k.startswith("fc_norm.") else k): v
                for k, v in resolved.create().state_dict().items() if not k.startswith("head.")}  # fmt: skip
    differ = sorted(k for k in encoder.keys() | like.keys() if k not in encoder or k not in like or
                    encoder[k].shape != like[k].shape)  # fmt: skip
    if differ:
        raise SystemExit(f"the reference's encoder and vitscale's differ in tensors: {differ[:6]}")
    last = got["losses"][max(got["losses"])]
    return {"seed": seed, "wall_s": got["wall_s"], "last_loss": last}, encoder, got["head"]


def summarize(records: list[dict]) -> dict:
    out = {}
    for name in READOUTS:
        for key in ("knn_top1", "linear_probe_top1"):
            vals = [r["eval"][name][key] for r in records]
            out[f"{name}.{key}"] = {"mean": statistics.mean(vals), "stdev": statistics.stdev(vals) if len(vals) > 1 else 0.0}
    return out


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main(argv: list[str] | None = None) -> int:
    from vitscale.bench.report import git_commit, write_json

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mae-src", required=True, type=Path, help="a checkout of github.com/facebookresearch/mae")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                    help="overrides of the recipe for every side (a smoke test: train.max_steps=20)")
    ap.add_argument("--sides", nargs="+", choices=SIDES, default=list(DEFAULT_SIDES),
                    help="what to train (in this order), each seed; default: the first three")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    args.sides = [s for s in SIDES if s in args.sides]
    import torch

    from vitscale.config import load_config

    torch.set_num_threads(load_config(CONFIG).train.cpu_threads or torch.get_num_threads())  # every side's evaluation too
    mae = load_reference(args.mae_src)
    doc: dict = {
        "benchmark": "mae_vs_reference", "commit": git_commit(), "argv": sys.argv[1:], "loadavg_before": list(os.getloadavg()),
        "reference": {"models_mae.py_sha256": sha256(args.mae_src / "models_mae.py"),
                      "util/pos_embed.py_sha256": sha256(args.mae_src / "util" / "pos_embed.py")},
        "commands": {"vitscale": " ".join(["vitscale train", CONFIG, *args.set, "train.seed=SEED", *QUIET]),
                     "eval": "vitscale eval RUN/config.yaml (else digits_mae train.seed=SEED) checkpoint.path=FILE "
                             "[READOUT overrides] --output JSON"},
        "readouts": {k: v[0] for k, v in READOUTS.items()},
        "runs": {s: [] for s in args.sides},
    }  # fmt: skip
    sides = args.sides
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for seed in args.seeds:
            config = [CONFIG, *args.set, f"train.seed={seed}"]  # the evaluations' config: the recipe's for this seed
            if "vitscale" in sides:
                record, encoder, head = vitscale_side(seed, work, args.set)
                config = [str(work / f"vitscale_{seed}" / "config.yaml")]  # the same settings, as the run wrote them
                record["eval"] = evaluate(config, encoder_files(encoder, head, work / f"files_v{seed}"), work)
                doc["runs"]["vitscale"].append(record)
                same = record["eval"]["normed_of_mean"] == record["run_summary"]
                print(f"seed {seed}: the run's own evaluation {'equals' if same else 'DIFFERS from'} vitscale eval's "
                      f"normed_of_mean ({record['run_summary']})", flush=True)  # fmt: skip
            for side in sides[1:] if sides[0] == "vitscale" else sides:
                final_norm, vitscale_init = side != "reference_no_final_norm", side == "reference_vitscale_init"
                rec, enc, head = reference_side(mae, seed, final_norm, work, args.set, vitscale_init)
                rec["eval"] = evaluate(config, encoder_files(enc, head, work / f"files_{side}_{seed}"), work)
                doc["runs"][side].append(rec)
            for side in sides:
                r = doc["runs"][side][-1]
                print(f"seed {seed} {side}: {r['wall_s']:.0f} s, last loss {r['last_loss']:.4f}; " + "; ".join(
                    f"{n} knn {e['knn_top1']:.2f}% probe {e['linear_probe_top1']:.2f}%" for n, e in r["eval"].items()),
                    flush=True)  # fmt: skip
    doc["summary"] = {side: summarize(doc["runs"][side]) for side in sides}
    if "vitscale" in sides:
        doc["vitscale_minus_reference"] = {
            other: {k: doc["summary"]["vitscale"][k]["mean"] - v["mean"] for k, v in doc["summary"][other].items()}
            for other in sides if other != "vitscale"
        }
    doc["loadavg_after"] = list(os.getloadavg())
    for side in sides:
        print(f"{side} over seeds {args.seeds}: " + ", ".join(
            f"{k} {v['mean']:.2f} +- {v['stdev']:.2f}%" for k, v in doc["summary"][side].items()))  # fmt: skip
    for other, diff in doc.get("vitscale_minus_reference", {}).items():
        print(f"vitscale - {other}: " + ", ".join(f"{k} {v:+.2f}" for k, v in diff.items()))
    if args.json:
        write_json(doc, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
