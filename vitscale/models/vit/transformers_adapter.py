"""Hugging Face ``transformers`` vision models <-> vitscale's ViT: configs and state dicts, both ways.

The state dicts are the files a ``transformers`` snapshot folder holds (``model.safetensors``, in the
names the Hub's checkpoints have and ``save_pretrained`` writes; transformers 5 renames some of them
in memory when it loads a file, and back when it saves one). Which model a state dict is shows in its
names (:func:`kind_of`); ``config.json``'s ``model_type`` says the rest (:func:`config_from_transformers`):

=========================  ==========================  ===========================================
``model_type``             transformers class          vitscale ViT
=========================  ==========================  ===========================================
``vit``, ``vit_mae``       ``ViTModel``,               class token, learned positions; ``ViTModel``'s
                           ``ViTMAEModel``,            pooler (Linear + tanh on the class token) is
                           ``ViTForImageClassification``  ``pre_logits``, its ``classifier`` ``head``
``dinov2``                 ``Dinov2Model``             + LayerScale; ``use_swiglu_ffn``: a SwiGLU MLP
``dinov2_with_registers``  ``Dinov2WithRegistersModel``  + registers after the class token, without
                                                       position embeddings (``pos_embed_prefix=False``)
``dinov3_vit``             ``DINOv3ViTModel``          RoPE on patch centres (``rope_type='dinov3'``)
``clip_vision_model``      ``CLIPVisionModel``         pre-norm, no patch bias, class-token pooling
                           (and ``CLIPModel``'s        with the final norm after pooling
                           ``vision_model``)
``siglip_vision_model``    ``SiglipVisionModel``       no prefix tokens, MAP head (``pool='map'``)
=========================  ==========================  ===========================================

Layouts: transformers keeps ``query`` / ``key`` / ``value`` (``q_proj`` ...) as three matrices where
vitscale fuses them per head (``attn.qkv_per_head``, rows ``(H, 3, Dh)``); SigLIP's MAP head has one
``nn.MultiheadAttention`` ``in_proj`` ``[q; k; v]`` where vitscale has ``attn_pool.q`` and
``attn_pool.kv_per_head``; a packed DINOv2 SwiGLU ``weights_in`` ``[gate; value]`` is vitscale's
``fc1_g`` and ``fc1_x``. CLIP and SigLIP store position embeddings as an ``nn.Embedding`` ``(N, D)``
and CLIP's class token as ``(D,)``. A DINOv2-with-registers class token has a position embedding and
its registers none: the class token's is added to it (the same network at any image size, as DINOv2
interpolates only the patches' embeddings). The renames are one table per model (``common.renames``)
read both ways; what joins or splits tensors is done around it. ``mask_token`` (masked image modelling
at training time) is not read; written as zeros.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

import torch

from ..common.renames import Rename, RenameTable, convert, heads_first, parts_first
from .configs import ViTConfig, eva_options

# config.json model_type -> the kind of state dict (its names)
MODEL_TYPES = {
    "vit": "vit", "vit_mae": "vit", "dinov2": "dinov2", "dinov2_with_registers": "dinov2",
    "dinov3_vit": "dinov3", "clip_vision_model": "clip", "clip": "clip", "siglip_vision_model": "siglip",
    "siglip": "siglip",
}  # fmt: skip
# the transformers class a model_type's folder is written for
ARCHITECTURES = {
    "vit": "ViTModel", "vit_mae": "ViTMAEModel", "dinov2": "Dinov2Model",
    "dinov2_with_registers": "Dinov2WithRegistersModel", "dinov3_vit": "DINOv3ViTModel",
    "clip_vision_model": "CLIPVisionModel", "siglip_vision_model": "SiglipVisionModel",
}  # fmt: skip
# transformers' hidden_act names (transformers/activations.py ACT2FN) -> vitscale's activation
_ACTS = {
    "gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh", "quick_gelu": "quick_gelu",
    "relu": "relu", "silu": "silu", "swish": "silu",
}  # fmt: skip
_HF_ACT = {"gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh", "quick_gelu": "quick_gelu", "relu": "relu", "silu": "silu"}

# per kind: (block prefix, q, k, v, attention output, norm1, norm2, fc1, fc2, final norm)
_NAMES = {
    "vit": ("encoder.layer", "attention.attention.query", "attention.attention.key", "attention.attention.value",
            "attention.output.dense", "layernorm_before", "layernorm_after", "intermediate.dense", "output.dense", "layernorm"),
    "dinov2": ("encoder.layer", "attention.attention.query", "attention.attention.key", "attention.attention.value",
               "attention.output.dense", "norm1", "norm2", "mlp.fc1", "mlp.fc2", "layernorm"),
    "dinov3": ("layer", "attention.q_proj", "attention.k_proj", "attention.v_proj", "attention.o_proj", "norm1", "norm2",
               "mlp.up_proj", "mlp.down_proj", "norm"),
    "clip": ("encoder.layers", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.out_proj",
             "layer_norm1", "layer_norm2", "mlp.fc1", "mlp.fc2", "post_layernorm"),
}  # fmt: skip
_NAMES["siglip"] = _NAMES["clip"]
# a name only each kind's state dict has (after the model's prefix), in the order they are tried
_MARKS = (
    ("dinov3", "embeddings.patch_embeddings.weight"),
    ("clip", "embeddings.class_embedding"),
    ("siglip", "embeddings.patch_embedding.weight"),
    ("dinov2", "encoder.layer.0.norm1.weight"),
    ("vit", "encoder.layer.0.layernorm_before.weight"),
)
# prefixes under which a model's backbone is stored (a task model's, a two-tower model's vision side)
_PREFIXES = ("", "vit.", "dinov2.", "vision_model.", "model.")
# what a file may hold besides the backbone, not read into a ViT: MAE's decoder, a CLIPModel's text side
_OTHER = ("decoder.", "text_model.", "visual_projection.", "text_projection.", "logit_scale", "logit_bias")


def kind_of(keys: Collection[str]) -> tuple[str, str] | None:
    """(kind, prefix) of a transformers vision state dict's names (None: not one vitscale reads)."""
    for prefix in _PREFIXES:
        for kind, mark in _MARKS:
            if prefix + mark in keys:
                return kind, prefix
    return None


