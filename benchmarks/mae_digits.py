"""MAE on the digits: the k-NN top-1 of the pretrained backbone against the same backbone at random
initialisation, its linear probe, and what an MAE step costs against a supervised step of the same
backbone. Every run is ``vitscale train`` as a user types it, in a temporary folder; the figures are
read from its summary.json and metrics.jsonl.

- ``pretrained``: ``vitscale train digits_mae train.seed=SEED`` (600 steps, knn and linear probe at
  the end);
- ``init``: ``vitscale train digits_mae train.seed=SEED train.max_steps=1 optim.lr=0``: one step at
  learning rate 0 leaves the weights as initialised (AdamW's decay is scaled by the learning rate), so
  its evaluations are those of the random initialisation under the same seed;
- step cost: ``digits_vit`` and ``digits_mae`` for ``--cost-steps`` steps each, alternated
  ``--cost-rounds`` times; the median ``img_per_s`` of the log records after step 10 (evaluations and
  checkpoints are not counted in it).

    nice -n 10 python benchmarks/mae_digits.py --seeds 0 1 2 --json benchmarks/results/mae_digits_cpu_202612.json \\
        2>&1 | tee benchmarks/results/mae_digits_cpu_202612.log

Every run trains on one thread (``train.cpu_threads: 1``), one at a time.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ssl_digits import run_benchmark  # noqa: E402


def rank(rows: list[dict]) -> dict:
    ranks = [r["train_rankme"] for r in rows if "train_rankme" in r]
    return {"train_rankme_first_last_min": [ranks[0], ranks[-1], min(ranks)]}


def main(argv: list[str] | None = None) -> int:
    return run_benchmark(__doc__.split("\n\n")[0], "digits_mae", "mae", rank, seeds=[0, 1, 2], cost_steps=60,
                         cost_rounds=2, argv=argv)  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
