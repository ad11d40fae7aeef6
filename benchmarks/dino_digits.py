"""DINO on the digits: the k-NN top-1 of the pretrained backbone against the same backbone at random
initialisation, and its linear probe. Every run is ``vitscale train`` as a user types it, in a
temporary folder (``benchmarks/ssl_digits.py``); the figures are read from its summary.json.

- ``pretrained``: ``vitscale train digits_dino train.seed=SEED``;
- ``init``: ``vitscale train digits_dino train.seed=SEED train.max_steps=1 optim.lr=0`` (one step at
  learning rate 0 leaves the backbone as initialised);
- both with ``evals:`` of the recipe's k-NN and linear probe (the pooled features) and linear probes
  on DINOv2's linear-evaluation features (facebookresearch/dinov2 ``dinov2/eval/linear.py``
  ``create_linear_input``; its grid: the class token of the last 1 and 4 blocks, without and with the
  mean patch token): ``linear_probe_cls{1,4}`` and ``linear_probe_cls{1,4}_avgpool``;
- the teacher (DINOv2 evaluates it): each pretrained run's teacher backbone
  (``vitscale convert RUN teacher.safetensors --key teacher``) through the same evaluations
  (``vitscale eval RUN/config.yaml checkpoint.path=teacher.safetensors``), recorded as ``teacher_*``;
  at initialisation the teacher is the student;
- step cost (``--cost-rounds`` > 0): ``digits_vit`` and ``digits_dino`` for ``--cost-steps`` steps each,
  alternated; the median ``img_per_s`` of the log records after step 10.

    python benchmarks/dino_digits.py --seeds 0 1 2 --json benchmarks/results/dino_digits_linear_eval_cpu_202611.json
    python benchmarks/dino_digits.py --seeds --cost-rounds 2 --json benchmarks/results/dino_step_cost_cpu_202611.json
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ssl_digits import ROOT, run_benchmark, scores  # noqa: E402

from vitscale.config import load_config  # noqa: E402

SIGNALS = ("train_rankme", "train_teacher_entropy", "train_teacher_kl_uniform")
# DINOv2's linear-evaluation grid (dinov2/eval/linear.py lines 235-250, 503: n in (1, 4), avgpool off / on)
LINEAR_EVAL = [{"kind": "linear_probe", "name": f"linear_probe_cls{n}{'_avgpool' if avg else ''}", "blocks": n,
                "features": "class_token_patch_mean" if avg else "class_token"} for n in (1, 4) for avg in (False, True)]  # fmt: skip


def signals(rows: list[dict]) -> dict:
    return {
        "signals_first_last": {s: [r[s] for r in rows if s in r][:: max(len(rows) - 1, 1)] for s in SIGNALS}
    }


def teacher(out: Path) -> dict:
    """The run's evaluations on its teacher's backbone (its newest checkpoint), as ``teacher_<metric>``."""
    weights, result = out / "teacher.safetensors", out / "teacher_eval.json"
    vitscale = [sys.executable, "-m", "vitscale"]
    subprocess.run([*vitscale, "convert", str(out), str(weights), "--key", "teacher"], check=True, stdout=subprocess.DEVNULL, cwd=ROOT)
    subprocess.run([*vitscale, "eval", str(out / "config.yaml"), f"checkpoint.path={weights}", "--output", str(result)],
                   check=True, stdout=subprocess.DEVNULL, cwd=ROOT)  # fmt: skip
    return {f"teacher_{k}": v for k, v in scores(json.loads(result.read_text())).items()}


def main(argv: list[str] | None = None) -> int:
    every = load_config("digits_dino").eval.every
    evals = [{"kind": "knn", "every": every}, {"kind": "linear_probe"}, *LINEAR_EVAL]
    return run_benchmark(__doc__.split("\n\n")[0], "digits_dino", "dino", signals, seeds=[0, 1, 2], cost_steps=40,
                         cost_rounds=0, argv=argv, extra=(f"evals={json.dumps(evals)}",), after=teacher)  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
