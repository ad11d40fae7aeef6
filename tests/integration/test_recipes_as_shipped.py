"""Every config in ``vitscale/configs/`` trains as it ships: 2 steps at its own resolution on real photos
(scikit-learn's two sample photos as an image folder, as a flat folder without classes for a recipe of
one's own photos — its k-NN and probe on the image folder —, or as captioned WebDataset shards for the
CLIP recipes; the digits recipes on their built-in digits), then its evaluation once. Only the data paths
(and the files a recipe starts from: init weights, a teacher, token labels, each a tiny real file
written here in the format the recipe names; a stage that keeps the previous stage's parts, that
recipe's own run of 1 step) and the model's size (width and depth; patch size and
image size kept) are replaced, plus the batch and the step count (a DINO recipe's head warm-up on a
frozen backbone, ``dino.freeze_backbone_steps``, the first of the 2 steps): every augmentation, sampler,
loss, schedule and evaluation setting is the recipe's own. A new config is covered by being in the folder.
"""

from __future__ import annotations

import dataclasses
import json
import tarfile
from io import BytesIO
from pathlib import Path

import pytest
import torch
import yaml
from PIL import Image

import vitscale
from vitscale.cli import main
from vitscale.config import load_config

CONFIGS = sorted(p.stem for p in (Path(vitscale.__file__).parent / "configs").glob("*.yaml"))

# the model's size, per family: width and depth only (patch size, image size and every other field the recipe's)
VIT = {"hidden_size": 32, "ffn_hidden_size": 64, "num_layers": 1, "num_attention_heads": 2}
VOLO = {
    "layers": [1, 1],
    "outlook_dim": 32,
    "outlook_heads": 2,
    "hidden_size": 64,
    "num_heads": 4,
    "stem_hidden": 8,
}
CLIP = {"vision": VIT, "text": {"hidden_size": 32, "ffn_hidden_size": 128, "num_attention_heads": 2, "num_layers": 1},
        "output_dim": 32}  # fmt: skip
SHRINK = {"vit": VIT, "naflex": VIT, "volo": VOLO, "clip": CLIP}

# how many steps, on how many images, with how little logging: nothing the recipe trains with
RUN = ["train.max_steps=2", "train.epochs=0", "train.batch_size=4", "eval.batch_size=4", "data.num_workers=0",
       "train.device=cpu", "train.cpu_threads=1", "log.report=false", "log.progress=none", "log.flops=false",
       "train.log_every=1"]  # fmt: skip

PHOTO_CLASSES = ("china", "flower")


def _family(model_name: str) -> str:
    fam = model_name.split("_")[0]
    assert fam in SHRINK, f"{model_name}: add its family's tiny width and depth to SHRINK"
    return fam


def _dotted(prefix: str, d: dict) -> list[str]:
    out = []
    for k, v in d.items():
        if isinstance(v, dict):
            out += _dotted(f"{prefix}.{k}", v)
        else:
            out.append(f"{prefix}.{k}={json.dumps(v)}")
    return out


def _photo_crops(split: str, n: int):
    """``n`` crops (320 x 420) of each of scikit-learn's two sample photos: (class index, k, RGB array)."""
    from sklearn.datasets import load_sample_images

    for c, a in enumerate(load_sample_images().images):
        for k in range(n):
            y, x = (k * 23 + (split == "val") * 11) % 100, (k * 41 + (split == "val") * 17) % 200
            yield c, k, a[y:y + 320, x:x + 420]  # fmt: skip


def _jpeg(a) -> bytes:
    buf = BytesIO()
    Image.fromarray(a).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """``{root}/folder/{train,val}/{china,flower}/*.jpg`` (6 + 2 per class), the same images as captioned
    WebDataset shards ``{root}/wds/{train,val}/00000.tar`` (``jpg``, ``txt``, ``cls``; ``classnames.txt`` beside),
    and the training images as one flat folder without classes ``{root}/flat/*.jpg`` (``data.format=images``)."""
    root = tmp_path_factory.mktemp("photos")
    for split, n in (("train", 6), ("val", 2)):
        (root / "wds" / split).mkdir(parents=True)
        (root / "wds" / split / "classnames.txt").write_text("".join(f"{c}\n" for c in PHOTO_CLASSES))
        with tarfile.open(root / "wds" / split / "00000.tar", "w") as tar:
            for c, k, a in _photo_crops(split, n):
                data = _jpeg(a)
                (root / "folder" / split / PHOTO_CLASSES[c]).mkdir(parents=True, exist_ok=True)
                (root / "folder" / split / PHOTO_CLASSES[c] / f"{k}.jpg").write_bytes(data)
                if split == "train":
                    (root / "flat").mkdir(exist_ok=True)
                    (root / "flat" / f"{PHOTO_CLASSES[c]}{k}.jpg").write_bytes(data)
                caption = ("a photo of a chinese temple" if c == 0 else "a photo of a flower") + f", crop {k}"
                for ext, payload in (("jpg", data), ("txt", caption.encode()), ("cls", str(c).encode())):
                    info = tarfile.TarInfo(f"{PHOTO_CLASSES[c]}{k:03d}.{ext}")
                    info.size = len(payload)
                    tar.addfile(info, BytesIO(payload))
    return root


