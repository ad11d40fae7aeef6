"""Hugging Face ``transformers`` ``CLIPModel`` snapshot folders <-> vitscale's CLIP, both ways.

The image tower is the ViT family's (``vitscale/models/vit/transformers_adapter.py``, a
``CLIPVisionModel`` under ``vision_model.``); the text tower's blocks have the same names under
``text_model.encoder.layers`` (query / key / value joined per head as there), its embeddings are
``text_model.embeddings.token_embedding`` and ``position_embedding`` (an ``nn.Embedding``: ``(L, D)``,
vitscale ``(1, L, D)``), its final norm ``final_layer_norm``; the projections are bias-free
``visual_projection`` / ``text_projection`` (vitscale ``image_proj`` / ``text_proj``, the same
matrices), ``logit_scale`` a scalar (vitscale keeps it 1-D). transformers pools the text at the first
end-of-text token (``eos_token_id``, the highest id of CLIP's vocabulary), which is vitscale's
``argmax`` pooling.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

import torch

from ..common.renames import PASS_THROUGH, Rename, RenameTable, convert
from ..vit import transformers_adapter as vit_hf
from .configs import CLIPConfig, CLIPTextConfig

_TEXT = "text_model.encoder.layers"


def recognizes(sd: Collection[str]) -> bool:
    """A transformers ``CLIPModel`` state dict (both towers)."""
    return "text_model.embeddings.token_embedding.weight" in sd and "vision_model.embeddings.class_embedding" in sd


def config_from_transformers(hf: Mapping[str, Any]) -> CLIPConfig:
    """The :class:`CLIPConfig` of a ``CLIPModel`` ``config.json`` (ValueError naming what cannot be expressed)."""
    if hf.get("model_type") != "clip" or not isinstance(hf.get("text_config"), Mapping):
        raise ValueError(f"model_type {hf.get('model_type')!r}: vitscale's CLIP reads transformers' CLIPModel (model_type 'clip')")
    t = hf["text_config"]
    act = t.get("hidden_act", "quick_gelu")
    if act not in vit_hf._ACTS:
        raise ValueError(f"text hidden_act {act!r}")
    text = CLIPTextConfig(
        encoder_seq_length=int(t.get("max_position_embeddings", 77)), vocab_size=int(t.get("vocab_size", 49408)),
        num_layers=int(t["num_hidden_layers"]), hidden_size=int(t["hidden_size"]), ffn_hidden_size=int(t["intermediate_size"]),
        num_attention_heads=int(t["num_attention_heads"]), norm_eps=float(t.get("layer_norm_eps", 1e-5)),
        attention_dropout=float(t.get("attention_dropout", 0.0)), activation=vit_hf._ACTS[act],
    )  # fmt: skip
    return CLIPConfig(vision=vit_hf.config_from_transformers(hf), text=text, output_dim=int(hf.get("projection_dim", 512)))


def transformers_config(cfg: CLIPConfig) -> dict[str, Any]:
    """The ``config.json`` of the transformers ``CLIPModel`` equivalent to ``cfg``."""
    vision = vit_hf.transformers_config(cfg.vision, "clip_vision_model")
    vision.pop("architectures"), vision.pop("model_type")
    t = cfg.text
    if t.pool != "argmax" or not t.causal:
        raise ValueError("no transformers CLIPModel equivalent: a text tower other than causal with end-of-text pooling")
    if getattr(cfg, "logit_bias_init", None) is not None:
        raise ValueError("no transformers CLIPModel equivalent: a logit bias (SigLIP's loss)")
    text = dict(
        vocab_size=t.vocab_size, max_position_embeddings=t.encoder_seq_length, num_hidden_layers=t.num_layers,
        hidden_size=t.hidden_size, intermediate_size=t.ffn_hidden_size, num_attention_heads=t.num_attention_heads,
        layer_norm_eps=t.norm_eps, hidden_act=vit_hf._HF_ACT[t.activation], attention_dropout=t.attention_dropout,
        eos_token_id=t.vocab_size - 1, bos_token_id=t.vocab_size - 2, pad_token_id=1,
    )  # fmt: skip
    return {"model_type": "clip", "architectures": ["CLIPModel"], "projection_dim": cfg.output_dim,
            "vision_config": vision, "text_config": text}  # fmt: skip


def _text_table() -> RenameTable:
    return RenameTable(
        library="transformers",
        entries=(
            Rename("text.blocks.*.norm1.**", f"{_TEXT}.*.layer_norm1.**"),
            Rename("text.blocks.*.norm2.**", f"{_TEXT}.*.layer_norm2.**"),
            Rename("text.blocks.*.attn.proj.**", f"{_TEXT}.*.self_attn.out_proj.**"),
            Rename("text.blocks.*.mlp.**", f"{_TEXT}.*.mlp.**"),
            Rename("text.token_embedding.weight", "text_model.embeddings.token_embedding.weight"),
            Rename("text.pos_embed", "text_model.embeddings.position_embedding.weight", lambda t: t[None], lambda t: t[0]),
            Rename("text.norm.**", "text_model.final_layer_norm.**"),
            Rename("image_proj.weight", "visual_projection.weight"),
            Rename("text_proj.weight", "text_projection.weight"),
            Rename("logit_scale", "logit_scale", lambda t: t.reshape(1), lambda t: t.reshape(())),
            Rename(None, "text_model.embeddings.position_ids"),
            PASS_THROUGH,
        ),
    )


def state_dict_from_transformers(sd: Mapping[str, torch.Tensor], cfg: CLIPConfig) -> dict[str, torch.Tensor]:
    """A ``CLIPModel`` file's state dict -> vitscale's CLIP state dict for ``cfg``."""
    sd = dict(sd)
    vision = {k: sd.pop(k) for k in list(sd) if k.startswith("vision_model.")}
    out = {"visual." + k: v for k, v in vit_hf.state_dict_from_transformers(vision, cfg.vision).items()}
    out.update(vit_hf.qkv_from(sd, "clip", cfg.text, blk=_TEXT, ours="text.blocks"))
    rest = convert(sd, _text_table(), to="ours")
    unknown = [k for k in rest if not k.startswith(("text.", "image_proj", "text_proj", "logit_scale"))]
    if unknown:
        raise KeyError(f"{unknown[0]!r} is no part of a CLIPModel vitscale reads")
    return {**out, **rest}


def state_dict_to_transformers(sd: Mapping[str, torch.Tensor], cfg: CLIPConfig) -> dict[str, torch.Tensor]:
    """vitscale's CLIP state dict -> a ``CLIPModel`` file's (:func:`transformers_config`)."""
    transformers_config(cfg)  # ValueError naming what CLIPModel lacks
    sd = dict(sd)
    vision = {k[len("visual.") :]: sd.pop(k) for k in list(sd) if k.startswith("visual.")}
    out = vit_hf.state_dict_to_transformers(vision, cfg.vision, "clip_vision_model")  # under vision_model.
    out.update(vit_hf.qkv_to(sd, "clip", cfg.text, blk=_TEXT, ours="text.blocks"))
    sd.pop("logit_bias", None)
    out.update(convert(sd, _text_table(), to="theirs"))
    return out


def _accepts(m: Any) -> bool:
    from ..spec import is_library_model

    return is_library_model(m, "transformers", "CLIPModel")


def _adapter():
    from ..spec import transformers_adapter

    return transformers_adapter(accepts=_accepts, to_state_dict=state_dict_to_transformers, library_kwargs=transformers_config,
                                from_state_dict=state_dict_from_transformers, recognizes=recognizes)  # fmt: skip


TRANSFORMERS = _adapter()

__all__ = ["TRANSFORMERS", "config_from_transformers", "recognizes", "state_dict_from_transformers",
           "state_dict_to_transformers", "transformers_config"]  # fmt: skip
