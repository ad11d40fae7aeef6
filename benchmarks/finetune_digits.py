"""Fine-tuning from a timm-format file and online distillation, shown on scikit-learn's digits on a CPU.

What a new user does, through the real CLI (``python -m vitscale train``), every command recorded:

(a) train the digits ViT (``vitscale train digits_vit``), save it in timm's format with the documented
    call (``torch.save(vitscale.interop.to_timm(vitscale.load_run(RUN).model), "digits_timm.pth")``,
    docs/finetuning.md), then fine-tune from that file for ``--steps`` steps
    (``checkpoint.init_from=digits_timm.pth``) — against the same ``--steps`` steps from scratch, and
    against the same file forced through the wrong layout (``checkpoint.init_format=vitscale`` on its
    ``.safetensors`` copy: the QKV rows scrambled, the trap ``checkpoint.init_from`` now refuses);
(b) a small student (``--student`` overrides, DeiT's distillation token) trained ``--distill-steps``
    steps with the digits ViT of (a) as its teacher (``distill.teacher=RUN``, hard distillation),
    against the same student alone — same steps, data order and seed.

Writes ``--json`` (the results, each run's command, wall time and ``os.getloadavg()``) and, beside
it, a ``.log`` with every run's output; the run folders stay in ``--out-dir``.

    python benchmarks/finetune_digits.py --out-dir /tmp/finetune_digits \\
        --json benchmarks/results/finetune_digits_cpu_202611.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STUDENT = ["model.hidden_size=48", "model.ffn_hidden_size=96", "model.num_attention_heads=3", "model.num_layers=2",
           "model.distill_token=true"]  # fmt: skip


def run(cmd: list[str], log, cwd: Path) -> tuple[int, float, str]:
    """Run ``cmd`` in ``cwd``; its output goes to ``log``; (exit code, seconds, output)."""
    t = time.perf_counter()
    p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - t
    shown = " ".join(c if " " not in c else repr(c) for c in cmd[2:])
    log.write(f"\n$ {shown}\n(exit {p.returncode}, {wall:.1f} s, load {os.getloadavg()[0]:.1f})\n{p.stdout}{p.stderr}")
    log.flush()
    return p.returncode, wall, p.stdout + p.stderr


def summary(folder: Path) -> dict:
    s = json.loads((folder / "summary.json").read_text())
    return {k: s[k] for k in ("val_top1", "val_top5", "val_loss", "steps", "wall_time_s", "img_per_s") if k in s}


def first_loss(folder: Path) -> float:
    return json.loads((folder / "metrics.jsonl").read_text().splitlines()[0])["loss"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-dir", required=True, help="run folders and the timm file go here")
    ap.add_argument("--steps", type=int, default=30, help="fine-tuning / from-scratch steps of (a)")
    ap.add_argument("--distill-steps", type=int, default=300, help="steps of (b), student alone and distilled")
    ap.add_argument("--teacher", default=None, help="an existing digits_vit run folder (skips training one)")
    ap.add_argument("--json", required=True)
    args = ap.parse_args()
    out = Path(args.out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    py = [sys.executable, "-m", "vitscale", "train", "digits_vit", "log.progress=plain", "log.tensorboard=false"]
    res: dict = {"commands": {}, "wall_s": {}, "load_before": list(os.getloadavg()), "cpu_count": os.cpu_count()}
    with open(Path(args.json).with_suffix(".log"), "w") as log:
        def train(name: str, *extra: str) -> Path:
            folder = out / name
            cmd = [*py, f"train.output_dir={folder}", *extra]
            code, wall, text = run(cmd, log, out)
            if code != 0:
                raise SystemExit(f"{name} failed ({code}): {text.strip().splitlines()[-1]}")
            res["commands"][name], res["wall_s"][name] = " ".join(cmd[2:]), round(wall, 1)
            return folder

        # (a) the teacher, saved in timm's format with the documented call, fine-tuned from that file
        teacher = Path(args.teacher).resolve() if args.teacher else train("digits_vit")
        res["digits_vit"] = summary(teacher)
        save = ("import torch, vitscale; from vitscale.interop import to_timm; "
                f"torch.save(to_timm(vitscale.load_run({str(teacher)!r}).model), 'digits_timm.pth')")  # fmt: skip
        run([sys.executable, "-c", save], log, out)
        res["commands"]["save_timm"] = f"python -c {save!r}"
        steps = [f"train.max_steps={args.steps}"]
        ft = train("finetune_timm", "checkpoint.init_from=digits_timm.pth", *steps)
        scratch = train("scratch", *steps)
        res["finetune_timm"] = summary(ft) | {"first_loss": first_loss(ft)}
        res["scratch"] = summary(scratch) | {"first_loss": first_loss(scratch)}
        # the trap: the same tensors as a metadata-less .safetensors are refused; forced as vitscale's layout they scramble
        conv = ("import torch, safetensors.torch as st; "
                "st.save_file(torch.load('digits_timm.pth', weights_only=True), 'digits_timm.safetensors')")  # fmt: skip
        run([sys.executable, "-c", conv], log, out)
        code, _, text = run([*py, f"train.output_dir={out / 'refused'}", "checkpoint.init_from=digits_timm.safetensors", *steps], log, out)
        res["refused"] = {"exit_code": code, "message": text.strip().splitlines()[-1]}
        wrong = train("wrong_layout", "checkpoint.init_from=digits_timm.safetensors", "checkpoint.init_format=vitscale", *steps)
        res["wrong_layout"] = summary(wrong) | {"first_loss": first_loss(wrong)}

        # (b) a small student with DeiT's distillation token, alone and distilled from the digits ViT
        dsteps = [f"train.max_steps={args.distill_steps}", "eval.every=0"]
        alone = train("student_alone", *STUDENT, *dsteps)
        distilled = train("student_distilled", *STUDENT, *dsteps, f"distill.teacher={teacher}")
        res["student_alone"], res["student_distilled"] = summary(alone), summary(distilled)
        rec = [json.loads(line) for line in (distilled / "metrics.jsonl").read_text().splitlines()]
        shares = [r["teacher_time_pct"] for r in rec if "teacher_time_pct" in r]
        res["student_distilled"]["teacher_time_pct_median"] = sorted(shares)[len(shares) // 2] if shares else None
        res["student_overrides"] = STUDENT
    res["load_after"] = list(os.getloadavg())
    Path(args.json).write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps({k: res[k] for k in ("finetune_timm", "scratch", "wrong_layout", "student_alone", "student_distilled")}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
