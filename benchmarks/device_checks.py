"""What the machine is and whether the GPU path works: the GPU suite's `env` and `checks` stages.

    python benchmarks/device_checks.py env [--mode gpu|smoke] [--out-dir D] [--name env]
    python benchmarks/device_checks.py checks [--device cuda --recipe electra-small --batch 128 ...] [--out-dir D]

env: Python, packages, GPU, driver, C compiler, the inductor cache at the start; and the two ceilings the suite
reads MFU against beside the datasheet's peak: a bf16 8192 x 8192 x 8192 matrix product (2 n^3 FLOPs) and a 1 GiB
device-to-device copy (bytes read + bytes written), each on random data (zeros run faster), timed with CUDA events
after warm-up: the median of 5 rounds of 10. With --mode smoke (the CPU) the same code runs at toy sizes with the
host clock: a plumbing check, not a ceiling of anything.

checks (seconds, to fail fast): the trainer's own step (benchmarks/throughput.py `TrainerStep`) twice, eager, its
losses finite; then attention.gradient_safety: forward + backward through each SDPA backend alone at GLUE-like
lengths with a padding mask, including lengths whose value mod 128 is 64, in the pre-training and fine-tuning
dtypes: which backends are safe on this card.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from attention import gradient_safety  # noqa: E402
from common import add_step_arguments, command_line, run_main, step_setup, synchronize, write_result  # noqa: E402

from tinyelectra import flops, runtime  # noqa: E402
from tinyelectra.config import load_recipe  # noqa: E402

CEILING_SIZES = {"gpu": {"gemm_n": 8192, "copy_bytes": 2**30}, "smoke": {"gemm_n": 256, "copy_bytes": 2**22}}
PACKAGES = ("torch", "triton", "transformers", "tokenizers", "safetensors", "sentencepiece", "numpy", "rich", "typer",
            "matplotlib", "tensorboard")
CHECK_LENGTHS = (16, 37, 64, 100, 128, 192)  # GLUE-like; 64 and 192 are 64 mod 128


def seconds_per_call(fn, device: torch.device, calls: int = 10, rounds: int = 5, warmup: int = 3) -> float:
    """Median seconds of one call over `rounds` rounds of `calls` back to back: CUDA events on a GPU, else the host clock."""
    for _ in range(warmup):
        fn()
    synchronize(device)
    times = []
    for _ in range(rounds):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(calls):
                fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1000 / calls)
        else:
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            times.append((time.perf_counter() - t0) / calls)
    return statistics.median(times)


def ceilings(device: torch.device, mode: str) -> dict:
    """The measured bf16 matrix-product rate and device-to-device copy bandwidth (see the module docstring)."""
    size = CEILING_SIZES[mode]
    n, dtype = size["gemm_n"], torch.bfloat16 if device.type == "cuda" else torch.float32
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    c = torch.empty(n, n, device=device, dtype=dtype)
    gemm_s = seconds_per_call(lambda: torch.mm(a, b, out=c), device)
    x = torch.randn(size["copy_bytes"] // 4, device=device)
    y = torch.empty_like(x)
    copy_s = seconds_per_call(lambda: y.copy_(x), device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    datasheet = flops.peak_flops(name, "bf16") if device.type == "cuda" else None
    gemm_tflops = 2 * n**3 / gemm_s / 1e12
    return {"gemm": f"{n} x {n} x {n} {str(dtype).replace('torch.', '')}, random data", "gemm_tflops": gemm_tflops,
            "datasheet_bf16_tflops": datasheet / 1e12 if datasheet else None,
            "gemm_share_of_datasheet": gemm_tflops * 1e12 / datasheet if datasheet else None,
            "copy": f"{size['copy_bytes'] / 2**20:.0f} MiB fp32, device to device", "copy_gb_per_s": 2 * size["copy_bytes"] / copy_s / 1e9,
            "timing": "CUDA events, median of 5 rounds of 10 after 3 warm-ups" if device.type == "cuda" else
                      "host clock on the CPU (smoke: not a ceiling)"}


def env(args, argv: list[str]) -> dict:
    mode = args.mode
    cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    info: dict = {"mode": mode, "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                  "python": platform.python_version(), "platform": platform.platform(), "executable": sys.executable,
                  "cpu_count": os.cpu_count(), "c_compiler": shutil.which("cc") or shutil.which("gcc") or "none (Triton needs one)",
                  "inductor_cache": cache, "inductor_cache_empty_at_start": not (cache and Path(cache).is_dir() and any(Path(cache).iterdir()))}
    for pkg in PACKAGES:  # from the installed metadata: importing transformers or tensorboard here would take seconds
        try:
            info[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            info[pkg] = "missing"
    info["cuda_available"] = torch.cuda.is_available()
    device = torch.device("cuda" if mode == "gpu" and info["cuda_available"] else "cpu")

    def save() -> Path:
        return write_result(args.name, info, device, out_dir=args.out_dir, command=command_line("benchmarks/device_checks.py", argv))

    if mode == "gpu" and not info["cuda_available"]:
        save()
        raise SystemExit("no CUDA GPU visible to torch: the GPU stages will fail (use --cpu-smoke on a CPU)")
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(cuda=torch.version.cuda, gpu=torch.cuda.get_device_name(device), gpu_count=torch.cuda.device_count(),
                    gpu_memory_gib=props.total_memory / 2**30, compute_capability=f"{props.major}.{props.minor}",
                    multiprocessors=props.multi_processor_count, cudnn=torch.backends.cudnn.version())
        try:
            info["nvidia_smi"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                                                 "--format=csv,noheader"], capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError) as e:
            info["nvidia_smi"] = f"unavailable ({e})"
    info["ceilings"] = ceilings(device, mode)
    import tinyelectra  # noqa: PLC0415

    info["tinyelectra_from"] = os.path.dirname(tinyelectra.__file__)
    path = save()
    c = info["ceilings"]
    share = f" ({c['gemm_share_of_datasheet']:.0%} of the datasheet's {c['datasheet_bf16_tflops']:.0f})" if c["gemm_share_of_datasheet"] else ""
    print(f"{info.get('gpu', 'cpu')}: torch {info['torch']}; matrix product {c['gemm_tflops']:.1f} TFLOP/s{share}; "
          f"copy {c['copy_gb_per_s']:.0f} GB/s -> {path}")
    return info


def checks(args, argv: list[str]) -> dict:
    from throughput import Batches, TrainerStep  # noqa: PLC0415

    device, precision, _, batch = step_setup(args)
    runtime.configure_matmul(precision, device)
    recipe = load_recipe(args.recipe, [*args.set, f"train.batch_size={batch}", f"train.seq_len={args.seq_len}",
                                       "train.compile=off", f"train.precision={precision}"])
    step = TrainerStep(recipe, device, precision, Batches(None, recipe.model.vocab_size, batch, args.seq_len, device))
    losses, seconds = [], []
    for call in (step.first_call, step):
        t0 = time.perf_counter()
        call()
        losses.append(float(step.last_loss))  # a host sync: the step has finished
        seconds.append(time.perf_counter() - t0)
    dtypes = [runtime.autocast_dtype(p, device) for p in dict.fromkeys((precision, "fp32"))]  # pre-training, GLUE's fp32
    safety = gradient_safety(device, dtypes, list(CHECK_LENGTHS))
    payload = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", "recipe": args.recipe,
               "overrides": args.set, "precision": precision, "batch_size": batch, "seq_len": args.seq_len,
               "train_step": {"losses": losses, "seconds": seconds, "finite": all(map(math.isfinite, losses)),
                              "what": "the trainer's step (TrainerStep), eager, synthetic batches; the first includes warm-up"},
               "sdpa_gradients": safety}
    path = write_result(args.name or "checks", payload, device, out_dir=args.out_dir,
                        command=command_line("benchmarks/device_checks.py", argv))
    print(f"training step: losses {', '.join(f'{x:.4f}' for x in losses)} in {', '.join(f'{s:.2f}' for s in seconds)} s; "
          f"SDPA gradients safe: {', '.join(safety['safe']) or 'none'}; unsafe: {', '.join(safety['unsafe']) or 'none'} -> {path}")
    if not payload["train_step"]["finite"]:
        raise SystemExit("the training step's loss is not finite")
    return payload


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    e = sub.add_parser("env", help="environment and measured ceilings")
    e.add_argument("--mode", default="gpu", choices=("gpu", "smoke"))
    e.add_argument("--name", default="env", help="result file name")
    e.add_argument("--out-dir", default=None)
    c = sub.add_parser("checks", help="one training step; SDPA gradients per backend")
    add_step_arguments(c)
    c.add_argument("--set", action="append", default=[], help="recipe overrides, e.g. model.num_layers=1")
    return ap


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    args = parser().parse_args(argv)
    if args.command == "env":
        return env(args, argv)
    return checks(args, argv)


if __name__ == "__main__":
    run_main(main)
