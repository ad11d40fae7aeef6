"""CLIP: a ViT image tower and a causal text transformer projected into one embedding space.

Pure single-device PyTorch; the API follows open_clip's ``CLIP`` (``encode_image``, ``encode_text``,
``forward(images, tokens)``) plus vitscale's uniform model API. Parallelism is applied from outside.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..common.checkpointing import run_blocks
from ..common.init import trunc_normal_
from ..vit.model import Block, VisionTransformer
from .configs import CLIPConfig, CLIPTextConfig


class CausalBlock(Block):
    """The ViT pre-norm block with (optionally) causal self-attention, for the text tower."""

    def __init__(self, cfg: CLIPTextConfig, drop_path: float = 0.0, device=None, dtype=None):
        super().__init__(cfg.block_config(), drop_path, device, dtype)
        self.causal = cfg.causal

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop_path1(self.ls1(self.attn(self.norm1(x), is_causal=self.causal)))
        x = x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))
        return x


class TextTransformer(nn.Module):
    """Token + position embeddings -> causal blocks -> final LayerNorm -> features at the EOT token."""

    def __init__(self, cfg: CLIPTextConfig, device=None, dtype=None):
        super().__init__()
        self.cfg = cfg
        D = cfg.hidden_size
        self.num_features = D
        self.grad_checkpointing = False
        self.token_embedding = nn.Embedding(cfg.vocab_size, D, device=device, dtype=dtype)
        self.pos_embed = nn.Parameter(torch.empty(1, cfg.encoder_seq_length, D, device=device, dtype=dtype))
        n = cfg.num_layers
        dpr = [cfg.drop_path_rate * i / max(n - 1, 1) for i in range(n)]
        self.blocks = nn.ModuleList([CausalBlock(cfg, dpr[i], device, dtype) for i in range(n)])
        self.norm = nn.LayerNorm(D, eps=cfg.norm_eps, device=device, dtype=dtype)

    @torch.no_grad()
    def init_weights(self) -> None:
        """open_clip's text-tower initialisation (scaled by width and depth)."""
        D, L = self.cfg.hidden_size, self.cfg.num_layers
        nn.init.normal_(self.token_embedding.weight, std=0.02)
        nn.init.normal_(self.pos_embed, std=0.01)
        attn_std, proj_std, fc_std = D**-0.5, D**-0.5 * (2 * L) ** -0.5, (2 * D) ** -0.5
        for blk in self.blocks:
            nn.init.normal_(blk.attn.qkv_per_head.weight, std=attn_std)
            nn.init.normal_(blk.attn.proj.weight, std=proj_std)
            nn.init.normal_(blk.mlp.fc1.weight, std=fc_std)
            nn.init.normal_(blk.mlp.fc2.weight, std=proj_std)
            for lin in (blk.attn.qkv_per_head, blk.attn.proj, blk.mlp.fc1, blk.mlp.fc2):
                if lin.bias is not None:
                    nn.init.zeros_(lin.bias)
            for norm in (blk.norm1, blk.norm2):
                nn.init.ones_(norm.weight)
                nn.init.zeros_(norm.bias)
            for m in blk.modules():
                if m is not blk and hasattr(m, "init_weights"):
                    m.init_weights()
        nn.init.ones_(self.norm.weight)
        nn.init.zeros_(self.norm.bias)

    def forward_features(self, tokens: torch.Tensor) -> torch.Tensor:
        """Token ids ``(B, T)`` -> normalised token features ``(B, T, D)``."""
        T = tokens.shape[1]
        if T > self.pos_embed.shape[1]:
            raise ValueError(f"{T} tokens exceed the context length {self.pos_embed.shape[1]}")
        x = self.token_embedding(tokens) + self.pos_embed[:, :T]  # (B, T, D)
        x = run_blocks(self.blocks, x, self.grad_checkpointing)
        return self.norm(x)

    def pool(self, x: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """``(B, T, D)`` -> ``(B, D)``: the end-of-text token (the highest id in each row, as open_clip)."""
        if self.cfg.pool == "first":
            return x[:, 0]
        if self.cfg.pool == "last":
            return x[:, -1]
        idx = tokens.argmax(dim=-1)  # (B,)
        return x[torch.arange(x.shape[0], device=x.device), idx]

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.pool(self.forward_features(tokens), tokens)


class CLIP(nn.Module):
    """Image-text contrastive model. ``cfg`` is a :class:`CLIPConfig`.

    ``visual`` is a :class:`VisionTransformer` (num_classes=0), ``text`` a :class:`TextTransformer`;
    ``image_proj`` / ``text_proj`` are bias-free projections to ``output_dim`` (open_clip's ``proj`` /
    ``text_projection`` transposed); ``logit_scale`` is the log temperature.

    Implements :class:`vitscale.models.contract.Model`; it has no per-token class logits
    (``supports_dense = False``).
    """

    supports_dense = False
    # the image tower (``visual``, a ViT) has tokens, but CLIP's pre-logits features are its projected
    # image embedding, of another width: no Tokens of the CLIP itself
    supports_tokens = False
    supports_intermediates = False
    distill_head = False  # no distillation token: distillation losses use the class logits
    input_modes = ("fixed", "multi")  # the image tower resamples its position embeddings

    def __init__(self, cfg: CLIPConfig, device=None, dtype=None):
        super().__init__()
        self.cfg = cfg
        self.visual = VisionTransformer(cfg.vision, device=device, dtype=dtype)
        self.text = TextTransformer(cfg.text, device=device, dtype=dtype)
        E = cfg.output_dim
        self.image_proj = nn.Linear(cfg.vision.hidden_size, E, bias=False, device=device, dtype=dtype)
        self.text_proj = nn.Linear(cfg.text.hidden_size, E, bias=False, device=device, dtype=dtype)
        # shape (1,), not (): FSDP2 cannot shard 0-dim parameters (open_clip's are 0-dim; converters reshape)
        self.logit_scale = nn.Parameter(torch.empty(1, device=device, dtype=dtype))
        if cfg.logit_bias_init is not None:
            self.logit_bias = nn.Parameter(torch.empty(1, device=device, dtype=dtype))
        else:
            self.register_parameter("logit_bias", None)
        self.num_features = E
        self._register_load_state_dict_pre_hook(self._reshape_scalars_on_load)
        self.num_classes = 0
        self.head = nn.Identity()  # an optional classifier on the image embedding (reset_classifier)

    def _reshape_scalars_on_load(self, state_dict, prefix, *args) -> None:
        """Accept 0-dim ``logit_scale`` / ``logit_bias`` (open_clip's shape, older checkpoints)."""
        for name in ("logit_scale", "logit_bias"):
            t = state_dict.get(prefix + name)
            if t is not None and t.ndim == 0:
                state_dict[prefix + name] = t.reshape(1)

    # ------------------------------------------------------------------ init
    @torch.no_grad()
    def init_weights(self) -> None:
        """(Re)initialise every parameter in place; works after ``to_empty()``."""
        self.visual.init_weights()
        self.text.init_weights()
        nn.init.normal_(self.image_proj.weight, std=self.cfg.vision.hidden_size**-0.5)
        nn.init.normal_(self.text_proj.weight, std=self.cfg.text.hidden_size**-0.5)
        nn.init.constant_(self.logit_scale, self.cfg.logit_scale_init)
        if self.logit_bias is not None:
            nn.init.constant_(self.logit_bias, self.cfg.logit_bias_init)
        if isinstance(self.head, nn.Linear):
            trunc_normal_(self.head.weight, std=0.02)
            nn.init.zeros_(self.head.bias)

    # ------------------------------------------------------------------ open_clip API
    def encode_image(self, images: torch.Tensor, normalize: bool = False) -> torch.Tensor:
        """Images ``(B, C, H, W)`` (already normalised) -> embeddings ``(B, output_dim)``."""
        x = self.image_proj(self.visual.forward_head(self.visual.forward_features(images), pre_logits=True))
        return F.normalize(x, dim=-1) if normalize else x

    def encode_text(self, tokens: torch.Tensor, normalize: bool = False) -> torch.Tensor:
        """Token ids ``(B, T)`` -> embeddings ``(B, output_dim)``."""
        x = self.text_proj(self.text(tokens))
        return F.normalize(x, dim=-1) if normalize else x

    def get_logit_scale(self) -> torch.Tensor:
        """``exp(logit_scale)`` clamped at ``logit_scale_max`` (100)."""
        return self.logit_scale.exp().clamp(max=self.cfg.logit_scale_max).reshape(())

    def forward(
        self,
        images: torch.Tensor | None = None,
        tokens: torch.Tensor | None = None,
        output_dict: bool = False,
        pre_logits: bool = False,
    ):
        """L2-normalised image and text features and the temperature, as open_clip's ``CLIP.forward``:
        a tuple ``(image_features, text_features, logit_scale[, logit_bias])`` or, with
        ``output_dict=True``, a dict with those keys. Either input may be None. With ``pre_logits``:
        the image embedding, not normalised (``forward_head(forward_features(images), pre_logits=True)``)."""
        if pre_logits:
            return self.forward_head(self.forward_features(images), pre_logits=True)
        img = self.encode_image(images, normalize=True) if images is not None else None
        txt = self.encode_text(tokens, normalize=True) if tokens is not None else None
        scale = self.get_logit_scale()
        if output_dict:
            out = {"image_features": img, "text_features": txt, "logit_scale": scale}
            if self.logit_bias is not None:
                out["logit_bias"] = self.logit_bias.reshape(())
            return out
        if self.logit_bias is not None:
            return img, txt, scale, self.logit_bias.reshape(())
        return img, txt, scale

    # ------------------------------------------------------------------ uniform vitscale API
    def forward_features(self, images: torch.Tensor) -> torch.Tensor:
        """Images -> the vision tower's normalised tokens ``(B, prefix + patches, D)``."""
        return self.visual.forward_features(images)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """Vision tokens -> the image embedding (``pre_logits``) or the classifier's logits when one
        was added with :meth:`reset_classifier` (else the embedding)."""
        x = self.image_proj(self.visual.forward_head(x, pre_logits=True))
        return x if pre_logits else self.head(x)

    def no_weight_decay(self) -> set[str]:
        names = {f"visual.{n}" for n in self.visual.no_weight_decay()}
        names |= {"text.pos_embed", "logit_scale"}
        if self.logit_bias is not None:
            names.add("logit_bias")
        return names

    def head_parameter_names(self) -> set[str]:
        return {f"head.{n}" for n, _ in self.head.named_parameters()}

    def reset_classifier(self, num_classes: int) -> None:
        """Add (or remove, with 0) a linear classifier on the image embedding (fine-tuning / probes)."""
        ref = self.image_proj.weight
        self.num_classes = num_classes
        if num_classes > 0:
            self.head = nn.Linear(self.cfg.output_dim, num_classes, device=ref.device, dtype=ref.dtype)
            if ref.device.type != "meta":
                with torch.no_grad():
                    trunc_normal_(self.head.weight, std=0.02)
                    nn.init.zeros_(self.head.bias)
        else:
            self.head = nn.Identity()

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        self.visual.set_grad_checkpointing(enable)
        self.text.grad_checkpointing = enable

    def example_inputs(self, batch: int, device=None) -> tuple[torch.Tensor, ...]:
        """Images and token ids (the text tower's full context)."""
        v, t = self.cfg.vision, self.cfg.text
        images = torch.randn(batch, v.num_channels, v.img_h, v.img_w, device=device)
        tokens = torch.randint(0, t.vocab_size, (batch, t.encoder_seq_length), device=device)
        return images, tokens

    def token_grid(self, img_hw: tuple[int, int]) -> tuple[int, int]:
        raise NotImplementedError(_NO_DENSE)

    def forward_dense(self, x: torch.Tensor, mix=None) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError(_NO_DENSE)

    def forward_tokens(self, x, keep=None, mask=None):
        raise NotImplementedError(_NO_TOKENS)

    def forward_intermediates(self, x, blocks):
        raise NotImplementedError(_NO_TOKENS)

    def lock_image_tower(self, unlocked_groups: int = 0) -> list[str]:
        """Freeze the image tower and its projection (LiT, Zhai et al. 2022, arXiv 2111.07991), leaving
        the last ``unlocked_groups`` groups trainable — open_clip's ``lock_image_tower`` groups
        (``open_clip/transformer.py``, ``VisionTransformer.lock``): the embeddings (patch embedding,
        class token, position embeddings, pre-norm), each block but the last, the last block with the
        final norm, the projection. Returns the frozen parameters' names."""
        v = self.visual
        groups = [[v.patch_embed, v.cls_token, v.pos_embed, v.norm_pre], *v.blocks[:-1], [v.blocks[-1], v.norm, v.fc_norm],
                  [self.image_proj]]  # fmt: skip
        return _lock(self, [v, self.image_proj], groups, unlocked_groups)

    def lock_text_tower(self, unlocked_layers: int = 0) -> list[str]:
        """Freeze the text tower and its projection, leaving the last ``unlocked_layers`` groups
        trainable — open_clip's ``lock_text_tower`` groups (``open_clip/transformer.py``): the token and
        position embeddings, each block but the last, the last block with the final norm, the
        projection. Returns the frozen parameters' names."""
        t = self.text
        groups = [[t.token_embedding, t.pos_embed], *t.blocks[:-1], [t.blocks[-1], t.norm], [self.text_proj]]
        return _lock(self, [t, self.text_proj], groups, unlocked_layers)


def _lock(model: nn.Module, towers: list[nn.Module], groups: list, unlocked: int) -> list[str]:
    """Freeze every parameter of ``towers``, then unfreeze the last ``unlocked`` of ``groups`` (each a
    module, a parameter or a list of them). Returns the names of the parameters left frozen."""
    for tower in towers:
        for p in tower.parameters():
            p.requires_grad_(False)

    def params(x):
        if x is None:
            return []
        if isinstance(x, nn.Parameter):
            return [x]
        if isinstance(x, nn.Module):
            return list(x.parameters())
        return [p for item in x for p in params(item)]

    if unlocked > 0:
        for p in params(groups[-unlocked:]):
            p.requires_grad_(True)
    return [n for n, p in model.named_parameters() if not p.requires_grad]


_NO_DENSE = "CLIP gives no per-token class logits (token labeling needs a ViT or VOLO model)"
_NO_TOKENS = ("CLIP gives no token interface (tokens, keep, mask, intermediates: its pre-logits features are the projected "
              "image embedding); self-supervised tasks and token probes need a ViT")

__all__ = ["CLIP", "CausalBlock", "TextTransformer"]
