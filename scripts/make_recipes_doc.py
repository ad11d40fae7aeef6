"""Write docs/recipes.md from the recipes themselves: one table per shipped ImageNet / LAION config
(``vitscale/configs/imagenet*.yaml``, ``laion*.yaml``, ``clip_*.yaml``), its header comment (source,
launch, hardware, the headline it should reach) above it, and per field its value and the source its
line cites (the comment after the value, and the comment lines under it). A field whose line cites
nothing shows the header's citation ("header").

    python scripts/make_recipes_doc.py            # writes docs/recipes.md
    python scripts/make_recipes_doc.py --check    # exit 1 when docs/recipes.md differs (make test checks it)

The YAML is read as text for the comments only; the values are those the config loader reads (the
file through ``vitscale.safe_yaml``), so the table shows what a run gets.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "vitscale" / "configs"
OUT = ROOT / "docs" / "recipes.md"
PATTERNS = ("imagenet*.yaml", "laion*.yaml", "clip_*.yaml", "dino_*.yaml")
OPERATIONAL = {"train.output_dir", "train.log_every", "data.num_workers", "eval.every", "eval.batch_size", "checkpoint.every",
               "checkpoint.keep", "parallel.dp_shard", "data.train_path", "data.val_path"}  # fmt: skip

INTRO = """# Recipes

