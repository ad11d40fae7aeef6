"""Weights people already have, read into vitscale models (``vitscale.interop.pretrained``: what
``checkpoint.init_from``, ``distill.teacher`` and ``vitscale.create_model(pretrained=...)`` use):
files written by timm and open_clip themselves from randomly initialised models, in every form they
take — Hub snapshot folders, ``.safetensors``, ``.bin`` / ``.pth`` pickles — and vitscale's own
files, each loaded and checked against the library model's outputs; the format told by the files'
kind, metadata or names (also of files written before vitscale's per-head projections were renamed),
never guessed; the architecture compared field by field; bad files one line each."""

from __future__ import annotations

import importlib
import os
import pickle

import pytest
import safetensors.torch
import torch

import vitscale
from vitscale.checkpoint import Checkpointer, export_safetensors
from vitscale.errors import UserError
from vitscale.interop import to_timm
from vitscale.interop.pretrained import load_pretrained, read_source
from vitscale.models.registry import get_family

# vit_debug's architecture as timm builds it (hidden 64, MLP 128, 4 heads, 2 blocks, patch 8, 32 px)
TIMM_KW = dict(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4, mlp_ratio=2.0, num_classes=10)
# a small open_clip CLIP, and the vitscale clip_debug overrides of the same architecture
OC_CFG = dict(embed_dim=32, vision_cfg=dict(image_size=16, layers=2, width=64, patch_size=4, head_width=16),
              text_cfg=dict(context_length=16, vocab_size=49408, width=64, heads=4, layers=2))  # fmt: skip
CLIP_KW = {"output_dim": 32, "vision": {"img_h": 16, "img_w": 16, "patch_dim": 4, "ffn_hidden_size": 256},
           "text": {"encoder_seq_length": 16}}  # fmt: skip


@pytest.fixture(scope="module")
def timm_files(tmp_path_factory):
    """A random timm ViT saved by timm's own ``save_for_hf`` (``config.json``, ``model.safetensors``,
    ``pytorch_model.bin``), and the model."""
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    tm = timm.create_model("vit_tiny_patch16_224", pretrained=False, **TIMM_KW).eval()
    hub = tmp_path_factory.mktemp("timm") / "hub"
    timm.models.save_for_hf(tm, str(hub), safe_serialization="both")
    return tm, hub


@pytest.fixture(scope="module")
def open_clip_files(tmp_path_factory):
    """A random open_clip CLIP saved by open_clip's own ``save_for_hf`` (``open_clip_config.json``,
    ``open_clip_model.safetensors``, ``open_clip_pytorch_model.bin``), and the model."""
    pytest.importorskip("open_clip")
    from open_clip.model import CLIP

    save_for_hf = importlib.import_module("open_clip.push_to_hf_hub").save_for_hf
    torch.manual_seed(0)
    oc = CLIP(**OC_CFG).eval()
    oc.visual.image_mean, oc.visual.image_std = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)  # as open_clip's factory sets them

    class NoTokenizerFiles:  # the weights and config are what is read; the tokenizer's files are not
        def save_pretrained(self, folder):
            pass

    hub = tmp_path_factory.mktemp("open_clip") / "hub"
    save_for_hf(oc, NoTokenizerFiles(), OC_CFG, str(hub), safe_serialization="both")
    return oc, hub


def _images(n=2, side=32):
    return torch.randn(n, 3, side, side, generator=torch.Generator().manual_seed(1))


def _vit(**kw):
    return vitscale.create_model("vit_debug", **kw).eval()


# ----------------------------------------------------------------------------- timm
def test_timm_hub_folder_loads_exactly(timm_files):
    tm, hub = timm_files
    src = read_source(str(hub), get_family("vit"))
    assert (src.format, src.path.name) == ("timm", "model.safetensors") and "config.json" in src.why
    assert src.preprocess["img_size"] == (32, 32) and src.preprocess["interpolation"] == "bicubic"
    model = _vit()
    _, lines, _ = load_pretrained(model, str(hub))
    x = _images()
    with torch.no_grad():
        torch.testing.assert_close(model(x), tm(x), rtol=1e-5, atol=1e-5)
    assert lines[0].startswith("checkpoint.init_from: ") and "timm" in lines[0] and len(lines) == 1


