"""open_clip <-> vitscale CLIP with random weights: outputs equal both ways (ViT-B-32, ViT-B-16),
and open_clip checkpoint files load."""

from __future__ import annotations

import json

import open_clip
import pytest
import torch
from helpers import rel_max
from open_clip.model import CLIP as OpenCLIP

from vitscale.interop import from_open_clip, load_open_clip_checkpoint, to_open_clip
from vitscale.interop.open_clip import open_clip_config
from vitscale.models.clip import CLIP
from vitscale.models.clip.state_dict_adapter import config_from_open_clip


def _randomize(model: torch.nn.Module, seed: int) -> None:
    """Overwrite every parameter (LayerNorm weights and biases too) so no layout error can hide.

    One random pool, sliced at a different offset per parameter: random enough, and cheap at B/16 size.
    """
    g = torch.Generator().manual_seed(seed)
    params = list(model.named_parameters())
    pool = torch.randn(max(p.numel() for _, p in params) + 9973, generator=g)
    with torch.no_grad():
        for i, (name, p) in enumerate(params):
            off = (i * 7919) % 9973
            r = pool[off : off + p.numel()].view(p.shape)
            if name == "logit_scale":
                p.fill_(2.5)
            elif p.ndim > 1:
                p.copy_(r * 0.03)
            elif "ln" in name or "norm" in name:
                p.copy_(1.0 + 0.1 * r)
            else:
                p.copy_(0.1 * r)


def _inputs(img_size: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    images = torch.randn(1, 3, img_size, img_size, generator=g)
    tok = open_clip.get_tokenizer("ViT-B-32")
    tokens = tok(["a photo of the number seven", "a diagram of a cat sitting on a mat, drawn in pencil"])
    return images, tokens


def _empty_open_clip(arch: dict) -> torch.nn.Module:
    with torch.device("meta"):
        oc = OpenCLIP(**arch)
    oc = oc.to_empty(device="cpu")
    n = arch["text_cfg"]["context_length"]  # the causal mask is a non-persistent buffer: rebuild it
    oc.attn_mask = torch.full((n, n), float("-inf")).triu_(1)
    return oc.eval()


@pytest.mark.parametrize("name,variant", [("ViT-B-32", "clip_b32"), ("ViT-B-16", "clip_b16")])
@torch.no_grad()
def test_open_clip_parity_both_ways(name, variant):
    import vitscale

    # open_clip -> vitscale
    oc = _empty_open_clip(open_clip.get_model_config(name))
    _randomize(oc, 1)
    ours = from_open_clip(oc).eval()
    assert ours.cfg == vitscale.get_model_config(
        variant
    )  # the registered variant is open_clip's architecture
    images, tokens = _inputs(224)
    img, txt, scale = ours(images, tokens)  # normalised features, as open_clip's forward
    ref = oc(images, tokens)
    assert rel_max(img, ref[0]) < 1e-5 and rel_max(txt, ref[1]) < 1e-5 and torch.allclose(scale, ref[2])
    assert rel_max(ours.text_proj(ours.text(tokens)), oc.encode_text(tokens)) < 1e-5  # unnormalised too

    # vitscale -> open_clip: fresh random weights, loaded strictly into the same open_clip module
    mine = CLIP(vitscale.get_model_config(variant), device="meta").to_empty(device="cpu").eval()
    _randomize(mine, 2)
    sd = to_open_clip(mine)
    assert sd.keys() == oc.state_dict().keys()
    oc.load_state_dict(sd, strict=True)
    images, tokens = _inputs(224, seed=3)
    assert rel_max(oc.encode_image(images), mine.encode_image(images)) < 1e-5
    assert rel_max(oc.encode_text(tokens), mine.encode_text(tokens)) < 1e-5


TINY = {
    "embed_dim": 32,
    "vision_cfg": {"image_size": 32, "layers": 2, "width": 64, "head_width": 16, "patch_size": 8},
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 48, "heads": 4, "layers": 2},
}


@pytest.fixture(scope="module")
def tiny_arch(tmp_path_factory):
    d = tmp_path_factory.mktemp("oc_cfg")
    (d / "vitscale-test-tiny.json").write_text(json.dumps(TINY))
    open_clip.add_model_config(d)
    return "vitscale-test-tiny"


@torch.no_grad()
def test_checkpoint_files_load(tiny_arch, tmp_path):
    torch.manual_seed(0)
    oc = OpenCLIP(**TINY).eval()
    _randomize(oc, 5)
    images, tokens = _inputs(32)
    ref_img, ref_txt = oc.encode_image(images), oc.encode_text(tokens)
    # a DDP-style torch checkpoint ({"state_dict": {"module.…"}}), read with weights_only
    pt = tmp_path / "oc.pt"
    torch.save({"epoch": 3, "state_dict": {"module." + k: v for k, v in oc.state_dict().items()}}, pt)
    # and a safetensors file
    from safetensors.torch import save_file

    st = tmp_path / "oc.safetensors"
    save_file({k: v.contiguous() for k, v in oc.state_dict().items()}, str(st))
    for path in (pt, st):
        model = load_open_clip_checkpoint(path, tiny_arch).eval()
        assert rel_max(model.encode_image(images), ref_img) < 1e-5
        assert rel_max(model.encode_text(tokens), ref_txt) < 1e-5


def test_config_round_trip_and_unsupported():
    import vitscale

    for name in ("clip_debug", "clip_l14", "clip_e14"):
        cfg = vitscale.get_model_config(name)
        kw = open_clip_config(cfg)
        with torch.device("meta"):
            oc = OpenCLIP(**kw)
        assert config_from_open_clip(oc) == cfg, name
    # a vision tower open_clip cannot express is refused, not silently converted
    with pytest.raises(ValueError):
        open_clip_config(
            vitscale.get_model_config("clip_debug", vision={"class_token_length": 8, "pool": "token"})
        )