def recognizes(sd: Collection[str]) -> bool:
    """``StateDictAdapter.recognizes``: a transformers ViT / DINOv2 / DINOv3 / CLIP / SigLIP vision state dict."""
    return kind_of(sd) is not None


# ----------------------------------------------------------------------------- configs


def _get(hf: Mapping[str, Any], key: str, default: Any) -> Any:
    v = hf.get(key, default)
    return default if v is None else v


def _image(hf: Mapping[str, Any], key: str) -> tuple[int, int]:
    v = hf.get(key)
    if isinstance(v, (list, tuple)) and len(v) == 2:
        return int(v[0]), int(v[1])
    if isinstance(v, int) and not isinstance(v, bool):
        return v, v
    raise ValueError(f"config.json has no integer {key}")


def vision_config(hf: Mapping[str, Any]) -> tuple[str, Mapping[str, Any]]:
    """(model_type, the vision model's config): a ``CLIPModel`` / ``SiglipModel`` config's ``vision_config``."""
    mt = hf.get("model_type")
    if mt in ("clip", "siglip"):
        vc = hf.get("vision_config")
        if not isinstance(vc, Mapping):
            raise ValueError(f"a {mt} config.json without a vision_config")
        return f"{mt}_vision_model", vc
    if mt not in MODEL_TYPES:
        known = ", ".join(sorted(MODEL_TYPES))
        raise ValueError(f"transformers model_type {mt!r} is not one vitscale's ViT reads (model types: {known})")
    return mt, hf


