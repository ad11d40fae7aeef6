"""DINO on the digits: the k-NN top-1 of the pretrained backbone against the same backbone at random
initialisation, and its linear probe. Every run is ``vitscale train`` as a user types it, in a
temporary folder (``benchmarks/ssl_digits.py``); the figures are read from its summary.json.

- ``pretrained``: ``vitscale train digits_dino train.seed=SEED``;
- ``init``: ``vitscale train digits_dino train.seed=SEED train.max_steps=1 optim.lr=0`` (one step at
  learning rate 0 leaves the backbone as initialised);
- step cost (``--cost-rounds`` > 0): ``digits_vit`` and ``digits_dino`` for ``--cost-steps`` steps each,
  alternated; the median ``img_per_s`` of the log records after step 10.

    python benchmarks/dino_digits.py --seeds 0 --json benchmarks/results/dino_digits_cpu_202611.json
    python benchmarks/dino_digits.py --seeds --cost-rounds 2 --json benchmarks/results/dino_step_cost_cpu_202611.json
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ssl_digits import run_benchmark  # noqa: E402

SIGNALS = ("train_rankme", "train_teacher_entropy", "train_teacher_kl_uniform")


def signals(rows: list[dict]) -> dict:
    return {
        "signals_first_last": {s: [r[s] for r in rows if s in r][:: max(len(rows) - 1, 1)] for s in SIGNALS}
    }


def main(argv: list[str] | None = None) -> int:
    return run_benchmark(__doc__.split("\n\n")[0], "digits_dino", "dino", signals, seeds=[0, 1, 2], cost_steps=40,
                         cost_rounds=0, argv=argv)  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
