"""Hugging Face ``transformers`` snapshot folders both ways: random-weight models written by
``transformers`` itself (``save_pretrained``; nothing downloaded, 2 blocks of width 32) are read by
vitscale with no flag — :func:`vitscale.interop.transformers.load_transformers`,
``vitscale.create_model(pretrained=folder)`` and ``load_pretrained`` (what ``checkpoint.init_from`` and
``distill.teacher`` call) — and give the transformers model's outputs within 1e-5; vitscale writes them
back (``write_transformers_folder``, ``vitscale convert --to transformers``) as folders that
``from_pretrained`` loads with the same outputs. Folders that cannot be read are one-line refusals."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import randomize, rel_max

import vitscale
from vitscale.errors import UserError
from vitscale.interop.pretrained import load_pretrained
from vitscale.interop.transformers import load_transformers, write_transformers_folder

T = pytest.importorskip("transformers")
# importing transformers' model classes costs ~7 s of CPU (its own imports); each test is under a second
pytestmark = pytest.mark.slow

SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, image_size=32, patch_size=8)
TOL = 1e-5
# name -> (config class, model class, config changes)
CASES = {
    "vit": ("ViTConfig", "ViTModel", {}),
    "vit_classifier": ("ViTConfig", "ViTForImageClassification", {"num_labels": 5}),
    "vit_mae": ("ViTMAEConfig", "ViTMAEModel", {"mask_ratio": 0.0}),
    "dinov2": ("Dinov2Config", "Dinov2Model", {}),
    "dinov2_swiglu": ("Dinov2Config", "Dinov2Model", {"use_swiglu_ffn": True}),
    "dinov2_registers": ("Dinov2WithRegistersConfig", "Dinov2WithRegistersModel", {"num_register_tokens": 2}),
    "dinov3": ("DINOv3ViTConfig", "DINOv3ViTModel", {"num_register_tokens": 2}),
    "dinov3_gated": ("DINOv3ViTConfig", "DINOv3ViTModel", {"num_register_tokens": 1, "use_gated_mlp": True, "hidden_act": "silu"}),
    "clip": ("CLIPVisionConfig", "CLIPVisionModel", {}),
    "siglip": ("SiglipVisionConfig", "SiglipVisionModel", {}),
}


def hf_folder(tmp_path, case: str, **changes):
    """A transformers folder of random weights (``save_pretrained``) and the model loaded back from it."""
    cfg_cls, model_cls, extra = CASES[case]
    kw = {**SMALL, **extra, **changes}
    if cfg_cls.startswith("Dinov2"):
        kw.pop("intermediate_size")  # DINOv2 sizes its MLP by mlp_ratio
    model = getattr(T, model_cls)(getattr(T, cfg_cls)(**kw))
    randomize(model)
    folder = tmp_path / case
    model.save_pretrained(folder)
    return folder, getattr(T, model_cls).from_pretrained(folder).eval()


def hf_outputs(hf, x):
    """(tokens, pooled or logits) of a transformers model; MAE's encoder with its patches in order."""
    kw = {"noise": torch.arange(16.0).expand(len(x), 16)} if type(hf).__name__ == "ViTMAEModel" else {}
    with torch.no_grad():
        out = hf(pixel_values=x, **kw)
    if hasattr(out, "logits"):
        return None, out.logits
    return out.last_hidden_state, getattr(out, "pooler_output", None)


def our_outputs(model, x):
    with torch.no_grad():
        if model.num_classes:
            return None, model(x)
        return model.forward_features(x), model(x, pre_logits=True)


@pytest.mark.parametrize("case", sorted(CASES))
def test_folders_read_and_written_within_1e5(tmp_path, case):
    folder, hf = hf_folder(tmp_path, case)
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    ref_tokens, ref_pooled = hf_outputs(hf, x)
    ours = load_transformers(folder)
    tokens, pooled = our_outputs(ours, x)
    if ref_tokens is not None:
        assert rel_max(tokens, ref_tokens) < TOL
    if ref_pooled is not None:
        assert rel_max(pooled, ref_pooled) < TOL
    back = write_transformers_folder(ours, tmp_path / "back")
    arch = json.loads((back / "config.json").read_text())["architectures"][0]
    again = getattr(T, arch).from_pretrained(back).eval()
    tokens2, pooled2 = hf_outputs(again, x)
    if ref_tokens is not None:
        assert rel_max(tokens2, ref_tokens) < TOL
    if ref_pooled is not None and type(again).__name__ != "ViTModel":  # ViTModel's pooler: ours has none unless read
        assert rel_max(pooled2, ref_pooled) < TOL