def test_timm_pickle_and_bare_safetensors_are_told_by_their_names(timm_files, tmp_path):
    tm, hub = timm_files
    x = _images()
    # pytorch_model.bin, written by timm with torch.save: a pickle is never vitscale's (vitscale writes none)
    model = _vit()
    load_pretrained(model, str(hub / "pytorch_model.bin"))
    with torch.no_grad():
        torch.testing.assert_close(model(x), tm(x), rtol=1e-5, atol=1e-5)
    # a training checkpoint's layout (timm train.py: {"state_dict": ..., "arch": ...}) as .pth.tar
    torch.save({"state_dict": tm.state_dict(), "arch": "vit_tiny_patch16_224", "epoch": 3}, tmp_path / "ckpt.pth.tar")
    assert read_source(str(tmp_path / "ckpt.pth.tar"), get_family("vit")).format == "timm"
    # model.safetensors alone, no metadata: timm's names (attn.qkv, not vitscale's attn.qkv_per_head) say timm
    bare = tmp_path / "model.safetensors"
    safetensors.torch.save_file(tm.state_dict(), str(bare))
    src = read_source(str(bare), get_family("vit"))
    assert (src.format, src.why) == ("timm", "timm's naming")
    model = _vit()
    _, lines, _ = load_pretrained(model, str(bare))
    assert "(timm: timm's naming)" in lines[0]
    with torch.no_grad():
        torch.testing.assert_close(model(x), tm(x), rtol=1e-5, atol=1e-5)


def test_position_embeddings_resampled_and_classifier_reinitialised(timm_files):
    timm = pytest.importorskip("timm")
    tm, hub = timm_files
    model = _vit(img_h=64, img_w=64, num_classes=3)
    head = model.head.weight.detach().clone()
    _, lines, _ = load_pretrained(model, str(hub))
    assert any("pos_embed resampled from 1x17x64 to 1x65x64" in line for line in lines)
    assert any("classifier re-initialised: head.weight is 10x64 in the weights, 3x64 here" in line for line in lines)
    assert torch.equal(model.head.weight, head)
    # the features on 64 px images are timm's with its position embeddings resampled the same way
    ref = timm.create_model("vit_tiny_patch16_224", pretrained=False, **{**TIMM_KW, "dynamic_img_size": True}).eval()
    ref.load_state_dict(tm.state_dict())
    x = _images(side=64)
    with torch.no_grad():
        torch.testing.assert_close(model(x, pre_logits=True), ref.forward_head(ref.forward_features(x), pre_logits=True),
                                   rtol=1e-4, atol=1e-4)  # fmt: skip


