"""docs/recipes.md is what the shipped recipes say: regenerated from their YAML, it is unchanged."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_recipes_doc_is_current():
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "make_recipes_doc.py"), "--check"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_every_recipe_points_to_its_table():
    sys.path.insert(0, str(ROOT / "scripts"))
    import make_recipes_doc as doc

    files = sorted({p for pat in doc.PATTERNS for p in doc.CONFIGS.glob(pat)})
    assert len(files) >= 13
    for p in files:
        header, rows = doc.parse(p)
        assert any("docs/recipes.md" in h for h in header), p.name
        assert rows and all(k.split(".")[0].split("[")[0] in {"model", "data", "optim", "schedule", "train", "eval", "checkpoint", "parallel",
                                                "precision", "distill", "clip", "token_label", "teacher", "log", "evals", "dino"} for k, _, _ in rows), p.name
