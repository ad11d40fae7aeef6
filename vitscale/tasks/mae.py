"""Masked-autoencoder pretraining (``train.task=mae``): He et al. 2021, "Masked Autoencoders Are Scalable
Vision Learners", arXiv 2111.06377; reference code facebookresearch/mae at efb2a80 (``models_mae.py``,
line numbers below). Labels are ignored: any image data trains (digits, imagefolder, ...).

- **Masking** (``random_masking``, lines 123-148): each image's patches are ordered by per-sample
  noise and the first ``int(N * (1 - mae.mask_ratio))`` are kept. The noise is keyed by
  ``(train.seed, micro-step, the sample's dataset index)`` (:mod:`vitscale.data.keyed`), so a resumed
  run draws the same masks, and so does a run whose batch is split over another number of ranks.
- **Encoder** (``forward_encoder``, lines 150-170): the model's own blocks on the kept patch tokens
  (their position embeddings added first) and its prefix tokens (class token, registers), every token
  then through the model's final LayerNorm, as MAE's ``self.norm(x)`` (line 168):
  ``model(images, tokens=True, keep=ids)``'s ``prefix`` and ``patches``, the model contract's token
  interface (:class:`vitscale.models.contract.Tokens`, declared by ``supports_tokens``). That norm is
  the family's ``norm`` on a class-token model and its ``fc_norm`` on a mean-pooled one (``pool: avg``,
  which normalises after pooling): either way the LayerNorm the pooled features pass through, so MAE
  trains it. MAE's encoder adds fixed 2-D sin-cos position embeddings (lines 37, 68-69): the ViT's
  ``pos_embed_sincos: true`` (the digits recipe sets it; a learned table is the model's choice, said in
  a line at the start).
- **Decoder** (lines 46-58, ``forward_decoder`` lines 172-196): a linear map to ``mae.decoder_width``,
  the shared learnt mask token in every removed place, the tokens put back in grid order, fixed 2-D
  sin-cos position embeddings (``util/pos_embed.py``; the prefix tokens get none, as MAE's class
  token gets its zero row), ``mae.decoder_depth`` pre-norm blocks (the ViT family's ``Block``), a
  LayerNorm and a linear prediction of each patch's pixels. It is the part of the task's training
  module (:mod:`vitscale.tasks.module`: ``parts.decoder``), so it trains, is checkpointed (``task.*``)
  and resumes with the model; the exported weights (``model.safetensors``, and the run's EMA) and the
  weights another run reads from the run folder leave it out: they are the family's own model, which
  ``checkpoint.init_from``, ``vitscale eval`` and ``vitscale export`` take. Under ``torchrun`` the decoder
  is its own FSDP2 unit on the data-parallel mesh (tensor parallelism is refused in one line).
- **Loss** (``forward_loss``, lines 198-214): the mean squared error per patch against its pixels
  (``(ph, pw, C)`` order, ``patchify`` line 105), each patch normalised by its own mean and variance
  with ``mae.norm_pix_loss``, averaged over the removed patches only.
- **Health**: at log steps the effective rank of the batch's embeddings (``train_rankme``,
  :mod:`vitscale.tasks.health`): the encoder's normalised output on the visible patches (the decoder's
  input), pooled as the model pools (its class token for ``pool=token``, else the mean of the patch
  tokens).
"""

from __future__ import annotations

import torch
from torch import nn

from vitscale.data import keyed
from vitscale.distributed.parallelize import parallelize_parts
from vitscale.errors import ConfigError
from vitscale.models.common.pos_embed import sincos_2d
from vitscale.patch_layout import patchify

from .base import PretrainingTask, register_task
from .health import RankWatch
from .mae_config import MaeConfig, MaePretrainingConfig
from .module import TrainModule, freeze_unreached

STREAM_MAE_MASK, STREAM_MAE_INIT = keyed.STREAM_MAE_MASK, keyed.STREAM_MAE_INIT  # allotted in vitscale.data.keyed


# ------------------------------------------------------------------------------------------ masking
def keep_count(num_patches: int, mask_ratio: float) -> int:
    """Patches the encoder sees: ``int(N * (1 - mask_ratio))`` (``models_mae.py`` line 130)."""
    return int(num_patches * (1 - mask_ratio))