def test_deit_distillation_token_weights_from_timm(tmp_path):
    """timm's ``VisionTransformerDistilled`` (DeiT) into a ViT with ``distill_token``: the heads'
    mean at evaluation, both heads with ``distill=True``, as timm computes them."""
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    tm = timm.models.deit.VisionTransformerDistilled(**TIMM_KW).eval()
    torch.save(tm.state_dict(), tmp_path / "deit.pth")
    with pytest.raises(UserError, match=r"distill_token=True; the model .* has distill_token=False.*model.distill_token=true"):
        load_pretrained(_vit(), str(tmp_path / "deit.pth"))
    model = _vit(distill_token=True)
    load_pretrained(model, str(tmp_path / "deit.pth"))
    x = _images()
    with torch.no_grad():
        torch.testing.assert_close(model(x), tm(x), rtol=1e-5, atol=1e-5)
        tm.set_distilled_training(True)
        cls, dist = tm.train()(x)
        ours = model.train()(x, distill=True)
    torch.testing.assert_close(ours[0], cls, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours[1], dist, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- open_clip
@pytest.mark.parametrize("which", ["hub", "open_clip_model.safetensors", "open_clip_pytorch_model.bin"])
def test_open_clip_files_load_exactly(open_clip_files, which):
    oc, hub = open_clip_files
    given = hub if which == "hub" else hub / which
    src = read_source(str(given), get_family("clip"))
    assert src.format == "open_clip"  # open_clip's names are its own: told without asking
    if which == "hub":
        assert src.preprocess["mean"] == (0.5, 0.5, 0.5) and src.preprocess["std"] == (0.25, 0.25, 0.25)
    model = vitscale.create_model("clip_debug", pretrained=str(given), **CLIP_KW)
    x, t = _images(side=16), torch.randint(0, 49408, (2, 16), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(model.encode_image(x), oc.encode_image(x), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(model.encode_text(t), oc.encode_text(t), rtol=1e-5, atol=1e-5)


def test_open_clip_lock_groups_are_open_clips(open_clip_files):
    """``lock_image_tower`` / ``lock_text_tower`` with N unlocked groups freeze exactly the parameters
    open_clip's own locks freeze (compared through the adapter's name mapping)."""
    from vitscale.interop import from_open_clip
    from vitscale.models.clip.state_dict_adapter import state_dict_from_open_clip

    oc, _ = open_clip_files
    for image, text in ((0, None), (2, None), (None, 0), (None, 1), (1, 3)):
        for p in oc.parameters():
            p.requires_grad_(True)
        ours = from_open_clip(oc)
        if image is not None:
            oc.lock_image_tower(unlocked_groups=image)
            ours.lock_image_tower(image)
        if text is not None:
            oc.lock_text_tower(unlocked_layers=text)
            ours.lock_text_tower(text)
        flags = {k: torch.full_like(v, float(v.requires_grad)) for k, v in oc.named_parameters()}
        want = {k: bool(v.flatten()[0]) for k, v in state_dict_from_open_clip(flags, ours.cfg).items()}
        got = {n: p.requires_grad for n, p in ours.named_parameters()}
        assert got == want, (image, text, sorted(k for k in got if got[k] != want[k])[:5])


# ----------------------------------------------------------------------------- vitscale's own
def test_vitscale_files_and_folders(tmp_path):
    torch.manual_seed(0)
    src_model = _vit()
    ck = Checkpointer(tmp_path / "run" / "checkpoints", keep=1)
    ck.save(4, {"model": src_model.state_dict()}, {"step": 4, "data": {}})
    export_safetensors(src_model, tmp_path / "model.safetensors", {"model": "vit_debug", "overrides": "{}"})
    x = _images()
    with torch.no_grad():
        want = src_model(x)
    for given in (tmp_path / "run", tmp_path / "run" / "checkpoints" / "step_00000004", tmp_path / "model.safetensors"):
        src = read_source(str(given), get_family("vit"))
        assert src.format == "vitscale", given
        model = _vit()
        load_pretrained(model, str(given))
        with torch.no_grad():
            torch.testing.assert_close(model(x), want, rtol=0, atol=0)
    assert read_source(str(tmp_path / "model.safetensors"), get_family("vit")).model == "vit_debug"
    # its own metadata says vitscale: a contradicting format is refused
    with pytest.raises(UserError, match="carries vitscale's metadata"):
        read_source(str(tmp_path / "model.safetensors"), get_family("vit"), "timm")
    # vitscale's tensors as a bare .safetensors (no metadata): its names (attn.qkv_per_head) say vitscale
    safetensors.torch.save_file(src_model.state_dict(), str(tmp_path / "bare.safetensors"))
    src = read_source(str(tmp_path / "bare.safetensors"), get_family("vit"))
    assert (src.format, src.why) == ("vitscale", "vitscale's naming")
    model = _vit()
    load_pretrained(model, str(tmp_path / "bare.safetensors"))
    with torch.no_grad():
        torch.testing.assert_close(model(x), want, rtol=0, atol=0)


def _former(sd: dict) -> dict:
    """A state dict as vitscale wrote it before its per-head projections had names of their own."""
    from vitscale.param_names import former_name

    return {former_name(k): v for k, v in sd.items()}


def test_weights_written_before_the_rename_still_load(tmp_path):
    """Run folders, checkpoints and exports written under the former names (``attn.qkv``, ...) are
    vitscale's by their kind or metadata and load renamed; a bare file of them is timm's by its names
    unless told (``init_format=vitscale``), or vitscale's where timm never writes such names."""
    from vitscale.checkpoint import load_model_weights, write_weights

    torch.manual_seed(0)
    x = _images()
    old = _vit()
    with torch.no_grad():
        want = old(x)
    sd = _former(old.state_dict())
    assert "blocks.0.attn.qkv.weight" in sd and not any("per_head" in k for k in sd)
    Checkpointer(tmp_path / "run" / "checkpoints", keep=1).save(4, {"model": sd}, {"step": 4, "data": {}})
    write_weights(sd, tmp_path / "export.safetensors", {"model": "vit_debug", "overrides": "{}"})
    for given in (tmp_path / "run", tmp_path / "export.safetensors"):
        model = _vit()
        src, lines, _ = load_pretrained(model, str(given))
        assert src.format == "vitscale" and "4 tensors under their former names (before the *_per_head rename: blocks.0.attn.qkv.bias, ...) renamed" in lines[0], lines
        with torch.no_grad():
            torch.testing.assert_close(model(x), want, rtol=0, atol=0)
    model = _vit()  # what vitscale eval / export / a teacher load: straight into the model
    load_model_weights(model, sd, strict=True)
    with torch.no_grad():
        torch.testing.assert_close(model(x), want, rtol=0, atol=0)
    # no metadata: timm's names, so timm's layout, unless the format is named
    safetensors.torch.save_file(sd, str(tmp_path / "bare.safetensors"))
    assert read_source(str(tmp_path / "bare.safetensors"), get_family("vit")).format == "timm"
    model = _vit()
    load_pretrained(model, str(tmp_path / "bare.safetensors"), "vitscale")
    with torch.no_grad():
        torch.testing.assert_close(model(x), want, rtol=0, atol=0)
    # names timm never writes tell a bare file: a ViT-22B block's norm beside in_proj (timm: in_norm),
    # registers inside cls_token (timm: reg_token), a CLIP in vitscale's naming
    for name, kw in (("vit_debug", {"parallel_block": True}), ("vit_debug", {"class_token_length": 3}), ("clip_debug", {})):
        old = vitscale.create_model(name, **kw).eval()
        path = tmp_path / f"{name}_{len(kw)}_{'_'.join(kw)}.safetensors"
        safetensors.torch.save_file(_former(old.state_dict()), str(path))
        model = vitscale.create_model(name, pretrained=str(path), **kw)
        assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), old.state_dict().values())), (name, kw)
    # only names the model asks for are mapped: a module of its own called qkv keeps its name
    from vitscale.param_names import with_current_names

    assert with_current_names({"attn.qkv.weight": 1}, {"attn.qkv.weight"}) == ({"attn.qkv.weight": 1}, [])


