"""Issues 6 and 10: tokens/s of full pre-training steps, tinyelectra's trainer step against transformers'
ElectraForMaskedLM + ElectraForPreTraining wired the common way, on the CPU or a CUDA GPU, in one process after
warm-up. Reports medians, the paired speed-up, peak memory, and on a GPU the hardware MFU.

    python -m benchmarks.throughput                                   # CPU, fp32, 16 x 128, synthetic batches
    python -m benchmarks.throughput --data /path/to/prepared          # batches from `tinyelectra prepare` output
    python -m benchmarks.throughput --device cuda --precision bf16 --batch 128 --compile auto [--sides tinyelectra]
      -> benchmarks/results/throughput_<device>_<precision>[_compile|_cudagraphs].json  (or --name)

tinyelectra's side is the body of `tinyelectra.train.train`'s loop, the trainer's own functions: the next
batch from a `BatchLoader` (or the next synthetic batch), `mask_step` (per-step seeds, `mask_batch`),
`global_counts`, the learning rate, and `train_step`: `Engine.forward` (PretrainStep, compiled when asked) under
autocast, the scaled backward of `electra.combine`, and `Engine.update` (unscale, clip 1.0, paper Adam, zero grads;
with --compile reduce-overhead the graph-safe update), with `runtime.tune_cpu()` on the CPU as the trainer does. Its
first call is the trainer's compile check: a compilation failing in the forward, backward or update falls back to eager,
and `compile_note` says so. The baseline (benchmarks/common.py, `HFStep`) draws its batches from an identical loader,
uses the same masking function, autocast and precision, torch AdamW, and `torch.compile` on both models when asked.

Timing: rounds of --calls-per-round steps run back to back with one device synchronisation at the end of the
round (20 steps on a GPU: the host queues the next step while the GPU runs this one, as in training); with both
sides, rounds alternate between them (A B, B A, ...) and the speed-up is the median of per-round ratios. With
--compile, the graphs compiled at the first call, graph breaks (and reasons) and any graph compiled while timing
(a recompilation) are recorded; --profile N adds the kernels (operators on the CPU) with their time per step, the
kernel and CUDA-graph launches per step, and the attention kernel SEEN in the profile (`attention_seen`: flash,
memory-efficient cutlass fmha, cuDNN, or math) beside the dispatcher's choice (`attention_dispatcher`, asked with
tensors of the real shapes); with --compile reduce-overhead, `cuda_graphs` says whether CUDA graphs ran (graph
launches per step) and gives inductor's "skipping cudagraphs due to ..." reasons: no launches, no "CUDA graphs".
The result file is rewritten after each part ("complete": false until the end).
Peak memory: CUDA, what each side holds (`common.HeldMemory`): torch's caching allocator's peak reserved memory from
the side's construction through compilation and its first three steps, CUDA graphs' private pools included (graph
replays allocate nothing, so max_memory_allocated over a replayed step misses them: the H200 run's 0.17 GB), with the
tensors alone and the device's own count beside it (`peak_memory_kind` says which is which); CPU, the peak resident
set of a fresh process that builds one side and runs 3 steps (so the two do not share an allocator).

--compile auto compiles each side as `tinyelectra train` would by default: inductor + CUDA graphs on one GPU, for
transformers' two models too (its best, so the ratio is compiled against compiled); --padding none measures batches
without padding (no attention mask: FlashAttention eligible); --grad-norm A/Bs how the compiled update computes the
gradient norm (optim.total_norm).

Hardware MFU (GPU only) uses tinyelectra.flops' hardware convention (matmul FLOPs the model needs; generator head
at the N masked slots only) for both sides: the baseline's extra full-vocabulary work is not credited to it.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see step_cpu.py: the CPU is shared with other jobs

import torch
from torch.autograd import DeviceType

from benchmarks import child_env
from benchmarks.common import (
    HeldMemory,
    HFStep,
    StepSetup,
    add_step_arguments,
    alternate,
    command_line,
    paired_ratio,
    run_main,
    step_setup,
    summarize,
    synchronize,
    synthetic_batches,
    write_result,
)

from tinyelectra import flops, runtime
from tinyelectra.config import load_recipe
from tinyelectra.electra import SpecialIds
from tinyelectra.errors import UserError

# Targets (issue 10; benchmarks, not tests). CPU: issue 6's. CUDA: ELECTRA-Small 128 x 128 in bf16 on an H100.
TARGETS = {"cpu": {"speedup": 2.0},
           "cuda": {"speedup_eager": 2.0, "speedup_compiled": 1.5, "tokens_per_s_small_b128_floor": 1.5e6,
                    "tokens_per_s_small_b128_target": 2.5e6, "peak_memory_gib_small_b128": 1.5}}
# Issue 10's estimate of the physical ceiling for Small at 128 x 128 on an H100 (every matmul memory-bound at hidden
# 256 / 64): an estimate stated by the issue, not a measurement; results report the fraction reached beside MFU.
CEILING_TOKENS_PER_S_ESTIMATE = {"H100": 5.0e6}
SIDES = ("tinyelectra", "transformers")
MEMORY_KIND = ("peak_memory_bytes = peak_reserved_bytes: the most torch's caching allocator reserved from the side's "
               "construction through its compilation, first call and two more steps (CUDA graphs recorded), over what "
               "was reserved before (empty_cache first): weights, optimizer state, activations, cached blocks and the "
               "CUDA-graph private pools. peak_allocated_bytes: tensors only (max_memory_allocated, same span). "
               "device_used_bytes_at_end: the device's used memory (mem_get_info) added by the side, libraries' "
               "workspaces included, at the end of that span")


class Batches:
    """The next batch on the device: from a prepared data directory through tinyelectra's BatchLoader (shuffled,
    prefetched, pinned), or cycling through synthetic batches padded as `padding` says (common.synthetic_batches).
    `__call__` gives (input_ids, token_type_ids, attention_mask); `batch()` a data.Batch with its host-side
    flags of the rows without padding, which the trainer's step reads to pass no attention mask where none is needed."""

    def __init__(self, data_dir: str | None, vocab_size: int, batch: int, seq_len: int, device: torch.device,
                 seed: int = 0,
                 padding: str = "builder"):
        self.loader = None
        if data_dir:
            from tinyelectra.data import BatchLoader, PretrainData  # noqa: PLC0415

            data = PretrainData(data_dir)
            if data.seq_len != seq_len or data.vocab_size != vocab_size:
                raise UserError(f"{data_dir}: rows of {data.seq_len} tokens over a {data.vocab_size} vocabulary; the "
                                f"benchmark needs {seq_len} and {vocab_size} (use --seq-len / --recipe to match)")
            self.special = SpecialIds.from_tokenizer(data.tokenizer)
            self.loader = BatchLoader(data, "train", batch, seed, device=device)
            self.source = f"prepared data {data_dir} (BatchLoader, prefetch 2)"
        else:
            self.special = SpecialIds(pad=0, cls=101, sep=102, mask=103)
            self.synthetic = synthetic_batches(vocab_size, batch, seq_len, count=8, seed=seed, device=device,
                                               padding=padding)
            self.full_rows = [mask.all(1).cpu().numpy() for _, _, mask in self.synthetic]  # once, before any timing
            self.i = 0
            self.source = f"synthetic batches (8 distinct, cycled; BERT special ids; padding: {padding})"

    def batch(self):
        from tinyelectra.data import Batch  # noqa: PLC0415

        if self.loader is not None:
            return next(self.loader)
        self.i += 1
        k = (self.i - 1) % len(self.synthetic)
        return Batch(*self.synthetic[k], full_rows=self.full_rows[k])

    def __call__(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        b = self.batch()
        return b.input_ids, b.token_type_ids, b.attention_mask


class TrainerStep:
    """One optimizer step exactly as `tinyelectra.train.train`'s loop runs it (one process, no accumulation)."""

    name = "tinyelectra"

    def __init__(self, recipe, device: torch.device, precision: str, batches: Batches) -> None:
        from tinyelectra.model import Electra  # noqa: PLC0415
        from tinyelectra.optim import build_optimizer, lr_at  # noqa: PLC0415
        from tinyelectra.step import Dist, Engine, new_sums  # noqa: PLC0415

        self.recipe, self.device, self.batches = recipe, device, batches
        torch.manual_seed(recipe.train.seed)
        self.model = Electra(recipe.model, recipe.objective.kind).to(device).train()
        self.optimizer = build_optimizer(self.model, recipe.optim, device.type)
        scaler = torch.amp.GradScaler(device.type, enabled=(precision == "fp16"))
        B = recipe.train.batch_size
        self.engine = Engine(self.model, recipe, self.optimizer, scaler, Dist(), device, precision, micro=B, accum=1)
        self.autocast = runtime.autocast_context(precision, device)
        self.lr = lambda step: lr_at(step, recipe.optim.lr, recipe.optim.warmup_steps, recipe.train.steps)
        self.sums = new_sums(device)
        self.last_loss: torch.Tensor | None = None
        self.step = 1  # past step 0, whose learning rate is 0

    @property
    def compile_note(self) -> str:
        return self.engine.compile_note  # as it stands now: says so when compilation fell back to eager

    @property
    def compiled(self) -> bool:
        return self.engine.compile_note.startswith("compile: torch.compile")

    def first_call(self) -> None:
        """Untimed: the trainer's compile check (both graphs of the step and the update; falls back to eager on
        failure; its cache as the trainer's), then one real step."""
        self.compiled_record = self.engine.compile_now(self.batches.special)
        self()

    def __call__(self) -> None:
        from tinyelectra.step import global_counts, mask_step, train_step  # noqa: PLC0415

        batch = self.batches.batch()
        masked, seeds = mask_step(batch, self.recipe, self.batches.special, self.step, 0, len(batch.input_ids), 1)
        counts = global_counts(masked, self.engine.dist)
        self.optimizer.set_lr(self.lr(self.step))
        self.last_loss = train_step(self.engine, masked, seeds, counts, self.autocast, self.sums)
        self.step += 1


class BaselineStep:
    """transformers' step (common.HFStep) fed by its own identical loader."""

    name = "transformers"

    def __init__(self, recipe, device: torch.device, precision: str, batches: Batches, compile_mode: str) -> None:
        setup = StepSetup(recipe.model, recipe.objective, recipe.optim, device, precision, special=batches.special)
        self.hf = HFStep(setup, compile_mode="off")
        self._compile_note = "compile: off"
        # "auto": transformers at its best, as the trainer's policy would run it (inductor + CUDA graphs on one GPU)
        choice = runtime.choose_compile(compile_mode, device)
        if choice.mode != "off":  # the usual way: compile each model (graph breaks allowed, as users run it)
            self.hf.gen, note = runtime.maybe_compile(self.hf.gen, choice.mode, device)
            self.hf.disc, _ = runtime.maybe_compile(self.hf.disc, choice.mode, device)
            self._compile_note = note + " (ElectraForMaskedLM and ElectraForPreTraining each)"
            if compile_mode == "auto":
                self._compile_note += f"; {choice.why}"
            if choice.cuda_graphs and device.type == "cuda" and hasattr(self.hf.gen, "before_call"):
                # the generator runs first in each step: a new generation of CUDA-graph memory starts there
                self.hf.gen.before_call = torch.compiler.cudagraph_mark_step_begin
        self.batches = batches

    @property
    def compile_note(self) -> str:
        failed = [n for n in (runtime.compile_note(m, "") for m in (self.hf.gen, self.hf.disc))
                  if n.startswith("compile: failed")]
        return failed[0] if failed else self._compile_note

    @property
    def compiled(self) -> bool:
        return self.compile_note.startswith("compile: torch.compile")

    def first_call(self) -> None:
        """Untimed: compiles both models when asked; a failure in either's forward or backward falls back to eager."""
        batch = self.batches()
        if not runtime.verify_compiled(lambda: self.hf(*batch), [self.hf.gen, self.hf.disc],
                                       reset=lambda: self.hf.opt.zero_grad(set_to_none=True)):
            if not self.compile_note.startswith("compile: failed"):
                self.hf(*batch)  # eager: the first step as it is

    def __call__(self) -> None:
        self.hf(*self.batches())


def build(side: str, args, recipe, device: torch.device, precision: str):
    batches = Batches(args.data, recipe.model.vocab_size, args.batch, args.seq_len, device, padding=args.padding)
    if side == "tinyelectra":
        return TrainerStep(recipe, device, precision, batches)
    return BaselineStep(recipe, device, precision, batches, args.compile)


def memory_probe(args, recipe, device: torch.device, precision: str) -> dict:
    """(Child process) peak RSS of building one side and running 3 steps."""
    from benchmarks.common import _rss_now_bytes, _rss_peak_bytes  # noqa: PLC0415

    rss_start = _rss_now_bytes()
    step = build(args.memory_probe, args, recipe, device, precision)
    rss_built = _rss_now_bytes()
    for _ in range(3):
        step()
    return {"peak_rss_bytes": _rss_peak_bytes(), "rss_after_import_bytes": rss_start,
            "rss_after_build_bytes": rss_built}


def cpu_memory(argv: list[str], side: str) -> dict:
    probe = [sys.executable, "-m", __spec__.name, *argv, "--memory-probe", side]
    out = subprocess.run(probe, capture_output=True, text=True, env=child_env())
    if out.returncode != 0:
        return {"error": out.stderr.strip().splitlines()[-1] if out.stderr.strip() else f"exit {out.returncode}"}
    return json.loads(out.stdout.strip().splitlines()[-1])


def dynamo_counts() -> dict:
    """torch.compile's counters so far in this process: graphs captured and graph breaks (by reason)."""
    try:
        from torch._dynamo.utils import counters  # noqa: PLC0415
    except ImportError:
        return {}
    breaks = dict(counters.get("graph_break", {}))
    return {"graphs": int(counters.get("stats", {}).get("unique_graphs", 0)), "graph_breaks": int(sum(breaks.values())),
            "graph_break_reasons": dict(sorted(breaks.items(), key=lambda kv: -kv[1])[:10])}


# What torch.profiler names in a step, as recorded on an H100 (tests/fixtures/gpu/ holds recorded profiles and cites
# where each name comes from). The attention kernel SEEN is read from these, beside the dispatcher's choice.
ATTENTION_KERNELS = (  # (label, pattern), first match wins; cuDNN's names contain "flash" too, so it comes first
    ("cuDNN", re.compile(r"cudnn\w*sdpa|cudnn_attention", re.I)),
    ("flash", re.compile(r"pytorch_flash::|flash_attention", re.I)),
    ("memory-efficient (cutlass fmha)", re.compile(r"fmha_cutlass[FB]|efficient_attention", re.I)),
)
SOFTMAX = re.compile(r"softmax", re.I)  # an unfused (math) attention shows only its softmax and matmul kernels
KERNEL_LAUNCH = re.compile(r"^(cudaLaunchKernel|cuLaunchKernel|cudaLaunchKernelExC|cuLaunchKernelEx)(_v\d+)?$")
GRAPH_LAUNCH = re.compile(r"^(cudaGraphLaunch|cuGraphLaunch)(_v\d+)?$")
# torch/_inductor/cudagraph_utils.py
CUDAGRAPH_SKIP = re.compile(r"skipping cudagraphs due to (.+?)(?:\. Found from :|$)", re.M)


# The classes of issue 33's kernel table, read from kernel (CUDA) or operator (CPU) names, first match wins, in this
# order: fused attention kernels before GEMMs (cuDNN's attention kernels are "wgmma"), layer norm and GELU before the
# sampling and losses, the update's norms after layer norm. Names as an H100 shows them (tests/fixtures/gpu/README.md)
# and as inductor names its fused kernels after the ops in them (triton_poi_fused_stack_12, ..._native_layer_norm_3).
KERNEL_CLASSES = (
    # the fused attention kernels (ATTENTION_KERNELS) and, on the CPU, SDPA's operators
    ("attention", re.compile("|".join([*(p.pattern for _, p in ATTENTION_KERNELS), "scaled_dot_product"]), re.I)),
    ("GEMM", re.compile(r"gemm|xmma|nvjet|cutlass|splitk|cublas|triton_tem_|aten::(?:mm|addmm|bmm|baddbmm|matmul)$|"
                        r"_linear_pointwise", re.I)),
    ("layer norm + residual + dropout", re.compile(r"layer_?norm|dropout", re.I)),
    ("GELU", re.compile(r"gelu", re.I)),
    ("sampling, masking + losses", re.compile(r"log_?softmax|nll_loss|cross_entropy|argmax|binary_cross|gumbel|rand|"
                                              r"philox|uniform|topk|searchsorted|cumsum", re.I)),
    ("attention", SOFTMAX),  # the unfused (math) attention's softmax
    ("optimizer: norm, clip, Adam", re.compile(r"adam|foreach|multi_tensor|amp_|non_finite|stack|norm|clamp|lerp|"
                                               r"addcmul|addcdiv|sqrt", re.I)),
    ("casts and copies", re.compile(r"to_copy|copy|convert|cast", re.I)),
)
SPLIT_K = re.compile(r"splitk", re.I)  # cuBLAS's split-K reduce kernels (issue 33: 100 of the 407 GEMM kernels)


def kernel_classes(kernels: list[dict]) -> dict:
    """Issue 33's table from a kernel table's rows (name, calls_per_step, ms_per_step): kernels and milliseconds per
    step by class (KERNEL_CLASSES; "other" for the rest), the split-K reduces counted apart inside GEMM."""
    out: dict = {}
    for k in kernels:
        label = next((c for c, pattern in KERNEL_CLASSES if pattern.search(k["name"])), "other")
        row = out.setdefault(label, {"kernels_per_step": 0.0, "ms_per_step": 0.0})
        row["kernels_per_step"] += k["calls_per_step"]
        row["ms_per_step"] += k["ms_per_step"]
        if label == "GEMM" and SPLIT_K.search(k["name"]):
            row["split_k_reduce_kernels_per_step"] = (row.get("split_k_reduce_kernels_per_step", 0.0)
                                                      + k["calls_per_step"])
            row["split_k_reduce_ms_per_step"] = row.get("split_k_reduce_ms_per_step", 0.0) + k["ms_per_step"]
    return {c: {key: round(v, 4) for key, v in row.items()} for c, row in out.items()}


def attention_seen(kernels: list[str]) -> str:
    """The attention kernels a profile's kernel (CUDA) or operator (CPU) names show, in words."""
    seen = [label for label, pattern in ATTENTION_KERNELS if any(pattern.search(k) for k in kernels)]
    if seen:
        return " + ".join(seen)
    if any(SOFTMAX.search(k) for k in kernels):
        return "math (no fused attention kernel: softmax and matmul kernels)"
    return "none seen"


def launch_counts(events: list[tuple[str, int]]) -> tuple[int, int]:
    """(kernel and graph launches, graph launches) from a profile's (runtime API event name, calls) pairs."""
    graphs = sum(n for key, n in events if GRAPH_LAUNCH.match(key))
    return graphs + sum(n for key, n in events if KERNEL_LAUNCH.match(key)), graphs


def cudagraph_skips(text: str) -> list[str]:
    """The reasons inductor gave for not using CUDA graphs ("skipping cudagraphs due to ..."), each once, in order."""
    return list(dict.fromkeys(m.group(1).strip() for m in CUDAGRAPH_SKIP.finditer(text)))


def cuda_graphs_label(graph_launches_per_step: float | None, skips: list[str]) -> str:
    """CUDA graphs as the profile shows them: graph launches per step, and inductor's reasons for skipping any."""
    why = f"; inductor skipped {'some' if graph_launches_per_step else 'them'}: {'; '.join(skips)}" if skips else ""
    if graph_launches_per_step is None:
        return "unknown: no CUDA profile"
    if graph_launches_per_step > 0:
        return f"CUDA graphs: {graph_launches_per_step:g} graph launches per step{why}"
    return f"no CUDA graphs: 0 graph launches per step{why or '; no skip reason logged'}"


class CudagraphSkips(logging.Handler):
    """Collects inductor's "skipping cudagraphs due to ..." warnings in this process (they also reach stderr)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []
        logging.getLogger("torch._inductor").addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if "skipping cudagraphs" in text:
            self.messages.append(text)


def profile_steps(step, steps: int, device: torch.device, top: int = 15) -> dict:
    """torch.profiler over `steps` steps after the timing: `kernel_table` of what ran."""
    from torch.profiler import ProfilerActivity, profile  # noqa: PLC0415

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    synchronize(device)
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        synchronize(device)
    return kernel_table(prof.key_averages(), steps, cuda, top)


def kernel_table(events, steps: int, cuda: bool, top: int = 15) -> dict:
    """From a profile's `key_averages()` over `steps` steps: the kernels (CUDA) or operators (CPU) that ran with their
    calls and device (CPU) time per step, the top ones, the attention kernels seen, and the kernel and CUDA-graph
    launches per step — a host-bound step shows many launches.

    CUDA: the device's own events (kernels, memcpy, memset). The operator that launched a kernel carries the kernel's
    time as its own "self device time" too (aten::mm's is its GEMM's), so counting operators would count every
    kernel twice. CPU: aten operators, self CPU time."""
    def self_us(e) -> float:
        return float(e.self_device_time_total if cuda else e.self_cpu_time_total)

    def measured(e) -> bool:
        return e.device_type == DeviceType.CUDA if cuda else e.key.startswith("aten::")

    rows = sorted((e for e in events if self_us(e) > 0 and measured(e)), key=self_us, reverse=True)
    total = sum(self_us(e) for e in rows) or 1.0
    kernels = [{"name": e.key[:200], "calls_per_step": e.count / steps, "ms_per_step": self_us(e) / 1000 / steps}
               for e in rows]
    launches, graphs = launch_counts([(e.key, e.count) for e in events])
    return {"steps": steps, "kind": "CUDA kernels, self device time" if cuda else "aten operators, self CPU time",
            "total_ms_per_step": total / 1000 / steps,
            "kernel_launches_per_step": launches / steps if cuda else None,
            "graph_launches_per_step": graphs / steps if cuda else None,
            "device_kernels_per_step": sum(e.count for e in rows) / steps if cuda else None,
            "attention_seen": attention_seen([k["name"] for k in kernels]), "classes": kernel_classes(kernels),
            "top": [{**k, "share": k["ms_per_step"] * 1000 * steps / total} for k in kernels[:top]], "kernels": kernels}


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_step_arguments(ap)
    ap.add_argument("--compile", default="off", choices=("off", "on", "reduce-overhead", "auto"),
                    help="torch.compile the measured sides (reduce-overhead: with CUDA graphs on a GPU; auto: as "
                         "`tinyelectra train` decides, CUDA graphs on one GPU, for both sides)")
    ap.add_argument("--padding", default="builder", choices=("builder", "none", "alternate"),
                    help="synthetic batches: 5%% short rows as the official builder (default), none (no batch needs a "
                         "mask: the mask-free attention path), alternate")
    ap.add_argument("--grad-norm", default="stack", choices=("stack", "one-op"),
                    help="how the compiled update computes the gradient norm (optim.total_norm; A/B)")
    ap.add_argument("--sides", default="both", choices=("both", *SIDES), help="which steps to measure")
    ap.add_argument("--data", default=None, help="a directory written by `tinyelectra prepare` (default: synthetic)")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--calls-per-round", type=int, default=None,
                    help="steps per timed round, back to back with one device synchronisation at the end "
                         "(default: 20 on a GPU, 1 on the CPU)")
    ap.add_argument("--profile", type=int, default=0, help="after the timing, profile this many steps per side")
    ap.add_argument("--set", action="append", default=[], help="recipe overrides, e.g. model.num_layers=1 (toy runs)")
    ap.add_argument("--no-memory", action="store_true", help="skip the peak-memory measurement")
    ap.add_argument("--memory-probe", default=None, choices=SIDES, help=argparse.SUPPRESS)
    return ap


def main(argv: list[str] | None = None) -> dict | None:
    argv = sys.argv[1:] if argv is None else argv
    args = parser().parse_args(argv)

    device, precision, precision_reason, batch = step_setup(args)
    os.environ["TINYELECTRA_GRAD_NORM"] = args.grad_norm  # read by optim.GraphSafeUpdate (memory probes inherit it)
    matmul_note = runtime.configure_matmul(precision, device)
    allocator_note = runtime.tune_cpu() if device.type == "cpu" else "n/a (CUDA caching allocator)"
    calls = args.calls_per_round or (20 if device.type == "cuda" else 1)
    recipe = load_recipe(args.recipe, [*args.set, f"train.batch_size={batch}", f"train.seq_len={args.seq_len}",
                                       f"train.compile={args.compile}", f"train.precision={precision}"])
    if args.memory_probe:
        print(json.dumps(memory_probe(args, recipe, device, precision)))
        return None
    sides = list(SIDES) if args.sides == "both" else [args.sides]
    # "auto": what the trainer runs (one process, one micro-batch)
    mode = runtime.choose_compile(args.compile, device).mode
    tag = {"off": "", "on": "_compile",
           "reduce-overhead": "_cudagraphs" if device.type == "cuda" else "_reduce-overhead"}
    name = args.name or f"throughput_{device.type}_{precision}{tag[mode]}"
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    tokens_per_step = batch * args.seq_len
    hw_flops_per_token = (flops.hardware_train_flops_per_step(recipe.model, recipe.objective, batch, args.seq_len)
                          / tokens_per_step)
    peak_precision = precision if precision != "fp32" else ("tf32" if torch.backends.cuda.matmul.allow_tf32 else "fp32")
    payload: dict = {
        "recipe": args.recipe, "overrides": args.set, "device": device_name or "cpu", "precision": precision,
        "precision_reason": precision_reason,
        "matmul": matmul_note, "allocator": allocator_note, "compile": args.compile, "compile_mode": mode,
        "sides": sides,
        "grad_norm": args.grad_norm, "padding": args.padding if not args.data else "the data's own",
        "batch_size": batch, "seq_len": args.seq_len, "tokens_per_step": tokens_per_step, "rounds": args.rounds,
        "warmup_rounds": args.warmup, "calls_per_round": calls,
        "timing": f"{calls} step(s) back to back per round, one device synchronisation at the end of each round; "
                  "the sides alternate round by round" if len(sides) > 1 else
                  f"{calls} step(s) back to back per round, one device synchronisation at the end of each round",
        "hardware_flops_per_token": hw_flops_per_token, "mfu_peak_precision": peak_precision if device_name else None,
        "targets": TARGETS[device.type], "complete": False,
    }
    from tinyelectra.model import attention_kernel  # noqa: PLC0415

    def save() -> Path:  # after every part, so a stage cut short by its time limit keeps what it measured
        return write_result(name, payload, device, out_dir=args.out_dir, command=command_line(__spec__.name, argv))

    skips = CudagraphSkips() if mode == "reduce-overhead" else None
    steps = {}
    for side in sides:  # each side built, compiled and warmed (CUDA graphs recorded) in turn: what it holds is its own
        before = dynamo_counts()
        with HeldMemory(device) as held:
            steps[side] = step = build(side, args, recipe, device, precision)
            t0 = time.perf_counter()
            step.first_call()  # compiles (if asked)
            synchronize(device)
            first_call_s = time.perf_counter() - t0
            for _ in range(2):  # CUDA graphs are recorded at the second call of each graph: counted here
                step()
        payload[side] = {"first_call_s": first_call_s, "compile_note": step.compile_note, "compiled": step.compiled}
        if getattr(step, "compiled_record", None):
            payload[side]["compile_record"] = step.compiled_record
        if device.type == "cuda" and not args.no_memory:
            payload[side].update(held.figures)
            payload[side]["peak_memory_bytes"] = held.figures["peak_reserved_bytes"]
        if mode != "off":
            after = dynamo_counts()
            payload[side]["compile"] = {"graphs_at_first_call": after.get("graphs", 0) - before.get("graphs", 0),
                                        "graph_breaks_at_first_call": (after.get("graph_breaks", 0)
                                                                       - before.get("graph_breaks", 0)),
                                        "graph_break_reasons": after.get("graph_break_reasons", {})}
        print(f"{side}: first call {payload[side]['first_call_s']:.1f} s; {step.compile_note}", flush=True)
    payload["data"] = next(iter(steps.values())).batches.source
    if device.type == "cuda" and not args.no_memory:
        payload["peak_memory_kind"] = MEMORY_KIND
    if "tinyelectra" in steps:
        te = steps["tinyelectra"]
        payload["tinyelectra"]["attention_dispatcher"] = attention_kernel(
            recipe.model, batch, args.seq_len, device, runtime.autocast_dtype(precision, device), compiled=te.compiled)
    if "transformers" in steps:
        payload["transformers"]["attention_dispatcher"] = getattr(
            steps["transformers"].hf.disc.config, "_attn_implementation", "unknown")
    save()

    def show(r: int, d: dict[str, float]) -> None:
        print(f"round {r:3d}  " + "  ".join(f"{k} {v * 1000:8.1f} ms" for k, v in d.items()), flush=True)

    load_before = os.getloadavg()[0]
    graphs_before = dynamo_counts().get("graphs", 0)
    times = alternate(dict(steps), warmup=args.warmup, repeats=args.rounds, device=device, on_round=show,
                      calls_per_round=calls)
    payload["load_average_1min_before_after"] = [load_before, os.getloadavg()[0]]
    if mode != "off":  # a graph compiled while timing is a recompilation: it would be in the times
        payload["graphs_compiled_while_timing"] = dynamo_counts().get("graphs", 0) - graphs_before
    ceiling = next((v for k, v in CEILING_TOKENS_PER_S_ESTIMATE.items() if device_name and k in device_name), None)
    for side, step in steps.items():
        s = summarize(times[side])
        tps = tokens_per_step / s["median_s"]
        payload[side].update({**s, "tokens_per_s": tps, "compile_note": step.compile_note, "compiled": step.compiled,
                              "step_seconds": [round(x, 6) for x in times[side]]})
        if device_name:
            payload[side]["hardware_mfu"] = flops.mfu(tps, hw_flops_per_token, device_name, peak_precision)
            if ceiling and args.recipe == "electra-small" and args.seq_len == 128:
                payload[side]["fraction_of_ceiling_estimate"] = tps / ceiling
    if len(sides) == 2:
        payload["speedup"] = paired_ratio(times["transformers"], times["tinyelectra"])
        speedup = payload["speedup"]["median_of_round_ratios"]
        key = "speedup" if device.type == "cpu" else ("speedup_eager" if mode == "off" else "speedup_compiled")
        payload["meets_speedup_target"] = speedup >= TARGETS[device.type][key]
    path = save()
    if not args.no_memory and device.type == "cpu":
        for side in sides:
            payload[side]["memory"] = cpu_memory(argv, side)
        payload["peak_memory_kind"] = "peak RSS (VmHWM) of a fresh process that builds one side and runs 3 steps"
        path = save()
    if args.profile:
        for side, step in steps.items():
            payload[side]["profile"] = profile_steps(step, args.profile, device)
            if skips is not None:
                from torch._dynamo.utils import counters  # noqa: PLC0415

                reasons = cudagraph_skips("\n".join(skips.messages))
                payload[side]["cuda_graphs"] = {
                    "label": cuda_graphs_label(payload[side]["profile"]["graph_launches_per_step"], reasons),
                    "skip_reasons": reasons, "skips_counted": int(counters["inductor"]["cudagraph_skips"]),
                    "graph_launches_per_step": payload[side]["profile"]["graph_launches_per_step"]}
        path = save()
    payload["complete"] = True
    path = save()
    parts = []
    for side in sides:
        d = payload[side]
        mfu = f", MFU {d['hardware_mfu']:.1%}" if d.get("hardware_mfu") else ""
        parts.append(f"{side} {d['tokens_per_s']:,.0f} tok/s{mfu}")
    ratio = f": {payload['speedup']['median_of_round_ratios']:.2f}x" if "speedup" in payload else ""
    print(f"{device_name or 'cpu'} {precision} compile {args.compile}: {', '.join(parts)}{ratio} -> {path}")
    return payload


if __name__ == "__main__":
    run_main(main)
