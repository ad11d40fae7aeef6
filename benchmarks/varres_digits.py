"""NaFlex on the digits: the share of padding tokens at the default token budget, and training speed
against the fixed-size run at an equal number of real tokens.

1. Padding: one epoch of ``digits_naflex``'s training batches (the config's sequence lengths and
   token budget) and its evaluation batches at each sequence length: padding tokens over all tokens.
2. Speed: training steps (``Trainer.train_step``: forward, backward, optimizer) of three runs, timed
   in alternating rounds (``vitscale.bench.timing.time_alternating``):
   - ``fixed``: ``digits_vit`` at 32x32 px (64 patches an image), batch 64: 4,096 real tokens a step;
   - ``naflex64``: ``digits_naflex`` at one sequence length, 64, batch 64 (the 24x40 / 40x24 images
     take 60 patches, 32x32 ones 64): the same model size and about the same real tokens a step;
   - ``naflex``: ``digits_naflex`` as configured (36, 64, 100 tokens, 4,096-token budget).
   Each is reported as ms and CPU ms a step, img/s and real tokens/s; ``naflex64_vs_fixed`` compares
   img/s at equal real tokens (img/s x real tokens an image, over the fixed run's).

    python benchmarks/varres_digits.py --json benchmarks/results/varres_digits_cpu_202611.json \
        2>&1 | tee benchmarks/results/varres_digits_cpu_202611.log
"""

from __future__ import annotations

import argparse
import os
import tempfile

import torch

from vitscale.bench.report import git_commit, write_json
from vitscale.bench.timing import time_alternating
from vitscale.config import load_config
from vitscale.train.trainer import Trainer

QUIET = ["log.progress=none", "log.report=false", "log.tensorboard=false", "evals=[]", "eval.every=0"]


def padding(cfg) -> dict:
    """Padding share of one epoch of training batches and of the evaluation batches per sequence length."""
    from vitscale.data.build import build_loader, build_loaders

    d = cfg.data
    loaders = build_loaders(d, img_size=(32, 32), num_channels=3, seed=0, micro_batch_size=cfg.train.batch_size,
                            eval_batch_size=300, patch=4)  # fmt: skip
    valid = total = steps = 0
    for batch in loaders.train:  # one epoch
        v = batch["image"]["patch_valid"]
        valid, total, steps = valid + int(v.sum()), total + v.numel(), steps + 1
    out = {"train": {"steps": steps, "real_tokens": valid, "tokens": total, "padding_pct": 100 * (1 - valid / total),
                     "tokens_per_batch": d.tokens_per_batch, "seq_lens": list(d.seq_lens)}}  # fmt: skip
    from vitscale.config import replace_fields

    for n in d.seq_lens:
        val = build_loader(replace_fields(d, {"eval_seq_len": n}), "val", img_size=(32, 32), num_channels=3, seed=0,
                           batch_size=300, patch=4).loader  # fmt: skip
        v = torch.cat([b["image"]["patch_valid"] for b in val])
        out[f"val_seq{n}"] = {"padding_pct": 100 * (1 - v.sum().item() / v.numel())}
    return out


class Steps:
    """Training steps of one run; counts images and real tokens."""

    def __init__(self, config: str, overrides: list[str], out: str):
        self.trainer = Trainer(load_config(config, [*QUIET, f"train.output_dir={out}", *overrides]))
        self.batches = self.trainer._batches()
        self.images = self.tokens = self.calls = 0
        self.trainer.step = 1

    def __call__(self) -> None:
        t = self.trainer
        batch = next(self.batches)
        self.batches = _put_back(batch, self.batches)
        x = batch["image"]
        self.images += x["patches"].shape[0] if isinstance(x, dict) else x.shape[0]
        self.tokens += int(x["patch_valid"].sum()) if isinstance(x, dict) else x.shape[0] * (x.shape[-1] // 4) ** 2
        self.calls += 1
        t.train_step(self.batches)


def _put_back(first, rest):
    yield first
    yield from rest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (the configs' train.cpu_threads)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    pad = padding(load_config("digits_naflex", QUIET))
    print(f"padding at the default token budget: train {pad['train']['padding_pct']:.2f}% "
          + " ".join(f"{k} {v['padding_pct']:.2f}%" for k, v in pad.items() if k != "train"))  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        runs = {
            "fixed": Steps("digits_vit", ["train.batch_size=64"], f"{tmp}/fixed"),
            "naflex64": Steps("digits_naflex", ["data.seq_lens=[64]", "data.tokens_per_batch=4096"], f"{tmp}/n64"),
            "naflex": Steps("digits_naflex", [], f"{tmp}/naflex"),
        }
        for r in runs.values():  # time_alternating counts its own calls: reset after its warmup
            r.images = r.tokens = r.calls = 0
        timed = time_alternating(dict(runs), torch.device("cpu"), steps=args.steps, rounds=args.rounds, warmup=2)
        for r in runs.values():
            r.trainer.close()
    res = {}
    for name, r in runs.items():
        per_step_img, per_step_tok = r.images / r.calls, r.tokens / r.calls
        ms = timed[name]["median_round_ms"]
        cpu = timed[name]["cpu_ms"]  # process CPU time: less moved by other jobs on a shared machine
        res[name] = {"ms_per_step": ms, "cpu_ms_per_step": cpu, "images_per_step": per_step_img,
                     "real_tokens_per_step": per_step_tok, "img_per_s": 1000 * per_step_img / ms,
                     "real_tokens_per_s": 1000 * per_step_tok / ms, "img_per_cpu_s": 1000 * per_step_img / cpu,
                     "real_tokens_per_cpu_s": 1000 * per_step_tok / cpu, "rounds_ms": timed[name]["rounds_ms"],
                     "calls": r.calls}  # fmt: skip
        print(f"{name:9s} {ms:7.1f} ms/step  {res[name]['img_per_s']:7.1f} img/s  {res[name]['real_tokens_per_s']:9.0f} "
              f"real tokens/s  ({per_step_img:.1f} images, {per_step_tok:.0f} real tokens a step)")  # fmt: skip
    f, n = res["fixed"], res["naflex64"]
    ratio = n["real_tokens_per_s"] / f["real_tokens_per_s"]
    cpu_ratio = n["real_tokens_per_cpu_s"] / f["real_tokens_per_cpu_s"]
    print(f"naflex64 vs fixed at equal real tokens: {ratio:.3f}x real tokens/s (wall), {cpu_ratio:.3f}x per CPU second; "
          f"img/s {n['img_per_s'] / f['img_per_s']:.3f}x (wall), {n['img_per_cpu_s'] / f['img_per_cpu_s']:.3f}x per CPU second "
          f"({n['real_tokens_per_step'] / n['images_per_step']:.1f} vs 64 real tokens an image)")  # fmt: skip
    result = {
        "benchmark": "varres_digits", "commit": git_commit(), "torch": torch.__version__, "threads": args.threads,
        "steps": args.steps, "rounds": args.rounds, "padding": pad, "runs": res,
        "naflex64_vs_fixed_real_tokens_per_s": ratio, "naflex64_vs_fixed_real_tokens_per_cpu_s": cpu_ratio,
        "naflex64_vs_fixed_img_per_s": n["img_per_s"] / f["img_per_s"],
        "naflex64_vs_fixed_img_per_cpu_s": n["img_per_cpu_s"] / f["img_per_cpu_s"], "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
        "note": "shared 2-core machine (other jobs running): medians of alternating rounds; re-take on a quiet one",
    }  # fmt: skip
    if args.json:
        write_json(result, args.json)


if __name__ == "__main__":
    main()
