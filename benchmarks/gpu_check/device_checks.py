"""What the machine is and whether the GPU path works: the GPU suite's `env`, `checks` and `glue_speed` stages.

    python -m benchmarks.gpu_check.device_checks env [--mode gpu|smoke] [--out-dir D] [--name env]
    python -m benchmarks.gpu_check.device_checks checks [--device cuda --recipe electra-small --batch 128 ...] \
        [--out-dir D]
    python -m benchmarks.gpu_check.device_checks finetune --checkpoint CKPT [--device cuda] \
        [--layouts eager:1,graphs:8,3xgraphs:10]

env: Python, packages, GPU, driver, C compiler, the inductor cache at the start; and the two ceilings the suite
reads MFU against beside the datasheet's peak: a bf16 8192 x 8192 x 8192 matrix product (2 n^3 FLOPs) and a 1 GiB
device-to-device copy (bytes read + bytes written), each on random data (zeros run faster), timed with CUDA events
after warm-up: the median of 5 rounds of 10. With --mode smoke (the CPU) the same code runs at toy sizes with the
host clock: a plumbing check, not a ceiling of anything.

checks (seconds, to fail fast): the trainer's own step (benchmarks/throughput.py `TrainerStep`) twice, eager, its
losses finite; then attention.gradient_safety: forward + backward through each SDPA backend alone at GLUE-like
lengths with a padding mask, including lengths whose value mod 128 is 64, in the pre-training and fine-tuning
dtypes: which backends are safe on this card.

finetune (the glue_speed stage): fine-tuning steps per second on this device for each way of running GLUE's jobs, so
that the suite can pick one: a layout `[Px]MODE:K` is P processes (default 1) each with K jobs in flight
(finetune.run_jobs's round robin, each job on its own CUDA stream) in step mode MODE (eager | static | graphs:
tinyelectra/finetune.py). Every job fine-tunes CKPT's encoder on rows of --width tokens (the widest bucket, so the
rate is a lower bound for GLUE's mix of lengths) at batch 32 in --precision; after each job's first steps (graph
capture and warm-up, untimed) the jobs run for --seconds, and the rate is the steps launched over the time until the
device finished them. The P processes of a layout start together and measure the same window (they wait for each
other through files in a folder), and their steps are added up.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch

from benchmarks import child_env
from benchmarks.attention import gradient_safety
from benchmarks.common import add_step_arguments, command_line, run_main, step_setup, synchronize, write_result

from tinyelectra import flops, runtime
from tinyelectra.config import load_recipe
from tinyelectra.errors import UserError

CEILING_SIZES = {"gpu": {"gemm_n": 8192, "copy_bytes": 2**30}, "smoke": {"gemm_n": 256, "copy_bytes": 2**22}}
PACKAGES = ("torch", "triton", "transformers", "tokenizers", "safetensors", "sentencepiece", "numpy", "rich", "typer",
            "matplotlib", "tensorboard")
CHECK_LENGTHS = (16, 37, 64, 100, 128, 192)  # GLUE-like; 64 and 192 are 64 mod 128


def seconds_per_call(fn, device: torch.device, calls: int = 10, rounds: int = 5, warmup: int = 3) -> float:
    """Median seconds of one call over `rounds` rounds of `calls` back to back: CUDA events on a GPU, else the host
    clock."""
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
            "copy": f"{size['copy_bytes'] / 2**20:.0f} MiB fp32, device to device",
            "copy_gb_per_s": 2 * size["copy_bytes"] / copy_s / 1e9,
            "timing": "CUDA events, median of 5 rounds of 10 after 3 warm-ups" if device.type == "cuda" else
                      "host clock on the CPU (smoke: not a ceiling)"}


def env(args, argv: list[str]) -> dict:
    mode = args.mode
    cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    info: dict = {"mode": mode, "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                  "python": platform.python_version(), "platform": platform.platform(), "executable": sys.executable,
                  "cpu_count": os.cpu_count(), "c_compiler": shutil.which("cc") or shutil.which("gcc")
                  or "none (Triton needs one)",
                  "inductor_cache": cache, "inductor_cache_empty_at_start": not (
                      cache and Path(cache).is_dir() and any(Path(cache).iterdir()))}
    for pkg in PACKAGES:  # from the installed metadata: importing transformers or tensorboard here would take seconds
        try:
            info[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            info[pkg] = "missing"
    info["cuda_available"] = torch.cuda.is_available()
    device = torch.device("cuda" if mode == "gpu" and info["cuda_available"] else "cpu")

    def save() -> Path:
        return write_result(args.name, info, device, out_dir=args.out_dir,
                            command=command_line("benchmarks.gpu_check.device_checks", argv))

    if mode == "gpu" and not info["cuda_available"]:
        save()
        raise SystemExit("no CUDA GPU visible to torch: the GPU stages will fail (use --cpu-smoke on a CPU)")
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(cuda=torch.version.cuda, gpu=torch.cuda.get_device_name(device),
                    gpu_count=torch.cuda.device_count(),
                    gpu_memory_gib=props.total_memory / 2**30, compute_capability=f"{props.major}.{props.minor}",
                    multiprocessors=props.multi_processor_count, cudnn=torch.backends.cudnn.version())
        try:
            info["nvidia_smi"] = subprocess.run(["nvidia-smi",
                                                 "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                                                 "--format=csv,noheader"], capture_output=True, text=True,
                                                timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError) as e:
            info["nvidia_smi"] = f"unavailable ({e})"
    info["ceilings"] = ceilings(device, mode)
    import tinyelectra  # noqa: PLC0415

    info["tinyelectra_from"] = os.path.dirname(tinyelectra.__file__)
    path = save()
    c = info["ceilings"]
    share = (f" ({c['gemm_share_of_datasheet']:.0%} of the datasheet's {c['datasheet_bf16_tflops']:.0f})"
             if c["gemm_share_of_datasheet"] else "")
    print(f"{info.get('gpu', 'cpu')}: torch {info['torch']}; matrix product {c['gemm_tflops']:.1f} TFLOP/s{share}; "
          f"copy {c['copy_gb_per_s']:.0f} GB/s -> {path}")
    return info


def checks(args, argv: list[str]) -> dict:
    from benchmarks.throughput import Batches, TrainerStep  # noqa: PLC0415

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
    # pre-training, GLUE's fp32
    dtypes = [runtime.autocast_dtype(p, device) for p in dict.fromkeys((precision, "fp32"))]
    safety = gradient_safety(device, dtypes, list(CHECK_LENGTHS))
    payload = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", "recipe": args.recipe,
               "overrides": args.set, "precision": precision, "batch_size": batch, "seq_len": args.seq_len,
               "train_step": {"losses": losses, "seconds": seconds, "finite": all(map(math.isfinite, losses)),
                              "what": "the trainer's step (TrainerStep), eager, synthetic batches; the first includes "
                              "warm-up"},
               "sdpa_gradients": safety}
    path = write_result(args.name or "checks", payload, device, out_dir=args.out_dir,
                        command=command_line("benchmarks.gpu_check.device_checks", argv))
    print(f"training step: losses {', '.join(f'{x:.4f}' for x in losses)} in {', '.join(f'{s:.2f}' for s in seconds)} "
          f"s; SDPA gradients safe: {', '.join(safety['safe']) or 'none'}; unsafe: "
          f"{', '.join(safety['unsafe']) or 'none'} -> {path}")
    if not payload["train_step"]["finite"]:
        raise SystemExit("the training step's loss is not finite")
    return payload


def parse_layout(text: str) -> dict:
    """`[Px]MODE:K` -> {"layout", "processes", "mode", "concurrent"}; a ValueError names what is wrong."""
    m = re.fullmatch(r"(?:(\d+)x)?(eager|static|graphs):(\d+)", text.strip())
    if not m or int(m.group(3)) < 1 or (m.group(1) is not None and int(m.group(1)) < 1):
        raise ValueError(f"layout {text!r}: expected [Px]MODE:K, e.g. graphs:8 or 3xgraphs:10 (MODE eager, static or "
                         "graphs)")
    return {"layout": text.strip(), "processes": int(m.group(1) or 1), "mode": m.group(2),
            "concurrent": int(m.group(3))}


def synthetic_task(vocab_size: int, width: int, rows: int, seed: int = 0):
    """An SST-2-shaped task (two classes) of `rows` random rows, every one exactly `width` tokens, [CLS] A [SEP] B
    [SEP]."""
    import numpy as np  # noqa: PLC0415

    from tinyelectra.finetune import EncodedTask  # noqa: PLC0415
    from tinyelectra.glue_data import EncodedSplit  # noqa: PLC0415

    rng = np.random.default_rng(seed)
    ids = rng.integers(min(1000, vocab_size // 2), vocab_size, size=(rows, width)).astype(np.int32)  # past the specials
    ids[:, 0], ids[:, width // 2], ids[:, -1] = 101, 102, 102
    split = EncodedSplit(token_ids=ids.reshape(-1), offsets=np.arange(rows + 1, dtype=np.int64) * width,
                         segment_a_lengths=np.full(rows, width // 2 + 1, dtype=np.int64),
                         labels=rng.integers(0, 2, size=rows).astype(np.int64), pad_id=0, truncated=0)
    return EncodedTask(train=split, dev={}, test=[])


FINETUNE_STEPS_PER_JOB = 6_000  # more than a job runs in a window of a few seconds (its schedule: 1.5 MB of rows)


def measure_layout(backbone, device: torch.device, precision: str, mode: str, concurrent: int, width: int,
                   seconds: float, barrier: tuple[Path, int, int] | None = None) -> dict:
    """Steps per second of `concurrent` jobs in flight in this process (see the module docstring). `barrier`
    (folder, this worker's index, workers): wait for the other processes before timing, and stop at the same time."""
    import gc  # noqa: PLC0415

    from tinyelectra.finetune import FinetuneConfig, FinetuneJob, device_split  # noqa: PLC0415

    rows = 320  # 10 steps an epoch
    task = synthetic_task(backbone.config.vocab_size, width, rows)
    fc = FinetuneConfig(precision=precision, step=mode, concurrent=concurrent, epochs=FINETUNE_STEPS_PER_JOB / 10,
                        test_predictions=False)
    t_setup = time.perf_counter()
    data = (None if mode == "eager"
            else device_split(task.train, False, fc.length_bucket, backbone.config.max_positions, device))
    streams = [torch.cuda.Stream(device) if device.type == "cuda"
               and concurrent > 1 else None for _ in range(concurrent)]
    jobs = [FinetuneJob(backbone, "sst2", task, fc, seed, device, precision, mode, data=data, stream=streams[seed],
                        shared_rng=concurrent > 1) for seed in range(concurrent)]
    for _ in range(3):  # eager: the first calls set up kernels and the allocator; static and graphs: warm
        for job in jobs:
            job.advance()
    synchronize(device)
    setup_s = time.perf_counter() - t_setup
    memory = torch.cuda.memory_reserved(device) if device.type == "cuda" else None
    start_at = None
    if barrier is not None:
        folder, index, workers = barrier
        (folder / f"ready-{index}").write_text("ready")
        while len(list(folder.glob("ready-*"))) < workers:
            time.sleep(0.01)
        start_at = time.time()
    t0, steps = time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds and jobs[0].done < jobs[0].total - 1:
        for job in jobs:
            job.advance()
        steps += len(jobs)
    synchronize(device)
    elapsed = time.perf_counter() - t0
    out = {"mode": mode, "concurrent": concurrent, "steps": steps, "seconds": elapsed,
           "steps_per_second": steps / elapsed,
           "setup_seconds": setup_s, "step": jobs[0].note, "memory_reserved_gib": memory / 2**30 if memory else None}
    if start_at is not None:
        out.update(start_unix=start_at, end_unix=start_at + elapsed)
    del jobs, data
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def finetune_speed(args, argv: list[str]) -> dict:
    import json  # noqa: PLC0415
    import tempfile  # noqa: PLC0415

    from tinyelectra.hf import load_backbone  # noqa: PLC0415

    device = runtime.pick_device(None, args.device)
    precision, _ = runtime.pick_precision(args.precision, device)
    runtime.configure_matmul(precision, device)
    runtime.guard_cudnn_sdpa(device)
    if args.threads:
        torch.set_num_threads(args.threads)
    backbone = load_backbone(Path(args.checkpoint))
    try:
        layouts = [parse_layout(x) for x in args.layouts.split(",") if x.strip()]
    except ValueError as e:
        raise UserError(f"--layouts: {e}") from None
    if args.worker:  # one process of a multi-process layout
        layout = layouts[0]
        folder = Path(args.worker)
        got = measure_layout(backbone, device, precision, layout["mode"], layout["concurrent"], args.width,
                             args.seconds,
                             (folder, args.worker_index, args.workers))
        (folder / f"worker-{args.worker_index}.json").write_text(json.dumps(got))
        return got
    results: list[dict] = []
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    payload: dict = {}
    for layout in layouts:  # the result is written after each layout: a stage stopped at its limit keeps the rest
        t0 = time.perf_counter()
        if layout["processes"] == 1:
            got = measure_layout(backbone, device, precision, layout["mode"], layout["concurrent"], args.width,
                                 args.seconds)
        else:
            got = _measure_processes(layout, args, Path(tempfile.mkdtemp(prefix="glue-speed.")))
        got.update(layout=layout["layout"], processes=layout["processes"], wall_seconds=time.perf_counter() - t0)
        results.append(got)
        print(f"{layout['layout']:>14}: {got['steps_per_second']:8.1f} steps/s ({got.get('step', '')}; "
              f"set-up {got.get('setup_seconds', 0):.1f} s)", flush=True)
        best = max(results, key=lambda r: r["steps_per_second"])
        payload = {"device": name, "precision": precision, "checkpoint": str(args.checkpoint), "width": args.width,
                   "batch_size": 32, "seconds": args.seconds, "layouts": results, "best": best["layout"],
                   "complete": len(results) == len(layouts),
                   "what": "aggregate fine-tuning steps/s of ELECTRA fine-tuning jobs (batch 32 x width) per layout: "
                           "[processes x] step mode : jobs in flight per process"}
        write_result(args.name, payload, device, out_dir=args.out_dir,
                     command=command_line("benchmarks.gpu_check.device_checks", argv))
    print(f"fastest: {payload.get('best')} -> {args.out_dir or 'benchmarks/results'}/{args.name}.json")
    return payload


def _measure_processes(layout: dict, args, folder: Path) -> dict:
    """The layout's processes, started together (each a worker of this script), their steps added up over the
    window from the first start to the last end."""
    import json  # noqa: PLC0415

    base = [sys.executable, "-m", __spec__.name, "finetune", "--checkpoint", str(args.checkpoint),
            "--device", args.device or "cuda", "--precision", args.precision, "--width", str(args.width),
            "--seconds", str(args.seconds), "--layouts", f"{layout['mode']}:{layout['concurrent']}",
            "--worker", str(folder), "--workers", str(layout["processes"]), "--threads", str(args.threads or 0)]
    procs = [subprocess.Popen([*base, "--worker-index", str(i)], stdout=subprocess.DEVNULL, env=child_env())
             for i in range(layout["processes"])]
    codes = [p.wait() for p in procs]
    if any(codes):
        raise SystemExit(f"a worker of layout {layout['layout']} failed (exit codes {codes})")
    workers = [json.loads((folder / f"worker-{i}.json").read_text()) for i in range(layout["processes"])]
    span = max(w["end_unix"] for w in workers) - min(w["start_unix"] for w in workers)
    steps = sum(w["steps"] for w in workers)
    shutil.rmtree(folder, ignore_errors=True)
    return {"mode": layout["mode"], "concurrent": layout["concurrent"], "steps": steps, "seconds": span,
            "steps_per_second": steps / span, "setup_seconds": max(w["setup_seconds"] for w in workers),
            "step": workers[0]["step"], "workers": workers}


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
    f = sub.add_parser("finetune", help="fine-tuning steps/s per layout (processes x step mode : jobs in flight)")
    f.add_argument("--checkpoint", required=True, help="a tinyelectra checkpoint (its encoder's shape and weights)")
    f.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: a GPU if there is one)")
    f.add_argument("--precision", default="auto", choices=("auto", "fp32", "bf16"))
    f.add_argument("--width", type=int, default=128, help="tokens per row (the widest bucket)")
    f.add_argument("--seconds", type=float, default=2.0, help="the timed window of each layout")
    f.add_argument("--layouts", default="graphs:32,3xgraphs:10,graphs:8,graphs:1,eager:1",
                   help="[Px]MODE:K, comma-separated")
    f.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    f.add_argument("--name", default="glue_speed", help="result file name")
    f.add_argument("--out-dir", default=None)
    f.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    f.add_argument("--worker-index", type=int, default=0, help=argparse.SUPPRESS)
    f.add_argument("--workers", type=int, default=1, help=argparse.SUPPRESS)
    return ap


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    args = parser().parse_args(argv)
    if args.command == "env":
        return env(args, argv)
    if args.command == "finetune":
        return finetune_speed(args, argv)
    return checks(args, argv)


if __name__ == "__main__":
    run_main(main)
