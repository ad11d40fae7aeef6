"""Does the batch-second token layout (N, B, D) of the pycls ViT still pay with SDPA?

pycls (Meta AI, ai.meta.com/blog/significantly-faster-vision-transformer-training) laid tokens out batch-second so that ``nn.MultiheadAttention`` (which works batch-second)
needed no transposes. With ``F.scaled_dot_product_attention`` both layouts take strided q/k/v views
of the fused QKV output, and both need one copy to merge heads afterwards; this measures it. The
batch-second blocks reuse the very weights of our blocks (outputs are checked equal), and a stack of
``--layers`` blocks runs forward + backward in alternating rounds.

    python benchmarks/layout.py --model vit_s16 --device cpu --batch-size 8 \
        --json benchmarks/results/layout_cpu_202611.json
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from torch import nn

from vitscale.bench.harness import resolve_autocast
from vitscale.bench.report import git_commit, write_json
from vitscale.bench.timing import time_alternating
from vitscale.models.common.attention import sdpa
from vitscale.models.registry import get_model_config
from vitscale.models.vit.model import Block
from vitscale.train.fastpath import autocast, sdpa_backend


class BatchSecondBlock(nn.Module):
    """Our pre-norm ``Block`` run on batch-second tokens ``(N, B, D)`` with the same weights."""

    def __init__(self, block: Block):
        super().__init__()
        self.b = block

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, attn = self.b, self.b.attn
        N, B, _ = x.shape
        qkv = attn.qkv_per_head(b.norm1(x)).view(N, B, -1, 3, attn.head_dim)  # (N, B, H, 3, Dh)
        q, k, v = qkv.permute(3, 1, 2, 0, 4).unbind(0)  # 3 x (B, H, N, Dh)
        a = sdpa(q, k, v)  # (B, H, N, Dh)
        a = a.permute(2, 0, 1, 3).reshape(N, B, -1)  # (N, B, H*Dh)
        x = x + attn.proj(a)
        return x + b.mlp(b.norm2(x))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="vit_s16")
    ap.add_argument("--layers", type=int, default=2, help="blocks in the timed stack (default 2)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--precision", default="auto", choices=("auto", "fp32", "bf16"))
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--compile", action="store_true", help="torch.compile both stacks")
    ap.add_argument("--json", default=None)
    ap.add_argument("--dry-run", action="store_true", help="check the arguments and the model, run nothing")
    args = ap.parse_args()
    if args.dry_run:
        get_model_config(args.model)
        print(f"dry run: {vars(args)}")
        return

    device = torch.device(args.device)
    dtype = resolve_autocast(args.precision, device)
    precision = "fp32" if dtype is None else "bf16"
    cfg = get_model_config(args.model)
    torch.manual_seed(0)
    blocks = nn.Sequential(*[Block(cfg, device=device) for _ in range(args.layers)])
    for m in blocks.modules():
        if isinstance(m, nn.Linear):
            nn.init.trunc_normal_(m.weight, std=0.02)
            nn.init.zeros_(m.bias)
    second = nn.Sequential(*[BatchSecondBlock(b) for b in blocks])
    T = cfg.num_patches + cfg.class_token_length
    x_bf = torch.randn(args.batch_size, T, cfg.hidden_size, device=device, requires_grad=True)  # (B, N, D)
    x_bs = x_bf.detach().transpose(0, 1).contiguous().requires_grad_()  # (N, B, D)

    run_bf, run_bs = blocks, second
    if args.compile:
        run_bf, run_bs = torch.compile(blocks), torch.compile(second)
    with torch.no_grad(), sdpa_backend("auto"), autocast(device, dtype):
        diff = (run_bf(x_bf).float() - run_bs(x_bs).float().transpose(0, 1)).abs().max().item()
    assert diff < (1e-4 if precision == "fp32" else 5e-2), f"layouts disagree: {diff}"

    def train(f, x):
        def step():
            with autocast(device, dtype):
                y = f(x)
            y.float().square().mean().backward()
            for p in blocks.parameters():
                p.grad = None
            x.grad = None

        return step

    with sdpa_backend("auto"):
        res = time_alternating(
            {"batch_first": train(run_bf, x_bf), "batch_second": train(run_bs, x_bs)},
            device,
            args.steps,
            args.rounds,
        )
    name = (
        torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else f"cpu, {torch.get_num_threads()} threads"
    )
    bf, bs = res["batch_first"], res["batch_second"]
    out = {
        "benchmark": "layout", "model": args.model, "layers": args.layers, "device": name,
        "precision": precision, "batch_size": args.batch_size, "compile": args.compile, "max_abs_diff": diff,
        "batch_first_ms": bf["ms"], "batch_second_ms": bs["ms"],
        "speedup_batch_second": bf["ms"] / bs["ms"],
        "speedup_batch_second_median_round": bf["median_round_ms"] / bs["median_round_ms"],
        "speedup_batch_second_cpu_time": (res["batch_first"]["cpu_ms"] / res["batch_second"]["cpu_ms"]) if "cpu_ms" in res["batch_first"] else None,
        "rounds": res, "torch": torch.__version__, "commit": git_commit(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }  # fmt: skip
    print(json.dumps({k: v for k, v in out.items() if k != "rounds"}, indent=1))
    if args.json:
        print(f"wrote {write_json(out, args.json)}")


if __name__ == "__main__":
    main()
