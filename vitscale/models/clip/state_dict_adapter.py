"""open_clip <-> vitscale CLIP state dicts, both ways, exactly (imports nothing from open_clip).

Renames, plus three layout changes:
- attention ``in_proj`` rows: open_clip's ``nn.MultiheadAttention`` stacks ``[q; k; v]`` = ``(3, H, Dh)``;
  vitscale stores them per head ``(H, 3, Dh)`` (Megatron layout).
- ``visual.proj`` / ``text_projection`` are ``(width, output_dim)`` matrices applied as ``x @ P``;
  vitscale's ``image_proj`` / ``text_proj`` are bias-free ``nn.Linear`` whose weight is ``P.T``.
- class / position embeddings gain a leading batch dimension: ``(D,)`` -> ``(1, 1, D)``, ``(N, D)`` -> ``(1, N, D)``.
"""

from __future__ import annotations

import torch

from .configs import CLIPConfig

# open_clip block names -> vitscale block names (same tensors)
_BLOCK_RENAMES = {
    "ln_1.": "norm1.",
    "ln_2.": "norm2.",
    "attn.out_proj.": "attn.proj.",
    "mlp.c_fc.": "mlp.fc1.",
    "mlp.c_proj.": "mlp.fc2.",
    "ls_1.gamma": "ls1.gamma",
    "ls_2.gamma": "ls2.gamma",
}


def _heads_first(t: torch.Tensor, heads: int) -> torch.Tensor:
    """Rows ``(3, H, Dh)`` -> ``(H, 3, Dh)`` (weights ``(3D, in)`` or biases ``(3D,)``)."""
    return t.reshape(3, heads, -1, *t.shape[1:]).transpose(0, 1).reshape(t.shape)


def _parts_first(t: torch.Tensor, heads: int) -> torch.Tensor:
    """Rows ``(H, 3, Dh)`` -> ``(3, H, Dh)``."""
    return t.reshape(heads, 3, -1, *t.shape[1:]).transpose(0, 1).reshape(t.shape)


def _block_from_open_clip(rest: str, t: torch.Tensor, heads: int) -> tuple[str, torch.Tensor]:
    if rest.startswith("attn.in_proj_"):
        return "attn.qkv." + rest.removeprefix("attn.in_proj_"), _heads_first(t, heads)
    for old, new in _BLOCK_RENAMES.items():
        if rest.startswith(old):
            return new + rest.removeprefix(old), t
    raise KeyError(f"unexpected open_clip block key {rest!r}")


def _block_to_open_clip(rest: str, t: torch.Tensor, heads: int) -> tuple[str, torch.Tensor]:
    if rest.startswith("attn.qkv."):
        return "attn.in_proj_" + rest.removeprefix("attn.qkv."), _parts_first(t, heads)
    for old, new in _BLOCK_RENAMES.items():
        if rest.startswith(new):
            return old + rest.removeprefix(new), t
    raise KeyError(f"unexpected vitscale block key {rest!r}")