def _token_labels(root: Path, num_samples: int, num_classes: int) -> Path:
    """A token-label folder in vitscale's format (``vitscale label-tokens``' output) for a train split of
    ``num_samples`` images: a teacher's random top-2 logits on a 4 x 4 grid, class top-2, whole-image boxes."""
    from vitscale.data.token_labels import TokenLabelWriter

    g = torch.Generator().manual_seed(0)
    w = TokenLabelWriter(root, "train", num_samples, (4, 4), 2, num_classes)
    w.write(torch.arange(num_samples), torch.randn(num_samples, 4, 4, num_classes, generator=g),
            torch.randn(num_samples, num_classes, generator=g))  # fmt: skip
    w.close()
    return root


def _weights(cfg, kind: str, path: Path, *, model: str | None = None, **extra):
    """Tiny weights of ``model`` (default: the recipe's own) at its variant's resolution, written as ``kind``:
    ``timm`` (a ``.pth`` of timm's names), ``open_clip`` (a ``.safetensors`` of open_clip's names),
    ``transformers`` (a snapshot folder that transformers itself writes, ``save_pretrained``, of its own
    random initialisation) or ``vitscale`` (an exported ``.safetensors``); returns the path and the model."""
    from safetensors.torch import save_file

    from vitscale.checkpoint import export_safetensors
    from vitscale.interop import to_open_clip, to_timm

    name = model or cfg.model.name
    size = {**(cfg.model.overrides if model is None else {}), **SHRINK[_family(name)], **extra}
    size = {
        k: v for k, v in size.items() if k not in ("img_h", "img_w")
    }  # the variant's own (pretraining) resolution
    torch.manual_seed(0)
    m = vitscale.create_model(name, **size)
    if kind == "timm":
        torch.save(to_timm(m), path)
    elif kind == "transformers":
        from vitscale.interop.transformers import create_transformers_model, load_transformers

        # transformers' own random weights (not m's), saved by transformers
        create_transformers_model(m, load_weights=False).save_pretrained(path)
        m = load_transformers(path)
    elif kind == "open_clip":
        save_file({k: v.contiguous() for k, v in to_open_clip(m).items()}, path)
    else:
        export_safetensors(m, path, {"model": name, "overrides": json.dumps(size)})
    return path, m


def _starts(source: str) -> str:
    """The format of the weights a recipe names: a timm, LAION or Meta (transformers) Hub id, else vitscale's."""
    return (
        "timm"
        if source.startswith("hf-hub:timm/")
        else "open_clip"
        if source.startswith("hf-hub:laion/")
        else "transformers"
        if source.startswith("hf-hub:facebook/")
        else "vitscale"
    )