def test_create_model_pretrained_takes_the_weights_classes(timm_files):
    tm, hub = timm_files
    model = vitscale.create_model("vit_debug", pretrained=str(hub / "pytorch_model.bin"))
    assert model.num_classes == 10 and not model.training
    with pytest.warns(UserWarning, match="classifier re-initialised"):
        vitscale.create_model("vit_debug", pretrained=str(hub), num_classes=4)


# ----------------------------------------------------------------------------- refused, one line each
def test_another_architecture_names_the_first_field(timm_files, tmp_path):
    tm, hub = timm_files
    with pytest.raises(UserError) as e:
        load_pretrained(_vit(hidden_size=96, num_attention_heads=4), str(hub))
    assert "holds a vit with hidden_size=64; the model (model.name with model.overrides) has hidden_size=96" in str(e.value)
    assert "set model.hidden_size=64" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(UserError, match=r"num_layers=2; .* has num_layers=3"):
        load_pretrained(_vit(num_layers=3), str(hub))
    # a CLIP's weights for a ViT: named as what they look like
    safetensors.torch.save_file(vitscale.create_model("clip_debug").state_dict(), str(tmp_path / "clip.safetensors"))
    with pytest.raises(UserError, match=r"are none the vit family reads; they look like a vitscale clip"):
        read_source(str(tmp_path / "clip.safetensors"), get_family("vit"))
    # a timm ViT's for a CLIP
    torch.save(to_timm(_vit()), tmp_path / "vit.pth")
    with pytest.raises(UserError, match="they look like a timm vit"):
        read_source(str(tmp_path / "vit.pth"), get_family("clip"))