def draw_shuffle(index: torch.Tensor, step: int, seed: int, num_patches: int) -> torch.Tensor:
    """``(B, N)`` int64: each sample's patches in ascending order of its noise (MAE's ``ids_shuffle``: the
    first ``keep_count`` are kept). Sample ``i``'s noise is keyed by ``(seed, step, index[i])``: the
    same for that sample whichever rank or batch position holds it. ``index``: dataset indices (CPU)."""
    rows = [
        torch.rand(num_patches, generator=keyed.torch_gen(seed, step, int(i), STREAM_MAE_MASK))
        for i in index.tolist()
    ]
    return torch.stack(rows).argsort(dim=1)


def encoded(out) -> torch.Tensor:
    """The decoder's input ``(B, P + K, D)`` from the model's :class:`~vitscale.models.contract.Tokens`:
    the prefix and kept patch tokens, each through the model's final LayerNorm (``norm``, or ``fc_norm``
    where the model normalises after pooling), as MAE's ``forward_encoder`` ends (``models_mae.py``
    line 168: ``x = self.norm(x)``)."""
    return torch.cat([out.prefix, out.patches], dim=1)


# ------------------------------------------------------------------------------------------ loss
def mae_loss(
    pred: torch.Tensor, images: torch.Tensor, removed: torch.Tensor, patch: int, norm_pix: bool
) -> torch.Tensor:
    """MAE's ``forward_loss``: ``pred`` ``(B, N, P*P*C)``, ``images`` ``(B, C, H, W)``, ``removed``
    ``(B, N)`` (1 = removed). The mean over the removed patches of each patch's mean squared error
    against its pixels, normalised per patch (``(x - mean) / sqrt(var + 1e-6)``, the unbiased
    variance as ``Tensor.var``) with ``norm_pix``."""
    target = patchify(images.float(), patch)
    if norm_pix:
        mean, var = target.mean(dim=-1, keepdim=True), target.var(dim=-1, keepdim=True)
        target = (target - mean) / (var + 1.0e-6) ** 0.5
    per_patch = ((pred.float() - target) ** 2).mean(dim=-1)  # (B, N)
    removed = removed.to(per_patch.dtype)
    return (per_patch * removed).sum() / removed.sum()


# ------------------------------------------------------------------------------------------ decoder
class MaeDecoder(nn.Module):
    """MAE's light decoder (module docstring). ``forward(tokens, ids_restore, prefix)``: the encoder's
    tokens ``(B, prefix + K, D)`` -> predicted pixels of every patch ``(B, N, P*P*C)``."""

    def __init__(self, enc_width: int, patch_pixels: int, mc: MaeConfig, norm_eps: float = 1e-6):
        super().__init__()
        from vitscale.models.vit.configs import ViTConfig
        from vitscale.models.vit.model import Block

        W = mc.decoder_width
        # the blocks of timm's Block as MAE builds them (models_mae.py lines 53-55): qkv bias, GELU MLP,
        # LayerNorm eps 1e-6 (line 227)
        block = ViTConfig(hidden_size=W, num_attention_heads=mc.decoder_heads, ffn_hidden_size=round(W * mc.decoder_mlp_ratio),
                          num_layers=mc.decoder_depth, qkv_bias=True, norm_eps=norm_eps)  # fmt: skip
        self.embed = nn.Linear(enc_width, W)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, W))
        self.blocks = nn.ModuleList([Block(block) for _ in range(mc.decoder_depth)])
        self.norm = nn.LayerNorm(W, eps=norm_eps)
        self.pred = nn.Linear(W, patch_pixels)
        self._pos: dict[tuple, torch.Tensor] = {}

    @torch.no_grad()
    def init_weights(self) -> None:
        """MAE's ``initialize_weights`` (lines 66-93): Xavier-uniform linear weights, zero biases,
        LayerNorms 1 / 0, the mask token normal with std 0.02; draws from the global RNG."""
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        nn.init.normal_(self.mask_token, std=0.02)

    def pos_embed(self, gh: int, gw: int, like: torch.Tensor) -> torch.Tensor:
        key = (gh, gw, like.device, like.dtype)
        if key not in self._pos:
            self._pos[key] = sincos_2d(self.mask_token.shape[-1], gh, gw, like.device).to(like.dtype)[None]
        return self._pos[key]

    def forward(
        self, tokens: torch.Tensor, ids_restore: torch.Tensor, prefix: int, grid: tuple[int, int]
    ) -> torch.Tensor:
        x = self.embed(tokens)  # (B, P + K, W)
        B, N = ids_restore.shape
        W = x.shape[-1]
        patches = torch.cat(
            [x[:, prefix:], self.mask_token.to(x.dtype).expand(B, N - (x.shape[1] - prefix), W)], dim=1
        )
        patches = patches.gather(1, ids_restore[..., None].expand(-1, -1, W))  # grid order (MAE's unshuffle)
        patches = patches + self.pos_embed(*grid, patches)
        x = torch.cat([x[:, :prefix], patches], dim=1)
        for block in self.blocks:
            x = block(x)
        return self.pred(self.norm(x))[:, prefix:]