def config_from_transformers(hf: Mapping[str, Any], num_classes: int | None = None) -> ViTConfig:
    """The ``ViTConfig`` of a transformers ``config.json`` (a dict); ValueError naming what vitscale's
    ViT cannot express. ``num_classes``: the classifier's rows (``ViTForImageClassification``; default 0)."""
    mt, c = vision_config(hf)
    kind = MODEL_TYPES[mt]
    D, heads, layers = int(c["hidden_size"]), int(c["num_attention_heads"]), int(c["num_hidden_layers"])
    patch = c.get("patch_size", 16)
    if isinstance(patch, (list, tuple)):
        if len(set(patch)) != 1:
            raise ValueError(f"non-square patches {tuple(patch)}")
        patch = patch[0]
    img_h, img_w = _image(c, "image_size")
    act_name = _get(c, "hidden_act", "gelu")
    if not isinstance(act_name, str) or act_name not in _ACTS:
        raise ValueError(f"hidden_act {act_name!r} (vitscale's ViT has {', '.join(sorted(_ACTS))})")
    act = _ACTS[act_name]
    kw: dict[str, Any] = dict(
        img_h=img_h // patch * patch, img_w=img_w // patch * patch, patch_dim=int(patch),
        num_channels=int(_get(c, "num_channels", 3)), num_layers=layers, hidden_size=D, num_attention_heads=heads,
        num_classes=num_classes or 0, activation=act, norm_eps=float(_get(c, "layer_norm_eps", 1e-12)),
        hidden_dropout=float(_get(c, "hidden_dropout_prob", 0.0)),
        attention_dropout=float(_get(c, "attention_probs_dropout_prob", _get(c, "attention_dropout", 0.0))),
        drop_path_rate=float(_get(c, "drop_path_rate", 0.0)),
    )  # fmt: skip
    if kind in ("vit", "dinov2"):
        kw["qkv_bias"] = bool(_get(c, "qkv_bias", True))
    if kind == "vit":
        kw["ffn_hidden_size"] = int(c["intermediate_size"])
        if mt == "vit":
            act_p = _get(c, "pooler_act", "tanh")
            if act_p != "tanh" or int(_get(c, "pooler_output_size", D)) != D:
                raise ValueError(f"a ViT pooler with {act_p} to {c.get('pooler_output_size')} features (vitscale's pre_logits: tanh, hidden_size)")
    elif kind == "dinov2":
        F = int(D * float(_get(c, "mlp_ratio", 4)))
        if c.get("use_swiglu_ffn"):
            kw.update(mlp_type="swiglu", ffn_hidden_size=(int(F * 2 / 3) + 7) // 8 * 8)
        else:
            kw["ffn_hidden_size"] = F
        kw["layer_scale_init"] = float(_get(c, "layerscale_value", 1.0))
        regs = int(_get(c, "num_register_tokens", 0)) if mt == "dinov2_with_registers" else 0
        kw.update(class_token_length=1 + regs, pos_embed_prefix=regs == 0)
    elif kind == "dinov3":
        q, k, v = (bool(_get(c, f"{n}_bias", d)) for n, d in (("query", True), ("key", False), ("value", True)))
        if (q, k, v) not in ((True, True, True), (True, False, True), (False, False, False)):
            raise ValueError(f"query / key / value biases {q} / {k} / {v} (vitscale: all, none, or queries and values)")
        gated = bool(c.get("use_gated_mlp"))
        if gated and act != "silu":
            raise ValueError(f"a gated MLP with {act_name} (vitscale's SwiGLU gates with silu)")
        kw.update(
            ffn_hidden_size=int(c["intermediate_size"]), mlp_type="swiglu" if gated else "mlp", qkv_bias=q, key_bias=k or not q,
            proj_bias=bool(_get(c, "proj_bias", True)), mlp_bias=bool(_get(c, "mlp_bias", True)),
            layer_scale_init=float(_get(c, "layerscale_value", 1.0)),
            class_token_length=1 + int(_get(c, "num_register_tokens", 0)), pos_embed="rope", rope_type="dinov3",
            rope_temperature=float(_get(c, "rope_theta", 100.0)), rope_rotate_half=True,
        )  # fmt: skip
    elif kind == "clip":
        kw.update(ffn_hidden_size=int(c["intermediate_size"]), pre_norm=True, patch_bias=False, fc_norm=True)
    elif kind == "siglip":
        head = bool(_get(c, "vision_use_head", True))
        kw.update(ffn_hidden_size=int(c["intermediate_size"]), class_token_length=0, pool="map" if head else "avg", fc_norm=False)
    return ViTConfig(**kw)


def transformers_config(cfg: ViTConfig, model_type: str | None = None) -> dict[str, Any]:
    """The ``config.json`` of the transformers model equivalent to ``cfg`` (``model_type``: None = the
    one that expresses it, :func:`model_type_for`); ValueError naming what that model lacks."""
    mt = model_type or model_type_for(cfg)
    why = _unexpressible(cfg, mt)
    if why:
        raise ValueError(f"no transformers {ARCHITECTURES.get(mt, mt)} equivalent: " + "; ".join(why))
    c: dict[str, Any] = dict(
        model_type=mt, hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_attention_heads,
        image_size=cfg.img_h, patch_size=cfg.patch_dim, num_channels=cfg.num_channels, hidden_act=_HF_ACT[cfg.activation],
        layer_norm_eps=cfg.norm_eps,
    )  # fmt: skip
    arch = ARCHITECTURES[mt]
    kind = MODEL_TYPES[mt]
    if kind in ("vit", "dinov2"):
        c.update(qkv_bias=cfg.qkv_bias, hidden_dropout_prob=cfg.hidden_dropout, attention_probs_dropout_prob=cfg.attention_dropout)
    else:
        c["attention_dropout"] = cfg.attention_dropout
    if kind == "vit":
        c["intermediate_size"] = cfg.ffn_hidden_size
        if cfg.num_classes > 0:
            arch = "ViTForImageClassification" if mt == "vit" else arch
            c["id2label"] = {str(i): f"LABEL_{i}" for i in range(cfg.num_classes)}
    elif kind == "dinov2":
        swiglu = cfg.mlp_type == "swiglu"
        ratio = _dinov2_ratio(cfg.ffn_hidden_size, cfg.hidden_size, swiglu)
        c.update(mlp_ratio=ratio, use_swiglu_ffn=swiglu, layerscale_value=cfg.layer_scale_init, drop_path_rate=cfg.drop_path_rate)
        if mt == "dinov2_with_registers":
            c["num_register_tokens"] = cfg.class_token_length - 1
    elif kind == "dinov3":
        c.update(
            intermediate_size=cfg.ffn_hidden_size, use_gated_mlp=cfg.mlp_type == "swiglu", query_bias=cfg.qkv_bias,
            key_bias=cfg.qkv_bias and cfg.key_bias, value_bias=cfg.qkv_bias, proj_bias=cfg.proj_bias, mlp_bias=cfg.mlp_bias,
            layerscale_value=cfg.layer_scale_init, num_register_tokens=cfg.class_token_length - 1,
            rope_theta=cfg.rope_temperature, drop_path_rate=cfg.drop_path_rate,
            pos_embed_shift=None, pos_embed_jitter=None, pos_embed_rescale=None,
        )  # fmt: skip
        if cfg.mlp_type == "swiglu":
            c["hidden_act"] = "silu"
    elif kind in ("clip", "siglip"):
        c["intermediate_size"] = cfg.ffn_hidden_size
        if kind == "siglip":
            c["vision_use_head"] = cfg.pool == "map"
    c["architectures"] = [arch]
    return c


def _dinov2_ratio(F: int, D: int, swiglu: bool) -> int | None:
    """The integer ``mlp_ratio`` (transformers' Dinov2Config takes an int) whose MLP is ``F`` wide: ``D r``,
    or for the SwiGLU (int(D r 2 / 3) + 7) // 8 * 8 (transformers' Dinov2SwiGLUFFN); None if none."""
    for r in range(1, 65):
        width = int(D * r)
        if (((int(width * 2 / 3) + 7) // 8 * 8) if swiglu else width) == F:
            return r
    return None


def model_type_for(cfg: ViTConfig) -> str:
    """The transformers model type that expresses ``cfg`` (checked by :func:`transformers_config`)."""
    if cfg.pos_embed == "rope":
        return "dinov3_vit"
    if cfg.pool == "map" or cfg.class_token_length == 0:
        return "siglip_vision_model"
    if cfg.pre_norm:
        return "clip_vision_model"
    if cfg.layer_scale_init is not None or cfg.mlp_type == "swiglu":
        return "dinov2_with_registers" if cfg.class_token_length > 1 else "dinov2"
    return "vit"


def _unexpressible(cfg: ViTConfig, mt: str) -> list[str]:
    """What ``cfg`` has that transformers' model ``mt`` cannot express (empty: nothing)."""
    if mt not in ARCHITECTURES:
        return [f"model_type {mt!r} (one of {', '.join(ARCHITECTURES)})"]
    kind, why = MODEL_TYPES[mt], []
    D = cfg.hidden_size
    if cfg.img_h != cfg.img_w:
        why.append(f"a {cfg.img_h}x{cfg.img_w} image (transformers' image_size is square)")
    if cfg.parallel_block or cfg.qk_norm or cfg.distill_token:
        why.append("ViT-22B blocks, QK norms or a distillation token")
    if cfg.norm_type != "layernorm" or not cfg.norm_bias:
        why.append("norms other than LayerNorm with a bias")
    if not cfg.final_norm:
        why.append("no final norm")
    if cfg.activation not in _HF_ACT:
        why.append(f"the {cfg.activation} activation")
    learned = "rope" if kind == "dinov3" else "learned"
    if cfg.pos_embed != learned:
        why.append(f"pos_embed={cfg.pos_embed!r} ({mt}: {learned!r})")
    if cfg.num_classes > 0 and mt != "vit":
        why.append(f"a classifier ({cfg.num_classes} classes; transformers' {ARCHITECTURES[mt]} is a backbone: convert one with num_classes=0)")
    if cfg.pre_logits and (mt != "vit" or cfg.num_classes > 0):
        why.append("a pre-logits layer (only a ViTModel without classifier has one: its pooler)")
    if cfg.pre_norm != (kind == "clip"):
        why.append(f"pre_norm={cfg.pre_norm} ({mt}: {kind == 'clip'})")
    if cfg.patch_bias != (kind != "clip"):
        why.append(f"patch_bias={cfg.patch_bias} ({mt}: {kind != 'clip'})")
    if kind != "dinov3" and not (cfg.proj_bias and cfg.mlp_bias):
        why.append("attention-output or MLP layers without a bias")
    if kind != "dinov3" and cfg.qkv_bias and not cfg.key_bias:
        why.append("queries and values with a bias and keys without")
    if kind in ("clip", "siglip") and not cfg.qkv_bias:
        why.append("no QKV bias")
    want_ls = kind in ("dinov2", "dinov3")
    if (cfg.layer_scale_init is not None) != want_ls:
        why.append(f"{'no ' if want_ls else ''}LayerScale ({mt} has {'it' if want_ls else 'none'})")
    if cfg.mlp_type == "swiglu" and kind not in ("dinov2", "dinov3"):
        why.append("a SwiGLU MLP")
    if cfg.mlp_type == "swiglu" and kind == "dinov2" and not cfg.mlp_bias:
        why.append("a SwiGLU without biases")
    if kind == "siglip":
        if cfg.class_token_length:
            why.append("prefix tokens (SigLIP has none)")
        if cfg.pool not in ("map", "avg"):
            why.append(f"pool={cfg.pool!r} (SigLIP: its MAP head, or none)")
        if cfg.use_fc_norm:
            why.append("the final norm after pooling")
    else:
        if not (cfg.class_token and cfg.class_token_length >= 1):
            why.append("no class token")
        regs = cfg.class_token_length - 1
        if regs and mt not in ("dinov2_with_registers", "dinov3_vit"):
            why.append(f"{regs} register tokens")
        if cfg.pool == "map":
            why.append("a MAP head")
        if cfg.use_fc_norm and cfg.pool != "token":
            why.append(f"the final norm after {cfg.pool} pooling (transformers' {ARCHITECTURES[mt]} normalises every token before any pooling)")
        if cfg.num_classes > 0 and cfg.pool != "token":
            why.append(f"a classifier on {cfg.pool} pooling (ViTForImageClassification's reads the class token)")
        if mt == "dinov2_with_registers" and cfg.pos_embed_prefix:
            why.append("position embeddings on the registers (DINOv2's registers have none: pos_embed_prefix=False)")
        if mt not in ("dinov2_with_registers", "dinov3_vit") and not cfg.pos_embed_prefix:
            why.append("a class token without a position embedding (pos_embed_prefix=False)")
        if kind == "dinov2" and _dinov2_ratio(cfg.ffn_hidden_size, D, cfg.mlp_type == "swiglu") is None:
            why.append(f"an MLP {cfg.ffn_hidden_size} wide, which no integer mlp_ratio gives at hidden size {D}")
    if kind == "dinov3" and (cfg.rope_type != "dinov3" or not cfg.rope_rotate_half or cfg.rope_grid_offset or cfg.rope_ref_grid):
        why.append("RoPE other than DINOv3's (rope_type='dinov3', rope_rotate_half, no offset or reference grid)")
    why += eva_options(cfg, layouts=False)  # EVA-02 / RoPE-ViT options transformers' ViTs lack
    if kind == "dinov3" and cfg.mlp_type == "swiglu" and cfg.activation != "silu" and cfg.activation != "gelu":
        why.append(f"a SwiGLU with the {cfg.activation} activation")
    return why


# fields compared between a folder's config.json and the model it is read into (the state dict shows
# the shapes; these change what the same weights compute)
COMPARED = (
    "patch_dim", "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "class_token_length",
    "pos_embed", "pos_embed_prefix", "norm_eps", "activation", "qkv_bias", "key_bias", "mlp_type", "pre_norm",
    "patch_bias", "rope_type", "rope_temperature", "rope_rotate_half", "rope_grid_offset", "rope_ref_grid",
)  # fmt: skip


def config_differences(hf: Mapping[str, Any], cfg: ViTConfig) -> list[tuple[str, Any, Any]]:
    """``(field, the folder's value, cfg's)`` for each of :data:`COMPARED` where they differ (and
    LayerScale on or off, and MAP pooling)."""
    want = config_from_transformers(hf)
    out = [(f, getattr(want, f), getattr(cfg, f)) for f in COMPARED if getattr(want, f) != getattr(cfg, f)]
    if (want.layer_scale_init is None) != (cfg.layer_scale_init is None):
        out.append(("layer_scale_init", want.layer_scale_init, cfg.layer_scale_init))
    if (want.pool == "map") != (cfg.pool == "map"):
        out.append(("pool", want.pool, cfg.pool))
    return out


# ----------------------------------------------------------------------------- state dicts


def _table(kind: str, cfg: ViTConfig) -> RenameTable:
    """vitscale <-> transformers keys of one kind's backbone (the fused projections, prefix tokens and
    position embeddings: joined and split around it)."""
    blk, _, _, _, out, n1, n2, fc1, fc2, final = _NAMES[kind]
    post = "fc_norm" if cfg.use_fc_norm else "norm"
    entries = [
        Rename("blocks.*.norm1.**", f"{blk}.*.{n1}.**"),
        Rename("blocks.*.norm2.**", f"{blk}.*.{n2}.**"),
        Rename("blocks.*.attn.proj.**", f"{blk}.*.{out}.**"),
        Rename("blocks.*.ls1.gamma", f"{blk}.*.layer_scale1.lambda1"),
        Rename("blocks.*.ls2.gamma", f"{blk}.*.layer_scale2.lambda1"),
        Rename(f"{post}.**", f"{final}.**"),
    ]
    if cfg.mlp_type == "swiglu":
        if kind == "dinov2":
            entries.append(Rename("blocks.*.mlp.fc2.**", f"{blk}.*.mlp.weights_out.**"))
        else:
            entries += [
                Rename("blocks.*.mlp.fc1_g.**", f"{blk}.*.mlp.gate_proj.**"),
                Rename("blocks.*.mlp.fc1_x.**", f"{blk}.*.mlp.up_proj.**"),
                Rename("blocks.*.mlp.fc2.**", f"{blk}.*.mlp.down_proj.**"),
            ]
    else:
        entries += [Rename("blocks.*.mlp.fc1.**", f"{blk}.*.{fc1}.**"), Rename("blocks.*.mlp.fc2.**", f"{blk}.*.{fc2}.**")]
    patch = {"dinov3": "embeddings.patch_embeddings", "clip": "embeddings.patch_embedding",
             "siglip": "embeddings.patch_embedding"}.get(kind, "embeddings.patch_embeddings.projection")  # fmt: skip
    entries += [
        Rename("patch_embed.proj.**", f"{patch}.**"),
        Rename("norm_pre.**", "pre_layrnorm.**"),  # CLIP's (sic)
        Rename("pre_logits.0.**", "pooler.dense.**"),  # ViTModel's pooler: Linear + tanh on the class token
        Rename(None, "embeddings.mask_token"),
        Rename(None, "embeddings.position_ids"),  # a buffer older CLIP / SigLIP files store
        Rename("attn_pool.latent", "head.probe"),
        Rename("attn_pool.proj.**", "head.attention.out_proj.**"),
        Rename("attn_pool.norm.**", "head.layernorm.**"),
        Rename("attn_pool.mlp.**", "head.mlp.**"),
    ]
    return RenameTable(library="transformers", entries=tuple(entries), unsupported=f"a {kind} model as vitscale reads it")


def _split_prefix(sd: dict[str, torch.Tensor], prefix: str) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(the backbone's tensors without ``prefix``, the rest)."""
    mine = {k[len(prefix) :]: v for k, v in sd.items() if k.startswith(prefix)}
    rest = {k: v for k, v in sd.items() if not k.startswith(prefix)}
    return mine, rest


def state_dict_from_transformers(sd: Mapping[str, torch.Tensor], cfg: ViTConfig) -> dict[str, torch.Tensor]:
    """A transformers vision model's state dict (file names) -> vitscale's ViT state dict for ``cfg``.

    KeyError / ValueError naming a tensor that is missing or does not fit (a folder whose
    ``config.json`` and weights disagree)."""
    found = kind_of(sd)
    if found is None:
        raise KeyError(f"no transformers ViT / DINOv2 / DINOv3 / CLIP / SigLIP names (e.g. {next(iter(sd), '')!r})")
    kind, prefix = found
    sd, rest = _split_prefix(dict(sd), prefix)
    out: dict[str, torch.Tensor] = {}
    if "classifier.weight" in rest:  # ViTForImageClassification: a linear classifier on the class token
        out["head.weight"], out["head.bias"] = rest.pop("classifier.weight"), rest.pop("classifier.bias")
    extra = [k for k in rest if not k.startswith(_OTHER)]
    if extra:
        raise KeyError(f"{extra[0]!r} is no part of a {kind} backbone vitscale reads")
    H, D = cfg.num_attention_heads, cfg.hidden_size
    blk = _NAMES[kind][0]
    out.update(qkv_from(sd, kind, cfg))
    for i in range(cfg.num_layers):
        p = f"{blk}.{i}."
        if kind == "dinov2" and cfg.mlp_type == "swiglu":
            for t in ("weight", "bias"):
                g, x = sd.pop(f"{p}mlp.weights_in.{t}").chunk(2)  # [gate; value] (DINOv2's SwiGLUFFNFused)
                out[f"blocks.{i}.mlp.fc1_g.{t}"], out[f"blocks.{i}.mlp.fc1_x.{t}"] = g, x
    if kind == "siglip" and "head.attention.in_proj_weight" in sd:
        for t in ("weight", "bias"):
            w = sd.pop(f"head.attention.in_proj_{t}")
            out[f"attn_pool.q.{t}"], out[f"attn_pool.kv_per_head.{t}"] = w[:D], heads_first(w[D:], 2, H)
    if not cfg.pre_logits:  # ViTModel's pooler (Linear + tanh), read only into a model with pre_logits
        sd.pop("pooler.dense.weight", None), sd.pop("pooler.dense.bias", None)
    out.update(_tokens_from(sd, kind, cfg))
    out.update(convert(sd, _table(kind, cfg), to="ours"))
    return out


def qkv_from(sd: dict[str, torch.Tensor], kind: str, cfg: Any, blk: str | None = None, ours: str = "blocks") -> dict[str, torch.Tensor]:
    """Pops each block's query / key / value projections (under ``blk``, the kind's block prefix by
    default): vitscale's ``{ours}.i.attn.qkv_per_head`` (rows per head) and its bias, or ``q_bias`` /
    ``v_bias`` where the keys have none. ``cfg``: a ViT config (or a text tower's: its heads and depth)."""
    H = cfg.num_attention_heads
    blk = blk or _NAMES[kind][0]
    q, k, v = _NAMES[kind][1:4]
    out: dict[str, torch.Tensor] = {}
    for i in range(cfg.num_layers):
        p, o = f"{blk}.{i}.", f"{ours}.{i}.attn."
        out[o + "qkv_per_head.weight"] = heads_first(torch.cat([sd.pop(p + n + ".weight") for n in (q, k, v)]), 3, H)
        bq, bk, bv = (sd.pop(p + n + ".bias", None) for n in (q, k, v))
        if bq is not None and bk is not None and bv is not None:
            if not getattr(cfg, "key_bias", True):
                raise ValueError("the keys have a bias: the model needs key_bias=True")
            out[o + "qkv_per_head.bias"] = heads_first(torch.cat([bq, bk, bv]), 3, H)
        elif bq is not None and bv is not None:
            out[o + "q_bias"], out[o + "v_bias"] = bq, bv
    return out


def qkv_to(sd: dict[str, torch.Tensor], kind: str, cfg: Any, blk: str | None = None, ours: str = "blocks") -> dict[str, torch.Tensor]:
    """The inverse of :func:`qkv_from` (pops vitscale's tensors)."""
    H = cfg.num_attention_heads
    blk = blk or _NAMES[kind][0]
    q, k, v = _NAMES[kind][1:4]
    out: dict[str, torch.Tensor] = {}
    for i in range(cfg.num_layers):
        p, o = f"{blk}.{i}.", f"{ours}.{i}.attn."
        for n, t in zip((q, k, v), parts_first(sd.pop(o + "qkv_per_head.weight"), 3, H).chunk(3)):
            out[f"{p}{n}.weight"] = t
        b = sd.pop(o + "qkv_per_head.bias", None)
        if b is not None:
            for n, t in zip((q, k, v), parts_first(b, 3, H).chunk(3)):
                out[f"{p}{n}.bias"] = t
        elif o + "q_bias" in sd:
            out[f"{p}{q}.bias"], out[f"{p}{v}.bias"] = sd.pop(o + "q_bias"), sd.pop(o + "v_bias")
    return out


def _tokens_from(sd: dict[str, torch.Tensor], kind: str, cfg: ViTConfig) -> dict[str, torch.Tensor]:
    """Pops the prefix tokens and position embeddings: vitscale's ``cls_token (1, L, D)``, ``pos_embed (1, N, D)``."""
    out: dict[str, torch.Tensor] = {}
    if kind in ("clip", "siglip"):
        pos = sd.pop("embeddings.position_embedding.weight")[None]  # (1, N, D)
        if kind == "clip":
            out["cls_token"] = sd.pop("embeddings.class_embedding").reshape(1, 1, -1)
        out["pos_embed"] = pos
        return out
    cls = sd.pop("embeddings.cls_token")
    regs = sd.pop("embeddings.register_tokens", None)
    if kind == "dinov3":
        out["cls_token"] = torch.cat([cls, regs], dim=1) if regs is not None else cls
        return out
    pos = sd.pop("embeddings.position_embeddings")
    if regs is not None and regs.shape[1]:  # DINOv2 with registers: the class token's position embedding folded in
        if cfg.pos_embed_prefix:
            raise ValueError("DINOv2's registers have no position embedding: the model needs pos_embed_prefix=False")
        out["cls_token"], out["pos_embed"] = torch.cat([cls + pos[:, :1], regs], dim=1), pos[:, 1:]
    else:
        out["cls_token"], out["pos_embed"] = cls, pos
    return out


def state_dict_to_transformers(sd: Mapping[str, torch.Tensor], cfg: ViTConfig, model_type: str | None = None) -> dict[str, torch.Tensor]:
    """vitscale's ViT state dict -> the file state dict of the transformers model of
    :func:`transformers_config` (``model_type``: None = :func:`model_type_for`)."""
    mt = model_type or model_type_for(cfg)
    transformers_config(cfg, mt)  # ValueError naming what the model lacks
    kind = MODEL_TYPES[mt]
    sd = dict(sd)
    H, D = cfg.num_attention_heads, cfg.hidden_size
    out: dict[str, torch.Tensor] = {}
    blk = _NAMES[kind][0]
    out.update(qkv_to(sd, kind, cfg))
    for i in range(cfg.num_layers):
        p = f"{blk}.{i}."
        if kind == "dinov2" and cfg.mlp_type == "swiglu":
            for t in ("weight", "bias"):
                out[f"{p}mlp.weights_in.{t}"] = torch.cat([sd.pop(f"blocks.{i}.mlp.fc1_g.{t}"), sd.pop(f"blocks.{i}.mlp.fc1_x.{t}")])
    if "attn_pool.q.weight" in sd:
        for t in ("weight", "bias"):
            kv = parts_first(sd.pop(f"attn_pool.kv_per_head.{t}"), 2, H)
            out[f"head.attention.in_proj_{t}"] = torch.cat([sd.pop(f"attn_pool.q.{t}"), kv])
    head = {n: sd.pop(n) for n in ("head.weight", "head.bias") if n in sd}
    cls, pos = sd.pop("cls_token", None), sd.pop("pos_embed", None)
    if kind in ("clip", "siglip"):
        out["embeddings.position_embedding.weight"] = pos[0]
        if kind == "clip":
            out["embeddings.class_embedding"] = cls.reshape(-1)
    else:
        out["embeddings.cls_token"] = cls[:, :1]
        if mt in ("dinov2_with_registers", "dinov3_vit"):
            out["embeddings.register_tokens"] = cls[:, 1:].contiguous()
        if kind != "dinov3":
            out["embeddings.position_embeddings"] = pos if cfg.pos_embed_prefix else torch.cat([pos.new_zeros(1, 1, D), pos], dim=1)
        if kind in ("dinov2", "dinov3"):
            out["embeddings.mask_token"] = cls.new_zeros((1, D) if kind == "dinov2" else (1, 1, D))
    out.update(convert(sd, _table(kind, cfg), to="theirs"))
    if head:  # ViTForImageClassification
        out = {"vit." + key: t for key, t in out.items()}
        out["classifier.weight"], out["classifier.bias"] = head["head.weight"], head["head.bias"]
    elif kind == "clip":
        out = {"vision_model." + key: t for key, t in out.items()}  # CLIPVisionModel's files (transformers 4 and 5 read them)
    elif kind == "siglip":
        out = {"vision_model." + key: t for key, t in out.items()}
    return out


__all__ = [
    "ARCHITECTURES", "COMPARED", "MODEL_TYPES", "config_differences", "config_from_transformers", "kind_of", "model_type_for",
    "qkv_from", "qkv_to", "recognizes", "state_dict_from_transformers", "state_dict_to_transformers", "transformers_config", "vision_config",
]  # fmt: skip


# ----------------------------------------------------------------------------- the family's adapter


def _accepts(m: Any) -> bool:
    from ..spec import is_library_model

    return is_library_model(m, "transformers", *ARCHITECTURES.values(), "ViTForImageClassification", "CLIPModel")


def _adapter():
    from ..spec import transformers_adapter

    return transformers_adapter(accepts=_accepts, to_state_dict=state_dict_to_transformers, library_kwargs=transformers_config,
                                from_state_dict=state_dict_from_transformers, recognizes=recognizes)  # fmt: skip


TRANSFORMERS = _adapter()
__all__ += ["TRANSFORMERS"]