def test_damaged_files_are_one_line(tmp_path, timm_files):
    tm, hub = timm_files
    data = (hub / "model.safetensors").read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(UserError) as e:
        load_pretrained(_vit(), str(tmp_path / "cut.safetensors"), "timm")
    assert "truncated" in str(e.value) and "\n" not in str(e.value)
    data = (hub / "pytorch_model.bin").read_bytes()
    (tmp_path / "cut.pth").write_bytes(data[: len(data) // 2])
    with pytest.raises(UserError, match=r"not a readable PyTorch file \(truncated or damaged\?\)") as e:
        load_pretrained(_vit(), str(tmp_path / "cut.pth"))
    assert "\n" not in str(e.value)
    with pytest.raises(UserError, match="no such file or folder"):
        load_pretrained(_vit(), str(tmp_path / "nowhere.pth"))
    (tmp_path / "weights.npz").write_bytes(b"x")
    with pytest.raises(UserError, match="not a weights file vitscale reads"):
        load_pretrained(_vit(), str(tmp_path / "weights.npz"))


class _Payload:
    """Unpickling this would create a folder: ``torch.load(weights_only=True)`` must refuse it first."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.makedirs, (self.path,))


def test_a_pickle_holding_code_is_refused_and_never_runs(tmp_path):
    marker = tmp_path / "ran"
    torch.save({"blocks.0.attn.qkv.weight": torch.zeros(3), "x": _Payload(str(marker))}, tmp_path / "evil.pth")
    with open(tmp_path / "evil_plain.pth", "wb") as f:  # the legacy (non-zip) pickle format too
        pickle.dump({"x": _Payload(str(marker))}, f, protocol=2)
    for name in ("evil.pth", "evil_plain.pth"):
        with pytest.raises(UserError) as e:
            load_pretrained(_vit(), str(tmp_path / name))
        assert "refused by torch.load(weights_only=True)" in str(e.value) and "makedirs" in str(e.value)
        assert "\n" not in str(e.value)
    assert not marker.exists()


def test_every_pickle_is_read_by_the_one_bounded_reader():
    """Every tensor read from a file goes through one bounded reader (docs/trust.md, round four): no
    module of vitscale calls ``torch.load`` but ``vitscale.interop.pretrained.read_pickle`` (and the
    ``.pt2`` archive check, which only tries each member and keeps nothing). TokenLabeling's label
    files called it themselves, so a stride-0 file asked for 16 GB."""
    import ast
    from pathlib import Path

    root = Path(__file__).parents[2] / "vitscale"
    allowed = {"interop/pretrained.py", "export/pt2.py"}

    def loads(path: Path) -> list[int]:
        return [n.lineno for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Call)
                and isinstance(n.func, ast.Attribute) and n.func.attr == "load"
                and isinstance(n.func.value, ast.Name) and n.func.value.id == "torch"]  # fmt: skip

    calls = [f"{p.relative_to(root)}:{n}" for p in root.rglob("*.py") if str(p.relative_to(root)) not in allowed
             for n in loads(p)]  # fmt: skip
    assert not calls, f"torch.load outside the bounded reader (use vitscale.interop.pretrained.read_pickle): {calls}"
    assert loads(root / "interop/pretrained.py")  # the reader itself is found: the scan can fail
