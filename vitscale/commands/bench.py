"""vitscale bench MODEL: training / inference throughput, TFLOP/s, MFU (in percent) and peak memory.

Each implementation runs a few untimed warm-up steps and one warm-up round (timed, not counted), then
timed rounds, alternating with the reference implementation round by round. The headline ratio is
the median of the per-round ratios; the JSON also keeps the ratio of the overall rates. Sizes not
given take the device's defaults: on a CPU a quick run (batch 8, 2 warm-up steps, 10 timed steps in 5
rounds: about a minute for ViT-S/16 against timm on 2 idle cores), on a GPU batch 32, 3 warm-up steps and
20 timed steps in 5 rounds. After the warm-up steps it says how long the rest will take.

Example:
  vitscale bench vit_s16 --device cpu --compare timm
  vitscale bench vit_s16 --device cpu --mode train --compare timm --batch-size 32 --steps 20 \\
      --json benchmarks/results/vit_s16_cpu_202611.json
"""

from __future__ import annotations

import argparse
import ast
import json
import sys

from ..registry import COMMANDS
from . import HelpFormatter


def _override(text: str) -> tuple[str, object]:
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"expected key=value, got {text!r}")
    key, value = text.split("=", 1)
    try:
        parsed = ast.literal_eval(value)
    except (ValueError, SyntaxError):
        parsed = value
    return key.strip(), parsed


HELP = "measure img/s, TFLOP/s, MFU and peak memory (optionally against timm / open_clip)"


def register(subparsers) -> None:
    from ..bench.harness import COMPARES, PRECISIONS
    from ..distributed.compile import COMPILE_MODES
    from ..distributed.epilogue import EPILOGUES, RESIDUALS
    from ..distributed.float8 import FILTERS, RECIPES
    from ..train.fastpath import SDPA_CHOICES

    p = subparsers.add_parser(
        "bench",
        help=HELP,
        description=__doc__,
        formatter_class=HelpFormatter,
    )
    p.add_argument("model", metavar="MODEL", help="registered variant (see `vitscale models`)")
    p.add_argument("--mode", choices=("train", "infer"), default="train", help="what a step is: train = forward, "
                   "loss, backward and an AdamW step (the training fast path); infer = a forward pass under "
                   "inference_mode (default: train)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="where to run: cuda = this "
                   "process's GPU (an error without CUDA); cpu = the CPU, with torch's threads (see --threads); "
                   "auto = cuda when available, else cpu (default: auto)")
    p.add_argument("--batch-size", type=int, default=None, help="images per step (default: 32 on a GPU, 8 on a CPU)")
    p.add_argument("--steps", type=int, default=None, help="timed steps per implementation (default: 20 on a GPU, "
                   "10 on a CPU)")
    p.add_argument("--warmup", type=int, default=None, help="untimed warm-up steps per implementation, before the "
                   "warm-up round (default: 3 on a GPU, 2 on a CPU)")
    p.add_argument("--rounds", type=int, default=None, help="timed rounds the steps are split into, the "
                   "implementations alternating (default: 5)")  # fmt: skip
    p.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="torch.compile each block of our model (default: on for CUDA, off on CPU)",
    )
    p.add_argument(
        "--compare",
        choices=COMPARES,
        default=None,
        help="run the reference implementation of the same architecture in the same process",
    )
    p.add_argument(
        "--compare-compiled",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also run the reference under torch.compile (default: when --compile is on)",
    )
    p.add_argument(
        "--precision", choices=PRECISIONS, default="auto", help="auto = bf16 autocast on CUDA, fp32 on CPU"
    )
    p.add_argument(
        "--sdpa",
        choices=SDPA_CHOICES,
        default="auto",
        help="attention backends (auto: flash > cuDNN > efficient > math)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the weights and the random batch (default 0)")
    p.add_argument(
        "--set",
        dest="overrides",
        type=_override,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a field of the model config, e.g. --set num_classes=10 (repeatable)",
    )
    p.add_argument(
        "--fp8", choices=RECIPES, default="none",
        help="train our blocks' linear layers in float8 with torchao (as precision.fp8; default none)",
    )
    p.add_argument("--fp8-filter", choices=FILTERS, default="auto", help="as precision.fp8_filter (default auto)")
    p.add_argument(
        "--compile-mode", choices=COMPILE_MODES, default="default",
        help="torch.compile mode of our blocks (as train.compile_mode; reduce-overhead = CUDA graphs)",
    )
    p.add_argument("--residual", choices=RESIDUALS, default="fp32", help="our blocks' residual stream under bf16 "
                   "autocast (as precision.residual; default fp32)")  # fmt: skip
    p.add_argument("--mlp-epilogue", choices=EPILOGUES, default="none", help="our blocks' GELU MLP in cuBLASLt "
                   "epilogues (as precision.mlp_epilogue; default none)")  # fmt: skip
    p.add_argument(
        "--baseline", dest="baseline", type=_override, action="append", default=[], metavar="KEY=VALUE",
        help="also run ours with this changed (fp8, fp8_filter, compile_mode, residual, mlp_epilogue or a model "
        "config field), "
        "alternating rounds: e.g. --baseline fp8=none (repeatable)",
    )
    p.add_argument("--task", default=None, help="the task whose loss the training step times (as train.task; "
                   "default: the model family's task)")
    p.add_argument("--profile-top", type=int, default=0, metavar="K", help="after the timed rounds, profile one "
                   "step of each implementation and list its K operators with the most device (CUDA) or CPU self "
                   "time, ms per step, in the log and the JSON (top_ops; default 0: no profile)")  # fmt: skip
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--json", metavar="PATH", default=None, help="write the result as JSON here")
    p.add_argument("--dry-run", action="store_true", help="check the arguments and the model, run nothing")
    p.set_defaults(func=run)


