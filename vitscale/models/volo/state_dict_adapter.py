"""timm VOLO <-> vitscale VOLO: the family's timm adapter (``TIMM``), which the public entry points
``vitscale.interop.from_timm`` / ``to_timm`` ask.

``volo_from_timm(timm_model)`` builds an equivalent :class:`vitscale.models.volo.VOLO` (config read
from the timm model, weights converted) and ``volo_to_timm(model)`` returns a state dict that
``timm.models.volo.VOLO.load_state_dict`` accepts. Key mapping:

=====================================  =========================================
timm                                   vitscale
=====================================  =========================================
``patch_embed.{conv,proj}``            same
``network.0.{j}``                      ``outlookers.{j}``
``network.1.proj``                     ``downsample``
``network.{2,3,..}.{j}`` (in order)    ``blocks.{k}`` — ``attn.qkv`` rows (3, H, Dh) -> ``attn.qkv_per_head`` (H, 3, Dh)
``post_network.{i}``                   ``class_blocks.{i}`` — ``attn.kv`` rows (2, H, Dh) -> ``attn.kv_per_head`` (H, 2, Dh)
``pos_embed, cls_token, norm, head, aux_head``  same
=====================================  =========================================
"""

from __future__ import annotations

import torch
from torch import nn

from ..common.renames import PASS_THROUGH, Rename, RenameTable, convert, per_head
from ..spec import StateDictAdapter, is_library_model, keys_have
from .configs import VOLOConfig
from .model import VOLO


def config_from_timm(tm: nn.Module) -> VOLOConfig:
    """The :class:`VOLOConfig` equivalent to a ``timm.models.volo.VOLO`` instance."""
    net = tm.network
    if not isinstance(net[1], nn.Module) or not hasattr(net[1], "proj") or len(net[0]) == 0:
        raise ValueError("only VOLO layouts with one outlooker stage followed by a downsample are supported")
    oa = net[0][0].attn
    stages = [len(s) for s in list(net)[2:]]
    tb = net[2][0]
    pe = tm.patch_embed
    stem_stride = pe.conv[0].stride[0]
    p = pe.proj.kernel_size[0]
    pool = net[1].proj.kernel_size[0]
    patch_dim = stem_stride * p
    gh, gw = tm.pos_embed.shape[1:3]
    head = tm.head
    num_classes = head.out_features if isinstance(head, nn.Linear) else 0
    return VOLOConfig(
        img_h=gh * patch_dim * pool,
        img_w=gw * patch_dim * pool,
        num_channels=pe.conv[0].in_channels,
        num_classes=num_classes,
        layers=(len(net[0]), *stages),
        outlook_dim=oa.v.in_features,
        outlook_heads=oa.num_heads,
        hidden_size=tm.num_features,
        num_heads=tb.attn.num_heads,
        outlook_mlp_ratio=net[0][0].mlp.fc1.out_features / oa.v.in_features,
        mlp_ratio=tb.mlp.fc1.out_features / tm.num_features,
        patch_dim=patch_dim,
        stem_hidden=pe.conv[0].out_channels,
        stem_stride=stem_stride,
        pooling_scale=pool,
        outlook_kernel=oa.kernel_size,
        outlook_padding=oa.padding,
        outlook_stride=oa.stride,
        num_class_layers=len(tm.post_network) if tm.post_network is not None else 0,
        qkv_bias=oa.v.bias is not None,
        aux_head=getattr(tm, "aux_head", None) is not None,
        pool=tm.global_pool or "token",
        norm_eps=tm.norm.eps,
    )


def _stage_map(cfg: VOLOConfig) -> list[tuple[int, int]]:
    """For each vitscale transformer block k: (timm network index, index inside the stage)."""
    out = []
    for s, n in enumerate(cfg.layers[1:]):
        out += [(2 + s, j) for j in range(n)]
    return out


def _timm_table(cfg: VOLOConfig) -> RenameTable:
    """vitscale <-> timm keys of a VOLO with ``cfg`` (the table in the module docstring)."""
    qkv, kv = per_head(3, cfg.num_heads), per_head(2, cfg.num_heads)
    blocks = []
    for k, (i, j) in enumerate(_stage_map(cfg)):
        blocks += [
            Rename(f"blocks.{k}.attn.qkv_per_head.**", f"network.{i}.{j}.attn.qkv.**", *qkv),
            Rename(f"blocks.{k}.**", f"network.{i}.{j}.**"),
        ]
    return RenameTable(
        library="timm",
        entries=(
            Rename("outlookers.*.**", "network.0.*.**"),
            Rename("downsample.**", "network.1.proj.**"),
            *blocks,
            Rename("class_blocks.*.attn.kv_per_head.**", "post_network.*.attn.kv.**", *kv),
            Rename("class_blocks.*.**", "post_network.*.**"),
            PASS_THROUGH,
        ),
    )