def state_dict_from_open_clip(sd: dict[str, torch.Tensor], cfg: CLIPConfig) -> dict[str, torch.Tensor]:
    """An open_clip ``CLIP`` state dict -> a vitscale :class:`CLIP` state dict for ``cfg``."""
    vh, th = cfg.vision.num_attention_heads, cfg.text.num_attention_heads
    out: dict[str, torch.Tensor] = {}
    for k, t in sd.items():
        if k == "attn_mask" or k.endswith(".attn_mask"):
            continue  # old checkpoints stored the causal mask
        if k.startswith("visual.transformer.resblocks."):
            i, rest = k.removeprefix("visual.transformer.resblocks.").split(".", 1)
            name, t = _block_from_open_clip(rest, t, vh)
            out[f"visual.blocks.{i}.{name}"] = t
        elif k.startswith("transformer.resblocks."):
            i, rest = k.removeprefix("transformer.resblocks.").split(".", 1)
            name, t = _block_from_open_clip(rest, t, th)
            out[f"text.blocks.{i}.{name}"] = t
        elif k == "visual.conv1.weight":
            out["visual.patch_embed.proj.weight"] = t
        elif k == "visual.class_embedding":
            out["visual.cls_token"] = t.reshape(1, 1, -1)  # (1, 1, D)
        elif k == "visual.positional_embedding":
            out["visual.pos_embed"] = t.unsqueeze(0)  # (1, N, D)
        elif k.startswith("visual.ln_pre."):
            out["visual.norm_pre." + k.removeprefix("visual.ln_pre.")] = t
        elif k.startswith("visual.ln_post."):
            post = "fc_norm." if cfg.vision.use_fc_norm else "norm."
            out["visual." + post + k.removeprefix("visual.ln_post.")] = t
        elif k == "visual.proj":
            out["image_proj.weight"] = t.t().contiguous()  # (E, D)
        elif k == "token_embedding.weight":
            out["text.token_embedding.weight"] = t
        elif k == "positional_embedding":
            out["text.pos_embed"] = t.unsqueeze(0)  # (1, T, D)
        elif k.startswith("ln_final."):
            out["text.norm." + k.removeprefix("ln_final.")] = t
        elif k == "text_projection":
            out["text_proj.weight"] = t.t().contiguous()  # (E, D)
        elif k in ("logit_scale", "logit_bias"):
            out[k] = t.reshape(1)  # vitscale keeps them 1-D (FSDP2 shards no 0-dim parameters)
        else:
            raise KeyError(
                f"open_clip key {k!r} has no vitscale equivalent (only ViT CLIP models are supported)"
            )
    return out


def state_dict_to_open_clip(sd: dict[str, torch.Tensor], cfg: CLIPConfig) -> dict[str, torch.Tensor]:
    """A vitscale :class:`CLIP` state dict -> an open_clip ``CLIP`` state dict (inverse of the above)."""
    vh, th = cfg.vision.num_attention_heads, cfg.text.num_attention_heads
    out: dict[str, torch.Tensor] = {}
    for k, t in sd.items():
        if k.startswith("visual.blocks."):
            i, rest = k.removeprefix("visual.blocks.").split(".", 1)
            name, t = _block_to_open_clip(rest, t, vh)
            out[f"visual.transformer.resblocks.{i}.{name}"] = t
        elif k.startswith("text.blocks."):
            i, rest = k.removeprefix("text.blocks.").split(".", 1)
            name, t = _block_to_open_clip(rest, t, th)
            out[f"transformer.resblocks.{i}.{name}"] = t
        elif k == "visual.patch_embed.proj.weight":
            out["visual.conv1.weight"] = t
        elif k == "visual.cls_token":
            out["visual.class_embedding"] = t.reshape(-1)  # (D,)
        elif k == "visual.pos_embed":
            out["visual.positional_embedding"] = t.squeeze(0)  # (N, D)
        elif k.startswith("visual.norm_pre."):
            out["visual.ln_pre." + k.removeprefix("visual.norm_pre.")] = t
        elif k.startswith(("visual.norm.", "visual.fc_norm.")):
            out["visual.ln_post." + k.split(".", 2)[2]] = t
        elif k == "image_proj.weight":
            out["visual.proj"] = t.t().contiguous()  # (D, E)
        elif k == "text.token_embedding.weight":
            out["token_embedding.weight"] = t
        elif k == "text.pos_embed":
            out["positional_embedding"] = t.squeeze(0)  # (T, D)
        elif k.startswith("text.norm."):
            out["ln_final." + k.removeprefix("text.norm.")] = t
        elif k == "text_proj.weight":
            out["text_projection"] = t.t().contiguous()  # (D, E)
        elif k in ("logit_scale", "logit_bias"):
            out[k] = t.reshape(())
        elif k.startswith("head."):
            raise ValueError("the model has a classifier head (reset_classifier): open_clip's CLIP has none")
        else:
            raise KeyError(f"vitscale key {k!r} has no open_clip equivalent")
    return out


__all__ = ["state_dict_from_open_clip", "state_dict_to_open_clip"]
