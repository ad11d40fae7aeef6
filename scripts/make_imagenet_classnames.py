"""Write ``vitscale/eval/classnames/imagenet.json``: the ImageNet-1k class names and prompt templates of
the CLIP paper's zero-shot ImageNet evaluation (Radford et al. 2021, arXiv 2103.00020; the lists of
openai/CLIP ``notebooks/Prompt_Engineering_for_ImageNet.ipynb``, as open_clip ships them in
``open_clip/zero_shot_metadata.py``), beside the 1,000 WordNet ids in class-index order (timm's
``timm/data/_info/imagenet_synsets.txt``), read from the installed packages. Run once by hand:

    .venv/bin/python scripts/make_imagenet_classnames.py
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import open_clip.zero_shot_metadata as meta

OUT = Path(__file__).resolve().parents[1] / "vitscale" / "eval" / "classnames" / "imagenet.json"


def main() -> None:
    wnids = resources.files("timm.data._info").joinpath("imagenet_synsets.txt").read_text().split()
    names = list(meta.IMAGENET_CLASSNAMES)
    templates = [t("{}") for t in meta.OPENAI_IMAGENET_TEMPLATES]
    assert len(wnids) == len(names) == 1000 and len(templates) == 80
    OUT.write_text(json.dumps({
        "source": "CLIP (arXiv 2103.00020) zero-shot ImageNet: openai/CLIP notebooks/Prompt_Engineering_for_ImageNet.ipynb "
                  "(class names and the 80 templates); WordNet ids in class-index order: timm/data/_info/imagenet_synsets.txt",
        "wnids": wnids, "class_names": names, "templates": templates,
    }, indent=0, ensure_ascii=False) + "\n")  # fmt: skip
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