def _overrides(name: str, photos: Path, tmp: Path) -> tuple[list[str], dict]:
    """The data paths, the files the recipe starts from and the model's size: everything replaced; and the
    models written as the start (``init``) and the teacher (``teacher``)."""
    cfg = load_config(name)
    over, made = list(RUN) + _dotted("model", SHRINK[_family(cfg.model.name)]), {}
    fmt, n_train, n_classes = cfg.data.format, 12, 2
    if fmt == "imagefolder":
        over += [
            f"data.train_path={photos / 'folder' / 'train'}",
            f"data.val_path={photos / 'folder' / 'val'}",
        ]
    elif fmt == "images":  # your own photos: a flat folder without classes; the labelled folder for the k-NN and probe
        over += [f"data.train_path={photos / 'flat'}", f"data.val_path={photos / 'folder' / 'val'}"]
    elif fmt == "webdataset":
        over += [f"data.train_path={photos / 'wds' / 'train'}", f"data.val_path={photos / 'wds' / 'val'}"]
    elif fmt in ("digits", "digits_aspect"):
        n_train, n_classes = 1497, 10  # the built-in digits: no path to replace
    else:
        raise AssertionError(f"{name}: data.format={fmt}: add its photo data to this test")
    if cfg.train.task == "token_labeling":
        over.append(f"token_label.path={_token_labels(tmp / 'token_labels', n_train, n_classes)}")
    d = getattr(cfg, "distill", None)
    if d is not None and getattr(d, "teachers", None):  # feature distillation: each teacher a tiny file, its other fields kept
        entries = []
        for i, t in enumerate(d.teachers):
            kind = t.format or _starts(t.path)  # a timm file: a .pth of timm's names, its variant named by the entry
            name = t.model or cfg.model.name
            size = {**dict(t.overrides), **SHRINK[_family(name)], "num_classes": dict(t.overrides).get("num_classes", 0)}
            path, made[f"teacher_{t.name}"] = _weights(cfg, kind, tmp / f"teacher{i}{'.pth' if kind == 'timm' else '.safetensors'}",
                                                      model=name, **size)  # fmt: skip
            entry = {**dataclasses.asdict(t), "path": str(path)}
            if t.model:  # the entry names the variant: its overrides are those of the tiny file
                entry["overrides"] = size
            entries.append(entry)
        over.append(f"distill.teachers={json.dumps(entries)}")
    if d is not None and getattr(d, "teacher", None):
        path, made["teacher"] = _weights(cfg, _starts(d.teacher), tmp / "teacher.pth", model=d.teacher_model,
                                         num_classes=n_classes)  # fmt: skip
        over += [
            f"distill.teacher={path}",
            *_dotted("distill.teacher_overrides", SHRINK[_family(d.teacher_model)]),
        ]
    # a fine-tune starts from its pretraining's weights (imagenet_vit_b16_ft512 ships init_from: null, to be set)
    init = cfg.checkpoint.init_from or ("run" if "_ft" in name else None)
    if init and cfg.checkpoint.init_parts:  # a stage that keeps the previous stage's parts: that recipe's own run
        (prev,) = [c for c in CONFIGS if load_config(c).train.output_dir == init]  # the recipe whose run folder it names
        made["previous"] = tmp / "previous"
        (tmp / "previous_files").mkdir(parents=True, exist_ok=True)
        prev_over, _ = _overrides(prev, photos, tmp / "previous_files")
        assert main(["train", prev, *prev_over, "train.max_steps=1", "evals=[]", f"train.output_dir={made['previous']}"]) == 0
        over.append(f"checkpoint.init_from={made['previous']}")
    elif init:
        kind = _starts(init)
        headless = {"num_classes": 0} if kind == "timm" and "in21k" in init else {}  # ImageNet-21k's backbone
        file = {"timm": "init.pth", "transformers": "init"}.get(kind, "init.safetensors")  # transformers: a folder
        path, made["init"] = _weights(cfg, kind, tmp / file, **headless)
        over.append(f"checkpoint.init_from={path}")
    dino = getattr(cfg, "dino", None)
    if dino is not None and dino.freeze_backbone_steps:  # the heads' warm-up: the first of the 2 steps
        over.append("dino.freeze_backbone_steps=1")
    return over, made


@pytest.mark.parametrize("name", CONFIGS)
def test_recipe_trains_and_evaluates_as_it_ships(name, photos, tmp_path, capsys):
    run = tmp_path / "run"
    over, made = _overrides(name, photos, tmp_path)
    rc = main(["train", name, *over, f"train.output_dir={run}"])
    assert rc == 0, capsys.readouterr().err
    shipped, ran = load_config(name), yaml.safe_load((run / "config.yaml").read_text())
    # the recipe's own resolution, augmentation, sampler, loss and evaluation, as it ships
    for section, keys in {
        "data": ("format", "img_size", "auto_augment", "color_jitter", "interpolation", "train_interpolation", "rrc_scale",
                 "hflip", "random_erasing", "mixup_alpha", "cutmix_alpha", "repeated_aug", "crop_pct", "eval_crop_mode"),
        "train": ("task", "loss", "label_smoothing"),
    }.items():  # fmt: skip
        for k in keys:
            want = getattr(getattr(shipped, section), k)
            assert ran[section][k] == (list(want) if isinstance(want, tuple) else want), f"{section}.{k}"
    assert [e["kind"] for e in ran.get("evals") or []] == [e.kind for e in shipped.evals or []]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 2
    scores = [
        k
        for k, v in summary.items()
        if isinstance(v, float | int) and (k.endswith(("top1", "top5")) or "recall@" in k)
    ]
    assert scores and all(0 <= summary[k] <= 100 for k in scores), (
        f"{name}: no evaluation in {sorted(summary)}"
    )
    log = (run / "train.log").read_text()
    if "init" in made:  # every tensor of the start found its place (a headless start: the new head only)
        missing = [line for line in log.splitlines() if "not in the weights" in line]
        assert "tensors from" in log and all(line.endswith(": head.weight, head.bias") for line in missing), (
            log
        )
    for check in CHECKS.get(name, ()):
        check(run, log, made)