def volo_state_dict_from_timm(sd: dict[str, torch.Tensor], cfg: VOLOConfig) -> dict[str, torch.Tensor]:
    """Convert a timm VOLO state dict to vitscale keys and layouts."""
    return convert(sd, _timm_table(cfg), to="ours")


def volo_state_dict_to_timm(sd: dict[str, torch.Tensor], cfg: VOLOConfig) -> dict[str, torch.Tensor]:
    """Convert a vitscale VOLO state dict to timm keys and layouts."""
    return convert(sd, _timm_table(cfg), to="theirs")


def volo_from_timm(timm_model: nn.Module, device=None, dtype=None) -> VOLO:
    """A vitscale VOLO with the weights (and buffers) of a ``timm.models.volo.VOLO``."""
    cfg = config_from_timm(timm_model)
    model = VOLO(cfg, device=device, dtype=dtype)
    sd = volo_state_dict_from_timm(timm_model.state_dict(), cfg)
    model.load_state_dict(sd, strict=True)
    return model


def volo_to_timm(model: VOLO) -> dict[str, torch.Tensor]:
    """A state dict for ``timm.create_model(<matching volo variant>)`` from a vitscale VOLO."""
    sd = {k: v.detach() for k, v in model.state_dict().items()}
    return volo_state_dict_to_timm(sd, model.cfg)


def timm_kwargs(cfg: VOLOConfig) -> dict:
    """Keyword arguments building the matching ``timm.models.volo.VOLO`` (for ``to_timm`` round trips)."""
    if cfg.outlook_kernel != 3 or cfg.outlook_padding != 1 or cfg.outlook_stride != 2:
        raise ValueError("timm's VOLO builds outlook attention with kernel 3, padding 1, stride 2 only")
    n = len(cfg.layers)
    return dict(
        layers=list(cfg.layers),
        img_size=(cfg.img_h, cfg.img_w),
        in_chans=cfg.num_channels,
        num_classes=cfg.num_classes,
        global_pool=cfg.pool,
        patch_size=cfg.patch_dim,
        stem_hidden_dim=cfg.stem_hidden,
        embed_dims=[cfg.outlook_dim] + [cfg.hidden_size] * (n - 1),
        num_heads=[cfg.outlook_heads] + [cfg.num_heads] * (n - 1),
        downsamples=(True,) + (False,) * (n - 1),
        outlook_attention=(True,) + (False,) * (n - 1),
        mlp_ratio=(cfg.outlook_mlp_ratio,) + (cfg.mlp_ratio,) * (n - 1),
        qkv_bias=cfg.qkv_bias,
        post_layers=("ca",) * cfg.num_class_layers or None,
        use_aux_head=cfg.aux_head,
        pooling_scale=cfg.pooling_scale,
    )


def create_timm_volo(model: VOLO, load_weights: bool = True, **timm_overrides) -> nn.Module:
    """The ``timm.models.volo.VOLO`` matching a vitscale VOLO (with its weights unless ``load_weights=False``;
    ``timm_overrides`` go to timm's ``VOLO``)."""
    from timm.models.volo import VOLO as TimmVOLO

    tm = TimmVOLO(**{**timm_kwargs(model.cfg), **timm_overrides})
    if load_weights:
        tm.load_state_dict(volo_to_timm(model), strict=True)
    return tm


TIMM = StateDictAdapter(
    library="timm",
    accepts=lambda m: is_library_model(m, "timm", "VOLO"),
    from_library=volo_from_timm,
    to_library=volo_to_timm,
    library_kwargs=timm_kwargs,
    create=create_timm_volo,
    names={f"volo_{d}": f"volo_{d}_224" for d in ("d1", "d2", "d3", "d4", "d5")},
    from_state_dict=volo_state_dict_from_timm,
    recognizes=keys_have("network.0.0.attn.v.weight"),
)
"""The VOLO family's timm adapter (``FamilySpec.adapters``)."""

RECOGNIZES = keys_have("outlookers.0.attn.v.weight")
"""vitscale's VOLO naming (``FamilySpec.recognizes``; timm's: ``network.0.0.*``)."""

__all__ = [
    "TIMM", "config_from_timm", "create_timm_volo", "timm_kwargs", "volo_from_timm", "volo_state_dict_from_timm",
    "volo_state_dict_to_timm", "volo_to_timm",
]  # fmt: skip