Every ImageNet and LAION recipe vitscale ships, and the one-GPU recipes for your own images
(`dino_vits16_1gpu` from scratch, `dino_vits14_continue` from DINOv2's released weights), field by
field: the value a run gets and the source its line in the YAML cites (a paper's table, a repository's file and line). *header*: the recipe's
header comment cites it for the whole recipe; *vitscale*: an operational setting (folders, workers,
logging and checkpoint periods, the parallel layout) that does not change what is computed. Each
recipe's header says what it should reach and on what hardware; none of these headlines was
reproduced on this project's CPU machine (no ImageNet, LAION or GPU here). Every config in
`vitscale/configs/` trains as it ships in `tests/integration/test_recipes_as_shipped.py`: 2 steps at its
own resolution on real photos (scikit-learn's sample photos as an image folder, or as captioned
WebDataset shards), then its evaluation once; only the data paths, the files it starts from (init
weights, a teacher, token labels: tiny real files in the format the recipe names; a previous stage's
run: that recipe's own, of 1 step) and the model's
width and depth are replaced, every augmentation, sampler, loss and evaluation setting is its own.

This page is generated from the configs by `python scripts/make_recipes_doc.py` (`make test` checks
that it is current): change a recipe, then regenerate it.
"""


NOT_SHIPPED = """
## laion400m_siglip_b16 (not shipped)

A SigLIP ViT-B/16 recipe beside `laion400m_clip_b32` was to be made from big_vision's SigLIP configs and
the SigLIP paper (arXiv 2303.15343). Too few of its fields can be cited from sources readable here, so
no `laion400m_siglip_b16.yaml` ships. What the sources give:

| field | value | source |
|---|---|---|
| `train.loss` | `sigmoid` | open_clip `--siglip` (open_clip_train/params.py, "Use SigLip (sigmoid) loss") |
| `model.logit_scale_init`, `model.logit_bias_init` | log 10, -10 | open_clip_train/main.py lines 220-222 (`--siglip`: `init_logit_scale = np.log(10)`, `init_logit_bias = -10`); vitscale applies both whenever `train.loss=sigmoid` |
| `train.batch_size` | 32768 | arXiv 2303.15343, abstract: "a more reasonable batch size of 32k being sufficient" |
| image size, text length | 224 px, 64 tokens | open_clip `model_configs/ViT-B-16-SigLIP.json` (`image_size` 224, `context_length` 64) |
| `data.mean`, `data.std` | 0.5, 0.5 | open_clip `ViT-B-16-SigLIP.json` names timm's `vit_base_patch16_siglip_224`; its `.webli` pretrained config normalises with 0.5 / 0.5 (bicubic) |

What is missing, and where it would come from:

- **The architecture.** SigLIP B/16 (open_clip `ViT-B-16-SigLIP.json`) has a MAP (attention-pooling) image
  head with no projection, a bidirectional text tower (`no_causal_mask`) pooled at the last token with a
  biased projection, LayerNorm eps 1e-6 and a 32,000-token SentencePiece vocabulary (`timm/ViT-B-16-SigLIP`,
  C4-en). vitscale's `clip` family has OpenAI CLIP's towers only (class-token image pooling, causal text,
  the 49,408-token BPE); `naflex_b16_siglip` is the SigLIP 2 NaFlex image tower alone.
- **The optimiser, learning rate, weight decay, warm-up, schedule and training length.** The SigLIP paper's
  setup section (arXiv 2303.15343) could not be read here (only its abstract); big_vision ships no SigLIP
  pre-training config: its one SigLIP config, `big_vision/configs/proj/image_text/siglip_lit_coco.py`
  (commit 0127fb6), is a locked-image (LiT) run on COCO captions (batch 512, 5,000 steps, lr 1e-3, wd 0.01,
  bias init -2.71, a BERT text tower), not a LAION or WebLI pre-training.
- **The training augmentation.** Not in any readable source for the WebLI pre-training (the LiT-COCO config
  resizes, flips and applies RandAugment(2, 10), big_vision `siglip_lit_coco.py` lines 56-59).
- **The data.** SigLIP was trained on WebLI; no SigLIP B/16 LAION-400M run is published, so there is no
  LAION headline to reproduce.

Until these are cited, `vitscale train laion400m_clip_b32 train.loss=sigmoid` gives open_clip's
`--model ViT-B-32-quickgelu --siglip` (the sigmoid loss and its initialisation on CLIP's towers), which
is not a published recipe.
"""


def _split_comment(line: str) -> tuple[str, str]:
    """``"  lr: 3e-3   # a source"`` -> (``"  lr: 3e-3"``, ``"a source"``); a ``#`` inside quotes is text."""
    quote = None
    for i, ch in enumerate(line):
        if ch in "'\"" and quote in (None, ch):
            quote = None if quote else ch
        elif ch == "#" and quote is None and (i == 0 or line[i - 1] in " \t"):
            return line[:i].rstrip(), line[i + 1 :].strip()
    return line.rstrip(), ""


def parse(path: Path) -> tuple[list[str], list[tuple[str, str, str]]]:
    """(header comment lines, [(dotted key, value text, source comment)]) of one recipe file."""
    header: list[str] = []
    rows: list[tuple[str, str, str]] = []
    stack: list[tuple[int, str]] = []  # (indent, key) of the mappings above; ``[i]`` for a list's i-th item
    items: dict[tuple[str, ...], int] = {}  # the items seen of each block list
    started = False
    for raw in path.read_text().splitlines():
        code, comment = _split_comment(raw)
        if not code.strip():
            if not started and comment:
                header.append(comment)
            elif comment and rows:  # a comment line under a field continues its source
                key, value, src = rows[-1]
                rows[-1] = (key, value, f"{src} {comment}".strip())
            continue
        started = True
        indent = len(code) - len(code.lstrip())
        text = code.strip()
        if text.startswith("- "):  # a block list's item (``distill.teachers``): its keys are ``list[i].key``
            while stack and stack[-1][0] >= indent:
                stack.pop()
            parent = tuple(k for _, k in stack)
            items[parent] = items.get(parent, -1) + 1
            stack.append((indent, f"[{items[parent]}]"))
            indent, text = indent + 2, text[2:]
        key, _, value = text.partition(":")
        while stack and stack[-1][0] >= indent:
            stack.pop()
        dotted = ".".join([k for _, k in stack] + [key.strip()]).replace(".[", "[")
        if value.strip():
            rows.append((dotted, value.strip(), comment))
        else:
            stack.append((indent, key.strip()))
            if comment:
                rows.append((dotted, "", comment))
    return header, rows


def render() -> str:
    files = sorted({p for pat in PATTERNS for p in CONFIGS.glob(pat)})
    parts = [INTRO, "| recipe | what it trains |\n|---|---|"]
    for p in files:
        header, _ = parse(p)
        more = len(header) > 1 and not header[1].startswith(("Launch", "Every field"))
        parts.append(f"| [`{p.stem}`](#{p.stem}) | {header[0] if header else ''}{' …' if more else ''} |")
    for p in files:
        header, rows = parse(p)
        parts.append(f"\n## {p.stem}\n")
        parts.append("\n".join(f"> {h}" if h else ">" for h in header))
        parts.append(f"\nFile: `vitscale/configs/{p.name}`.\n\n| field | value | source |\n|---|---|---|")
        for key, value, src in rows:
            if not value:
                continue
            source = src or ("vitscale" if key in OPERATIONAL else "header")
            parts.append(f"| `{key}` | `{value}` | {source.replace('|', '/')} |")
    parts.append(NOT_SHIPPED)
    return "\n".join(parts) + "\n"


def main() -> int:
    from generated_file import write_or_check

    return write_or_check(OUT, render, "scripts/make_recipes_doc.py", __doc__, "the configs")


if __name__ == "__main__":
    sys.exit(main())