def run(args) -> int:
    import torch

    from ..bench.harness import BenchSettings, run_bench
    from ..models.registry import resolve_model

    settings = BenchSettings(
        model=args.model, mode=args.mode, device=args.device, batch_size=args.batch_size, steps=args.steps,
        warmup=args.warmup, rounds=args.rounds, compile=args.compile, compare=args.compare,
        compare_compiled=args.compare_compiled, precision=args.precision, sdpa=args.sdpa, seed=args.seed,
        overrides=dict(args.overrides), fp8=args.fp8, fp8_filter=args.fp8_filter, compile_mode=args.compile_mode,
        baseline=dict(args.baseline), task=args.task, profile_top=args.profile_top, residual=args.residual,
        mlp_epilogue=args.mlp_epilogue,
    )  # fmt: skip
    from ..bench.harness import baseline_settings, with_defaults
    from ..errors import CheckError

    variant = resolve_model(args.model)  # unknown names fail here, naming the closest
    family = variant.family
    try:  # misspelt --set / --baseline fields fail here, naming the closest, before anything is built
        variant.with_overrides(settings.overrides)
        variant.with_overrides(baseline_settings(settings).overrides)
    except (TypeError, ValueError) as e:
        raise CheckError(f"--set / --baseline: {e}") from None
    fp8 = settings.fp8 != "none" or baseline_settings(settings).fp8 != "none"
    if fp8 and args.device == "auto" and not torch.cuda.is_available():  # the README's fp8 line on a laptop
        raise CheckError(f"--fp8 {settings.fp8} measures float8 matmuls on a GPU with fp8 tensor cores (H100, L40, ...), "
                         f"and this machine has no GPU: run it on one (add --device cpu to time torchao's emulation "
                         f"on the CPU, which is slow and shows no speed-up)")  # fmt: skip
    if args.dry_run:
        on_gpu = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
        settings = with_defaults(settings, "cuda" if on_gpu else "cpu")
        from ..distributed.compile import check_compile_mode
        from ..distributed.epilogue import check_epilogue_device

        for s in (settings, baseline_settings(settings)):  # what needs a GPU, said before its time is spent
            compiled = s.compile if s.compile is not None else on_gpu  # unset: compiled on a GPU, as the bench runs it
            check_compile_mode(s.compile_mode, compile=bool(compiled), device_type="cuda" if on_gpu else "cpu", world_size=1)
            check_epilogue_device(s.mlp_epilogue, "cuda" if on_gpu else "cpu")
        if settings.fp8 != "none" or baseline_settings(settings).fp8 != "none":
            from ..distributed.float8 import require_torchao

            require_torchao()  # the GPU machine must have it: say so before its time is spent
        if args.compare:
            family.adapter(args.compare)  # a family without one: "no timm adapter for family X", one line
        print(f"dry run: {json.dumps({**settings.__dict__, 'family': family.name, 'json': args.json})}")
        return 0
    if args.threads:
        torch.set_num_threads(args.threads)
    result = run_bench(settings)
    if args.json:
        from ..bench.report import write_json

        print(f"wrote {write_json(result, args.json)}")
    return 0


COMMANDS.register("bench", sys.modules[__name__])