def test_create_model_and_init_from_read_a_folder_with_no_flag(tmp_path):
    folder, hf = hf_folder(tmp_path, "dinov2_registers")
    x = torch.randn(2, 3, 32, 32)
    ref = hf_outputs(hf, x)[1]
    shape = dict(hidden_size=32, num_layers=2, num_attention_heads=2, ffn_hidden_size=128, patch_dim=8, img_h=32, img_w=32,
                 class_token_length=3)  # fmt: skip
    model = vitscale.create_model("vit_s14_reg4_dinov2", pretrained=str(folder), **shape)
    assert rel_max(our_outputs(model, x)[1], ref) < TOL
    # checkpoint.init_from / distill.teacher: load_pretrained, every tensor from the folder
    target = vitscale.create_model("vit_s14_reg4_dinov2", **shape)
    src, lines, _ = load_pretrained(target, str(folder), complete=True)
    assert src.format == "transformers" and "transformers Hub snapshot folder (config.json)" in lines[0]
    assert rel_max(our_outputs(target.eval(), x)[1], ref) < TOL
    # a setting the weights do not show, refused with what to set
    with pytest.raises(UserError, match=r"its config.json gives norm_eps=1e-06, the model has norm_eps=1e-05: set norm_eps=1e-06"):
        vitscale.create_model("vit_s14_reg4_dinov2", pretrained=str(folder), **shape, norm_eps=1e-5)


def test_refusals_are_one_line(tmp_path):
    folder, _ = hf_folder(tmp_path, "vit")
    cfg = json.loads((folder / "config.json").read_text())
    # config.json and the weights disagree: another width, a tensor missing
    (folder / "config.json").write_text(json.dumps({**cfg, "intermediate_size": 128}))
    with pytest.raises(UserError) as e:
        load_transformers(folder)
    assert "\n" not in str(e.value) and "blocks.0.mlp.fc1.weight" in str(e.value)
    (folder / "config.json").write_text(json.dumps(cfg))
    from safetensors.torch import load_file, save_file

    sd = load_file(folder / "model.safetensors")
    del sd["encoder.layer.1.output.dense.weight"]
    save_file(sd, folder / "model.safetensors", {"format": "pt"})
    with pytest.raises(UserError, match=r"encoder\.layer\.1\.output\.dense\.weight|blocks\.1\.mlp\.fc2\.weight") as e:
        load_transformers(folder)
    assert "\n" not in str(e.value)
    # a model type vitscale's ViT does not express, and a setting it has no equivalent of
    (folder / "config.json").write_text(json.dumps({**cfg, "model_type": "swin"}))
    with pytest.raises(UserError, match=r"transformers model_type 'swin' is not one vitscale's ViT reads"):
        load_transformers(folder)
    (folder / "config.json").write_text(json.dumps({**cfg, "hidden_act": "gelu_10"}))
    with pytest.raises(UserError, match=r"hidden_act 'gelu_10'"):
        load_transformers(folder)
    # written: what transformers' model cannot express is named, and nothing is written
    for overrides, what in (({"norm_type": "rmsnorm"}, "norms other than LayerNorm"),
                            ({"parallel_block": True, "qk_norm": True}, "ViT-22B blocks"),
                            ({"pool": "avg"}, "the final norm after avg pooling")):  # fmt: skip
        model = vitscale.create_model("vit_debug", num_classes=0, **overrides)
        with pytest.raises(UserError, match=what):
            write_transformers_folder(model, tmp_path / "out")
        assert not (tmp_path / "out").exists()


def test_clip_model_both_towers(tmp_path):
    vision = {k: v for k, v in SMALL.items()}
    text = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, vocab_size=100,
                max_position_embeddings=16, eos_token_id=99, bos_token_id=98)  # fmt: skip
    hf = T.CLIPModel(T.CLIPConfig(vision_config=vision, text_config=text, projection_dim=24))
    randomize(hf)
    hf.save_pretrained(tmp_path / "clip")
    hf = T.CLIPModel.from_pretrained(tmp_path / "clip").eval()
    x = torch.randn(2, 3, 32, 32)
    ids = torch.randint(1, 98, (2, 16), generator=torch.Generator().manual_seed(0))
    ids[0, 9], ids[1, 15] = 99, 99  # the end-of-text token, where the text is pooled

    def features(model):
        with torch.no_grad():
            i, t = model.get_image_features(pixel_values=x), model.get_text_features(input_ids=ids)
        return getattr(i, "pooler_output", i), getattr(t, "pooler_output", t)

    ref_image, ref_text = features(hf)
    ours = load_transformers(tmp_path / "clip")
    assert type(ours).__name__ == "CLIP" and ours.cfg.output_dim == 24
    with torch.no_grad():
        assert rel_max(ours.encode_image(x), ref_image) < TOL and rel_max(ours.encode_text(ids), ref_text) < TOL
    # the same folder read by create_model into a CLIP variant with the folder's shapes
    shape = {"vision": dict(hidden_size=32, num_layers=2, num_attention_heads=2, ffn_hidden_size=64, patch_dim=8, img_h=32,
                            img_w=32, activation="quick_gelu"),
             "text": dict(hidden_size=32, num_layers=2, num_attention_heads=2, ffn_hidden_size=64, vocab_size=100,
                          encoder_seq_length=16, activation="quick_gelu"), "output_dim": 24}  # fmt: skip
    model = vitscale.create_model("clip_debug", pretrained=str(tmp_path / "clip"), **shape)
    with torch.no_grad():
        assert rel_max(model.encode_text(ids), ref_text) < TOL
    again = T.CLIPModel.from_pretrained(write_transformers_folder(ours, tmp_path / "back")).eval()
    image, txt = features(again)
    assert rel_max(image, ref_image) < TOL and rel_max(txt, ref_text) < TOL