# ------------------------------------------------------------------------------------------ task
class MaeTask(PretrainingTask):
    """Its evaluations (when the run sets no ``evals:``): ``knn`` every ``eval.every`` steps and at the
    end, ``linear_probe`` (``eval.probe_*``) at the end; its log-step metric: ``train_rankme``."""

    name = "mae"
    bench_step = "MAE's masked encoder and decoder"
    bench_hint = "time an MAE step with `vitscale train` (benchmarks/mae_digits.py)"
    config = MaePretrainingConfig
    reads_labels = False  # its loss reads the images alone (vitscale.tasks.base.Task.reads_labels)

    def __init__(self, cfg, model: nn.Module, num_classes: int | None, dp_group=None, class_names=None):
        super().__init__(cfg, model, num_classes, dp_group, class_names)
        self.model = model
        self.mc: MaeConfig = cfg.mae
        self.seed = cfg.train.seed
        self.decoder: MaeDecoder | None = None
        self.rank = RankWatch(dp_group, "the encoder's pooled output on the visible patches")

    @classmethod
    def check(cls, cfg, model, dims, purpose):
        """Refused before any data is read or model built, each in one line: tensor parallelism (the
        decoder has no plan), a mask ratio that keeps no patch, a decoder width the sin-cos embeddings
        cannot take."""
        super().check(cfg, model, dims, purpose)
        if purpose != "train":
            return
        mc, name = cfg.mae, model.name
        if not model.family.model_cls.supports_tokens:
            raise ConfigError(f"train.task=mae: model {name} cannot run its encoder on the visible patches only (it "
                              "declares no tokens: supports_tokens): use a ViT (`vitscale models`)")  # fmt: skip
        if dims.distributed and dims.tp_enabled:
            raise ConfigError("train.task=mae with parallel.tp > 1: its decoder has no tensor-parallel plan yet; "
                             "use FSDP2 (parallel.tp=1)")  # fmt: skip
        mcfg, px = model.cfg, cfg.data.img_size  # the image side the run will train at (run.assemble's rule)
        h, w = (px, px) if px else (mcfg.img_h, mcfg.img_w)
        n = (h // mcfg.patch_dim) * (w // mcfg.patch_dim)
        if keep_count(n, mc.mask_ratio) < 1:
            raise ConfigError(f"mae.mask_ratio={mc.mask_ratio} keeps no patch of the {n}-patch grid of {name}: lower it "
                             f"(at most {1 - 1 / n:.4g})")  # fmt: skip
        if mc.decoder_width % 4:
            raise ConfigError(f"mae.decoder_width={mc.decoder_width} must be divisible by 4 (2-D sin-cos position "
                             "embeddings)")  # fmt: skip

    @classmethod
    def parts_on_meta(cls, group, backbone):
        """The decoder (trained)."""
        mc, bcfg = (group if group is not None else MaeConfig()), backbone.cfg
        with torch.device("meta"):
            return {"decoder": MaeDecoder(backbone.num_features, bcfg.patch_dim**2 * bcfg.num_channels, mc, bcfg.norm_eps)}

    def build(self, run):
        """Check the backbone can run on the visible patches, then build the decoder (weights keyed by
        ``train.seed``, the same on every rank; an FSDP2 unit of its own under torchrun): the training
        module's one part."""
        model, mc = self.model, self.mc
        mcfg = model.cfg
        n = mcfg.num_patches
        self.patch, self.prefix = mcfg.patch_dim, mcfg.num_prefix_tokens
        self.token_pool = mcfg.pool == "token"
        self.rank.for_run(run.total_steps)  # the run's length as the run layer resolved it
        device = next(model.parameters()).device
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(keyed.key(self.seed, STREAM_MAE_INIT))
            decoder = MaeDecoder(model.num_features, mcfg.patch_dim**2 * mcfg.num_channels, mc, mcfg.norm_eps)
            decoder.init_weights()
        n_dec = sum(p.numel() for p in decoder.parameters())
        self.decoder = decoder.to(device)
        unreached = self._freeze_unreached(mcfg, device)
        choices = []  # where the model departs from MAE's encoder, said once
        if getattr(mcfg, "pos_embed", None) == "learned" and not getattr(mcfg, "pos_embed_sincos", False):
            choices.append("mae: the encoder's position embeddings are learned (MAE's are fixed 2-D sin-cos, models_mae.py "
                           "lines 37, 68-69: model.overrides.pos_embed_sincos=true)")  # fmt: skip
        if not getattr(mcfg, "final_norm", True):
            choices.append("mae: the model has no final LayerNorm (final_norm=false): the decoder reads the blocks' output "
                           "(MAE's encoder ends in one, models_mae.py line 168)")  # fmt: skip
        frozen = ([f"mae: {len(unreached)} tensors the objective does not reach are frozen (no gradient, not in the "
                   f"optimizer): {', '.join(unreached[:3])}{', ...' if len(unreached) > 3 else ''}"]
                  if unreached else [])  # fmt: skip
        notices = [*frozen, *choices, f"mae: mask ratio {mc.mask_ratio} ({keep_count(n, mc.mask_ratio)} of {n} patches seen), decoder "
                   f"{mc.decoder_depth} x {mc.decoder_width} ({mc.decoder_heads} heads, {n_dec / 1e6:.2f}M params, not "
                   f"exported), {'per-patch normalised' if mc.norm_pix_loss else 'raw'} pixel targets",
                   "mae: TFLOP/s and MFU count the encoder on every patch (the family's count), not the visible patches "
                   "and the decoder"]  # fmt: skip
        module = TrainModule(model, {"decoder": self.decoder}, notices)
        parallelize_parts(module.layout_plan(), run.dims, run.cfg.precision)  # the decoder: an FSDP2 unit under torchrun
        self.decoder = module.parts["decoder"]
        return module

    def _freeze_unreached(self, mcfg, device) -> list[str]:
        """Freeze the model's parameters that MAE's loss does not reach (the classifier, a MAP head's
        attention pool: MAE reads the tokens before pooling): one backward pass of a blank image through
        the encoder and the decoder (:func:`~vitscale.tasks.module.freeze_unreached`). Returns their
        names."""
        n = mcfg.num_patches
        k = keep_count(n, self.mc.mask_ratio)
        x = torch.zeros(1, mcfg.num_channels, mcfg.img_h, mcfg.img_w, device=device)

        def reconstruction(model):
            tokens = encoded(model(x, tokens=True, keep=torch.arange(k, device=device)[None]))
            return self.decoder(tokens, torch.arange(n, device=device)[None], self.prefix, mcfg.grid)

        return freeze_unreached(self.model, reconstruction, others=(self.decoder,))

    def loss(self, model, batch, step):
        images = batch["image"]
        B, _, H, W = images.shape
        grid = (H // self.patch, W // self.patch)
        n = grid[0] * grid[1]
        k = keep_count(n, self.mc.mask_ratio)
        host = batch.get("host", batch)
        index = host["index"] if "index" in host else torch.arange(B)  # a stream without indices: by position
        shuffle = draw_shuffle(index, step, self.seed, n)
        if images.device.type == "cuda":  # a copy from pinned memory: the host does not wait for the GPU
            shuffle = shuffle.pin_memory()
        shuffle = shuffle.to(images.device, non_blocking=True)
        ids_restore = shuffle.argsort(dim=1)
        with self.autocast():
            tokens = encoded(model(images, tokens=True, keep=shuffle[:, :k]))  # (B, prefix + k, D)
            pred = self.decoder(tokens, ids_restore, self.prefix, grid)
        loss = mae_loss(pred, images, ids_restore >= k, self.patch, self.mc.norm_pix_loss)
        self.rank.keep(tokens[:, 0] if self.token_pool else tokens[:, self.prefix :].mean(dim=1))
        return loss, {}

    def log_metrics(self, step):
        return self.rank.read(step)



register_task(MaeTask)

__all__ = ["MaeDecoder", "MaeTask", "draw_shuffle", "encoded", "keep_count", "mae_loss", "sincos_2d"]
