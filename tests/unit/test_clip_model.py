"""CLIP model: every variant's parameter count vs open_clip, debug forward/backward, API, tokenizer."""

from __future__ import annotations

import math

import pytest
import torch

import vitscale
from vitscale.models.clip import CLIP

OPEN_CLIP_NAMES = {
    "clip_b32": "ViT-B-32", "clip_b16": "ViT-B-16", "clip_l14": "ViT-L-14", "clip_h14": "ViT-H-14",
    "clip_g14": "ViT-g-14", "clip_bigg14": "ViT-bigG-14", "clip_e14": "ViT-e-14",
}  # fmt: skip


def _count(m: torch.nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


@pytest.mark.parametrize("name", list(OPEN_CLIP_NAMES))
def test_param_count_matches_open_clip(name):
    import open_clip
    from open_clip.model import CLIP as OpenCLIP

    with torch.device("meta"):
        ref = OpenCLIP(**open_clip.get_model_config(OPEN_CLIP_NAMES[name]))
    ours = vitscale.create_model(name, device="meta")
    assert abs(_count(ours) / _count(ref) - 1) < 0.005, (name, _count(ours), _count(ref))


def test_registered_with_contrastive_task():
    fam = vitscale.models.get_family("clip_b32")
    assert fam.name == "clip" and fam.task == "contrastive" and fam.model_cls is CLIP
    assert set(vitscale.list_models(family="clip")) == {"clip_debug", *OPEN_CLIP_NAMES}


def test_debug_forward_backward_and_api():
    torch.manual_seed(0)
    m = vitscale.create_model("clip_debug")
    tok = vitscale.create_tokenizer("clip")
    images = torch.randn(3, 3, 32, 32)
    tokens = tok(["a photo of the number one", "two", "a blurry photo of the number nine"])
    img, txt, scale = m(images, tokens)
    assert img.shape == txt.shape == (3, 64)
    assert torch.allclose(img.norm(dim=-1), torch.ones(3)) and torch.allclose(txt.norm(dim=-1), torch.ones(3))
    assert math.isclose(scale.item(), 1 / 0.07, rel_tol=1e-5)
    (scale * img @ txt.t()).logsumexp(-1).sum().backward()
    missing = [n for n, p in m.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert not missing, missing
    out = m(images, tokens, output_dict=True)
    assert set(out) == {"image_features", "text_features", "logit_scale"}
    # the uniform API: image embedding through forward_features / forward_head
    assert torch.allclose(m.forward_head(m.forward_features(images), pre_logits=True), m.encode_image(images))
    assert "logit_scale" in m.no_weight_decay() and "text.pos_embed" in m.no_weight_decay()
    m.reset_classifier(5)
    assert m.forward_head(m.forward_features(images)).shape == (3, 5)


def test_logit_scale_clamped_and_siglip_bias():
    m = vitscale.create_model("clip_debug", logit_scale_init=math.log(1000.0), logit_bias_init=-10.0)
    out = m(torch.randn(1, 3, 32, 32), torch.zeros(1, 77, dtype=torch.long), output_dict=True)
    assert out["logit_scale"].item() == 100.0 and out["logit_bias"].item() == -10.0


def test_text_is_causal_and_pooled_at_eot():
    torch.manual_seed(0)
    m = vitscale.create_model("clip_debug").eval()
    tok = vitscale.create_tokenizer("clip")
    t = tok(["a photo of a dog"])
    eot = int(t.argmax())
    t2 = t.clone()
    t2[0, eot + 1 :] = 7  # change tokens after the end of text: causal attention ignores them
    with torch.no_grad():
        assert torch.allclose(m.encode_text(t), m.encode_text(t2), atol=1e-6)
        t3 = t.clone()
        t3[0, 1] = 1000  # another token before the end changes the features
        assert (m.encode_text(t, normalize=True) - m.encode_text(t3, normalize=True)).abs().max() > 1e-3


def test_grad_checkpointing_same_output_and_meta_init():
    torch.manual_seed(0)
    m = vitscale.create_model("clip_debug")
    images, tokens = torch.randn(2, 3, 32, 32), torch.randint(1, 400, (2, 77))
    a = m(images, tokens)
    m.set_grad_checkpointing(True)
    b = m(images, tokens)
    assert all(torch.allclose(x, y) for x, y in zip(a, b))
    meta = vitscale.create_model("clip_debug", device="meta")
    meta.to_empty(device="cpu")
    meta.init_weights()
    assert all(torch.isfinite(p).all() for p in meta.parameters())
    assert meta.cfg.image_mean == (0.48145466, 0.4578275, 0.40821073)  # NeMo image_mean (OpenAI's)


def test_nemo_vision_options():
    # NeMo's default 8 class tokens, global average pooling, patch dropout and drop path
    m = vitscale.create_model(
        "clip_debug",
        vision={"class_token_length": 8, "pool": "avg", "drop_patch_rate": 0.5, "drop_path_rate": 0.1},
    )
    assert m.visual.cls_token.shape[1] == 8
    m.train()
    assert m.encode_image(torch.randn(2, 3, 32, 32)).shape == (2, 64)
    assert m.visual.forward_features(torch.randn(2, 3, 32, 32)).shape[1] == 8 + 8  # 16 patches, half kept


def test_tokenizer_matches_open_clip():
    from open_clip.tokenizer import SimpleTokenizer

    texts = [
        "a photo of the number seven", "Hello, World!!  it's 2024 &amp; café naïve 東京 🙂", "",
        "x" * 300, " ".join(["word"] * 100), "<start_of_text>hi<end_of_text>",
        "Don't you'll we've I'm 3.14159 e-mail foo_bar", "ｆｕｌｌｗｉｄｔｈ Ünïcödé straße ΑΒΓ\n\ttabs",
    ]  # fmt: skip
    ours = vitscale.create_tokenizer("clip")
    assert torch.equal(ours(texts), SimpleTokenizer()(texts))
    assert ours(texts).shape == (8, 77) and ours(texts).dtype == torch.long
    assert ours(texts[3])[0, -1] == ours.eot_token_id  # truncation ends in end-of-text
    assert ours.decode(ours.encode("a photo of the number seven")).strip() == "a photo of the number seven"


def test_zero_dim_logit_scale_loads():
    # open_clip and older checkpoints store the temperature 0-dim; the model keeps it 1-D for FSDP2
    m = vitscale.create_model("clip_debug")
    sd = m.state_dict()
    sd["logit_scale"] = torch.tensor(2.0)
    m.load_state_dict(sd, strict=True)
    assert m.logit_scale.shape == (1,) and m.logit_scale.item() == 2.0