def _pos_embed_resampled(run, log, made):
    assert "pos_embed resampled from" in log  # the pretraining's grid to the recipe's own resolution


def _teacher_read(run, log, made):
    assert "distill: teacher vit_l16" in log


def _bce_from_log2(run, log, made):
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if '"loss"' in line]
    assert len(rows) == 2 and all(
        0.3 < r["loss"] < 1.2 for r in rows
    )  # BCE averaged over the 2 classes: log 2 at the start


def _image_tower_locked(run, log, made):
    from safetensors.torch import load_file

    start, end = made["init"].state_dict(), load_file(run / "model.safetensors")
    image = [k for k in start if k.startswith(("visual.", "image_proj."))]
    assert image and all(torch.equal(end[k], start[k]) for k in image)  # locked: not moved
    assert not torch.equal(end["text_proj.weight"], start["text_proj.weight"])  # the text tower trained


def _heads_warm_up_on_the_start(run, log, made):
    """The backbone read from transformers' folder, frozen for step 1 while the heads train, and the teacher
    starting as the student: after step 2 the teacher is ``m s0 + (1 - m) s2`` exactly (``s0`` the start,
    ``s2`` the student after step 2; ``m`` DINOv2's cosine momentum at iteration 1 of 2: a student that
    had moved on step 1 would leave ``(1 - m1) (s1 - s0)`` in it)."""
    import math

    from safetensors.torch import load_file

    assert "(transformers: a transformers Hub snapshot folder" in log
    assert "the backbone frozen for 1 steps" in log
    assert main(["convert", str(run), str(run / "teacher.safetensors"), "--key", "teacher"]) == 0
    start, student = made["init"].state_dict(), load_file(run / "model.safetensors")
    teacher = load_file(run / "teacher.safetensors")
    # iBOT's mask token is not read from a transformers folder (vitscale/models/vit/transformers_adapter.py):
    # it starts at DINOv2's zeros
    start["mask_token"] = torch.zeros_like(student["mask_token"])
    dino = yaml.safe_load((run / "config.yaml").read_text())["dino"]  # the recipe's momentum_teacher -> final
    m0, m1 = dino["momentum_teacher"], dino["final_momentum_teacher"]
    m = m1 + (m0 - m1) * (1 + math.cos(math.pi * 1 / 2)) / 2
    keys = [k for k in student if k != "pos_embed"]  # pos_embed: the start's 518-px table resampled to 224 px
    assert len(keys) == 20 and set(keys) <= set(start)
    assert max((student[k] - start[k]).abs().max().item() for k in keys) > 1e-5  # step 2 moved the backbone
    for k in keys:
        want = m * start[k] + (1 - m) * student[k]
        torch.testing.assert_close(teacher[k], want, rtol=3e-7, atol=1e-8)  # about 2 float32 ulp


def _stage_keeps_the_previous_teacher(run, log, made):
    """The previous stage's teacher kept (its backbone and heads), the student and the Gram teacher starting
    as it, the Gram teacher on crops of its own."""
    assert "checkpoint.init_parts: teacher (" in log and str(made["previous"]) in log
    assert "the Gram teacher starts as the kept teacher's backbone" in log
    assert "the Gram teacher on crops of its own (768/1152/1152/1152/1152 px, undistorted" in log
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if '"loss"' in line]
    assert [r["train_gram_loss_weight"] for r in rows] == [1.5, 1.5] and all("train_gram_loss" in r for r in rows)
    assert [r["train_dino_local_weight"] for r in rows] == [0.5, 0.5]


CHECKS = {  # what else a recipe's own run shows
    "imagenet21k_vit_b16_ft384": (_pos_embed_resampled,),
    "imagenet_vit_b16_ft512": (_pos_embed_resampled,),
    "imagenet_volo_d5_ft512": (_pos_embed_resampled,),
    "imagenet_deit_b_distilled": (_teacher_read,),
    "imagenet_deit3_b16": (_bce_from_log2,),
    "clip_b32_locked_image": (_image_tower_locked,),
    "dino_vits14_continue": (_heads_warm_up_on_the_start,),
    "imagenet_dinov3_vitl16_hires": (_stage_keeps_the_previous_teacher,),
}
