"""Where and how a run executes: device, precision (with the reason for the choice), autocast, torch.compile with a
fallback, CPU allocator tuning, TF32, and the CPU kernels the model is built from (`Linear`: nn.Linear whose
forward takes oneDNN for fp32 on the CPU; numpy-drawn random numbers for dropout); the low-precision weight copies a
mixed-precision forward may read instead of casting (`WeightCopies`, train.weight_copy). Each choice returns a note
string saying what was chosen, and each fast path falls back to the plain one when it cannot be used.

Not every fast path lives here: others sit beside the code they speed up: model.py (the CPU attention used with
attention dropout, the SDPA kernel report), electra.py (inverse-CDF sampling of the generator on the CPU),
tokenizer.py (the per-piece cache of `encode_batch`), glue.py (length-bucketed batches). Opt-in bf16 on the CPU is
`pick_precision`'s, for pre-training and fine-tuning alike.

Nothing here knows about ELECTRA; the trainer, GLUE fine-tuning and the benchmarks all call these.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from tinyelectra.errors import UserError


def device_name(device: torch.device, threads: bool = False) -> str:
    """The GPU's name, or the CPU model and core count (and torch's thread count when `threads`: fine-tuning runs
    several processes with one thread each), for logs, plans, checkpoint metadata and glue.json."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    import platform

    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.exists() else []
    model = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")),
                 platform.processor())
    return f"CPU ({model}, {os.cpu_count()} cores{f', {torch.get_num_threads()} threads' if threads else ''})"


def pick_device(gpu: int | None = None, device: str | None = None) -> torch.device:
    """`--device cpu|cuda|cuda:N` or `--gpu N`; by default the first CUDA GPU if there is one, else the CPU."""
    if gpu is not None and device is not None:
        raise UserError("give either --gpu or --device, not both")
    if device is not None:
        try:
            dev = torch.device(device)
        except RuntimeError:
            raise UserError(f"--device {device!r} is not a device (use cpu, cuda or cuda:N)") from None
        if dev.type == "cuda":
            return _cuda(dev.index or 0, f"--device {device}")
        if dev.type != "cpu":
            raise UserError(f"--device {device!r}: only cpu and cuda are supported")
        return dev
    if gpu is not None:
        return _cuda(gpu, f"--gpu {gpu}")
    return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")


def _cuda(index: int, flag: str) -> torch.device:
    """cuda:index if this machine has it; else a UserError naming the flag the user gave."""
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if index < 0 or index >= count:
        have = f"this machine has {count} CUDA GPU(s)" if count else "no CUDA GPU is available"
        raise UserError(f"{flag}: {have}; use --device cpu to run on the CPU")
    return torch.device("cuda", index)


def pick_process_device(gpu: int | None, device: str | None, local_rank: int, world: int) -> torch.device:
    """This process's device. One process: `pick_device`. Under torchrun (world > 1) every CUDA choice — none at all
    on a GPU machine, `--gpu N` or `--device cuda[:N]` — means cuda:LOCAL_RANK, one GPU per process, as DDP and
    NCCL need; `--device cpu` keeps every process on the CPU (gloo)."""
    dev = pick_device(gpu, device)
    if world <= 1 or dev.type != "cuda":
        return dev
    count = torch.cuda.device_count()
    if not 0 <= local_rank < count:
        raise UserError(f"torchrun: LOCAL_RANK {local_rank} but this machine has {count} CUDA GPU(s); start at most "
                        f"{count} processes per node (--nproc_per_node)")
    return torch.device("cuda", local_rank)


@dataclass(frozen=True)
class Card:
    """What `--gpu 0` picks on one CUDA card: the one card policy (`card_policy`). `pick_precision`,
    `choose_compile`, `configure_inductor_gemms`, model.varlen_blocker and model.attention_kernel all read it, and
    tinyelectra/docs/gpus.md shows it for the common cards (rendered from this by benchmarks.figures)."""

    name: str
    capability: tuple[int, int]
    memory_gib: float | None
    precision: str  # "bf16" or "fp16" (with dynamic loss scaling): what precision "auto" means here
    inductor: bool  # torch.compile's inductor can generate code for it (Triton needs compute capability 7.0+)
    flash: bool  # FlashAttention runs here: batches without padding, train.attention=varlen (Ampere, 8.0+)
    wheel: str  # which torch build to install

    @property
    def pins_gemms(self) -> bool:
        """Below 8.0 inductor is told to keep every matrix product on cuBLAS (`configure_inductor_gemms`)."""
        return self.capability < (8, 0)

    @property
    def gemms(self) -> str:
        """Who runs the matrix products under torch.compile, in the card guide's words."""
        return "cuBLAS (pinned)" if self.pins_gemms else "cuBLAS"

    @property
    def attention(self) -> str:
        """The attention kernels, in the card guide's words (model.attention_kernel asks torch's dispatcher for the
        one that runs)."""
        return "FlashAttention (no padding), mem.-efficient or cuDNN (padding)" if self.flash else "memory-efficient"

    @property
    def label(self) -> str:
        memory = f", {self.memory_gib:.0f} GiB" if self.memory_gib else ""
        return f"{self.name or 'CUDA GPU'} (compute capability {self.capability[0]}.{self.capability[1]}{memory})"


def card_policy(capability: tuple[int, int], name: str = "", memory_gib: float | None = None) -> Card:
    """The card policy, from the compute capability alone (the name and memory only label it):
      precision  bf16 from Ampere (8.0) on; fp16 with dynamic loss scaling below (V100 7.0, T4 and RTX 20xx 7.5
                 have no bf16 units);
      compile    inductor from 7.0 on (CUDA graphs where they apply: `choose_compile`); eager below, where Triton,
                 inductor's code generator, does not run;
      attention  FlashAttention from 8.0 on (unpadded batches, train.attention=varlen); padded batches take torch's
                 memory-efficient or cuDNN kernel with the padding mask on every card;
      GEMMs      cuBLAS on every card (inductor's ATen matrix products: max_autotune stays off); below 8.0 pinned to
                 cuBLAS even under max_autotune, since Triton dropped its Volta tensor-core path (MMAv1) and
                 supports 8.0+ (triton-lang/triton#5066);
      wheel      torch's CUDA 12.6 build below Turing (7.5): from torch 2.11 on it is the only build with Volta
                 kernels (pytorch/pytorch#172352, #175253; 2.12-2.14: #182849, #187075); PyPI's default from 7.5 on."""
    cap = (int(capability[0]), int(capability[1]))
    ampere = cap >= (8, 0)
    return Card(
        name=name, capability=cap, memory_gib=memory_gib,
        precision="bf16" if ampere else "fp16",
        inductor=cap >= (7, 0),
        flash=ampere,
        wheel=("PyPI's default CUDA build (pip install torch)" if cap >= (7, 5) else
               "torch's CUDA 12.6 build (pip install torch --index-url https://download.pytorch.org/whl/cu126)"),
    )


def card_of(device: torch.device) -> Card:
    """`card_policy` for this CUDA device, from torch's device properties."""
    props = torch.cuda.get_device_properties(device)
    return card_policy((props.major, props.minor), props.name, props.total_memory / 2**30)


CUBLAS_DETERMINISTIC = (":4096:8", ":16:8")  # the two settings cuBLAS documents as reproducible


def set_deterministic(enabled: bool) -> str:
    """`train.deterministic`: torch's deterministic algorithms, cuDNN without autotuning, and cuBLAS's fixed workspace
    (CUBLAS_WORKSPACE_CONFIG), without which the first cuBLAS call of a deterministic run raises. cuBLAS reads the
    variable when it creates its first handle, so call this before anything runs on the GPU (the trainer calls it
    before choosing the device). Returns a note ("" when off)."""
    if not enabled:
        return ""
    note = ""
    if os.environ.get("CUBLAS_WORKSPACE_CONFIG") not in CUBLAS_DETERMINISTIC:
        late = torch.cuda.is_available() and torch.cuda.is_initialized()
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = CUBLAS_DETERMINISTIC[0]
        if late:
            note = (" (CUDA was already initialised in this process: if cuBLAS had run, its workspace is not the "
                    "fixed one)")
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    return ("deterministic: torch deterministic algorithms, "
            f"CUBLAS_WORKSPACE_CONFIG={os.environ['CUBLAS_WORKSPACE_CONFIG']}{note}")


def pick_precision(requested: str, device: torch.device) -> tuple[str, str]:
    """("bf16" | "fp16" | "fp32", one-line reason). `requested` is auto | bf16 | fp16 | fp32; on a CUDA card "auto" is
    the card policy's precision (`card_policy`)."""
    if requested not in ("auto", "bf16", "fp16", "fp32"):
        raise UserError(f"precision {requested!r}: use auto, bf16, fp16 or fp32")
    if device.type != "cuda":
        if requested == "fp16":
            raise UserError("precision fp16 is for CUDA GPUs; on the CPU use fp32 (auto) or bf16")
        if requested == "bf16":  # opt-in: bf16 units ran fine-tuning ~1.8x faster (retired glue_cpu benchmark, 0f79abe)
            if torch.ops.mkldnn._is_mkldnn_bf16_supported():
                return "bf16", ("bf16 autocast on the CPU, as requested (not the paper's fp32; weights and optimizer "
                                "stay fp32)")
            return "bf16", ("bf16 autocast on the CPU, as requested, but this CPU has no bf16 units "
                            "(AVX512-BF16 or AMX): expect it slower than fp32")
        return "fp32", "CPU: fp32, the paper's precision (matmuls through oneDNN where available)"
    card = card_of(device)
    if requested == "auto":
        if card.precision == "bf16":
            return "bf16", (f"{card.label} supports bf16: bf16 autocast (same range as fp32, no loss scaling); "
                            "sampling and losses stay fp32")
        return "fp16", (f"{card.label} has no bf16: fp16 autocast with dynamic loss scaling; "
                        "sampling and losses stay fp32")
    if requested == "bf16" and card.precision != "bf16":
        raise UserError(f"precision bf16: {card.label} has no bf16 (it needs 8.0+: Ampere or newer); use fp16 or auto")
    reason = {"bf16": "bf16 autocast, as requested", "fp16": "fp16 autocast with dynamic loss scaling, as requested",
              "fp32": "fp32 as requested (TF32 matmuls off: the paper's arithmetic)"}[requested]
    return requested, reason


def autocast_context(precision: str, device: torch.device, cache: bool = True):
    """The autocast region for a forward pass (a no-op for fp32). `cache=False`: without autocast's cache of the
    weights' casts, which cannot live across CUDA-graph replays (step.CapturedStep); by default torch's setting (on)."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=autocast_dtype(precision, device), cache_enabled=None if cache else False)


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype:
    """The dtype the matmuls (and attention) of a forward pass run in under `autocast_context(precision, device)`."""
    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)


def configure_matmul(precision: str, device: torch.device) -> str:
    """TF32 for the fp32 matmuls that remain under mixed precision (Ampere+); off for an fp32 run, whose numbers
    must be the paper's fp32 arithmetic. Returns a note."""
    if device.type != "cuda":
        return "CPU: fp32 matmuls"
    tf32 = precision != "fp32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    return "TF32 on for fp32 leftovers under autocast" if tf32 else "TF32 off (true fp32)"


def synchronize(device: torch.device) -> None:
    """Wait until the device has finished the work queued so far (CUDA; nothing to wait for elsewhere). A host clock
    read after a CUDA step without it times the kernels' launches, not the kernels."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_gpu_memory_gib(device: torch.device) -> float | None:
    """The most GPU memory torch's allocator held for tensors in this process (GiB, 2**30 bytes); None off CUDA."""
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None


def peak_gpu_reserved_gib(device: torch.device) -> float | None:
    """The most GPU memory torch's caching allocator reserved in this process (GiB): tensors, the blocks it keeps
    cached, and CUDA graphs' private memory pools (graph replays allocate nothing: their memory is reserved when the
    graph is recorded). Not counted: the CUDA context and the libraries' own workspaces. None off CUDA."""
    return torch.cuda.max_memory_reserved(device) / 2**30 if device.type == "cuda" else None


def nonfinite_parameters(model: nn.Module) -> list[str]:
    """The names of `model`'s parameters holding a NaN or an inf (one host sync for all of them)."""
    named = list(model.named_parameters())
    finite = torch.stack([torch.isfinite(p.detach()).all() for _, p in named]).tolist() if named else []
    return [name for (name, _), ok in zip(named, finite) if not ok]


def _cudnn_sdpa_gradients_finite(device: torch.device) -> bool:
    """One forward + backward of SDPA through the cuDNN backend, bf16, 2 x 4 heads x 192 x 64, the second row padded
    from position 150 on (a (B, 1, 1, T) mask, as the model passes it): are q, k and v's gradients finite?"""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    gen = torch.Generator(device=device).manual_seed(0)
    q, k, v = (torch.randn(2, 4, 192, 64, device=device, dtype=torch.bfloat16, generator=gen).requires_grad_()
               for _ in range(3))
    mask = torch.ones(2, 1, 1, 192, dtype=torch.bool, device=device)
    mask[1, ..., 150:] = False
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask).float().sum().backward()
    return all(bool(torch.isfinite(t.grad).all()) for t in (q, k, v))


def guard_cudnn_sdpa(device: torch.device, probe=_cudnn_sdpa_gradients_finite) -> str:
    """Before fine-tuning on CUDA: torch 2.11's cuDNN attention backward on Hopper returns NaN gradients for
    padding-masked inputs whose length mod 128 is 64 (fine-tuning batches are padded to their longest row, so such
    lengths occur). `probe` (one masked forward + backward at length 192) tells; if its gradients are not finite,
    cuDNN attention is switched off for this process and the other SDPA kernels run. Returns a note ("" when nothing
    was changed: not CUDA, cuDNN attention not available, or its gradients finite)."""
    if device.type != "cuda":
        return ""
    try:
        if probe(device):
            return ""
    except (RuntimeError, AttributeError, ImportError):  # no cuDNN attention in this build or for these inputs
        return ""
    torch.backends.cuda.enable_cudnn_sdp(False)
    return ("attention: cuDNN attention off (a masked forward + backward at length 192 gave non-finite gradients: "
            "torch 2.11's cuDNN attention regression on Hopper); the other SDPA kernels run")


COMPILE_SETTINGS = ("auto", "on", "off", "reduce-overhead", "regional", "regional-graph")
# the settings whose torch.compile is one call on a function or module (`maybe_compile`); the regional ones compile
# the model's repeated blocks one by one (`compile_regions`)
WHOLE_COMPILE_SETTINGS = ("auto", "on", "off", "reduce-overhead")


@dataclass(frozen=True)
class CompileChoice:
    """What a `compile` setting means for one run: the mode ("off" | "on" | "reduce-overhead" | "regional" |
    "regional-graph") and why, in words for the log line and summary.json."""

    mode: str
    why: str

    @property
    def cuda_graphs(self) -> bool:
        """inductor's CUDA graphs (mode reduce-overhead on the whole compiled step)."""
        return self.mode == "reduce-overhead"

    @property
    def regional(self) -> bool:
        return self.mode in ("regional", "regional-graph")

    @property
    def whole_step_graph(self) -> bool:
        """tinyelectra's own capture of the whole step (forward, backward, update) as one CUDA graph."""
        return self.mode == "regional-graph"


def choose_compile(setting: str, device: torch.device, micro_batches: int = 1, processes: int = 1,
                   strategy: str = "ddp") -> CompileChoice:
    """The compile policy of a training step. "auto" means inductor + CUDA graphs (mode reduce-overhead) exactly where
    graphs apply: one CUDA device, one process, one micro-batch per step; inductor's default mode where they do not
    (several processes: DDP's gradient hooks would run inside captured graphs; several micro-batches: a graph replays
    fixed memory, so each micro-batch's backward would overwrite the gradients accumulated so far); off on the CPU and
    under DeepSpeed (its engine runs the step). An explicit "reduce-overhead" or "regional-graph" where graphs cannot
    apply is a UserError; "on", "off" and "regional" are taken as given. Precision does not matter: bf16, fp16 (loss
    scaling on the device) and fp32 all run under graphs.

    Opt-in, not measured on a GPU yet (benchmarks/ab.py decides): "regional" compiles the model's repeated blocks
    (one discriminator layer, one generator layer, the embeddings and the heads: each compiled once and reused by
    every layer of its shape, so compile time does not grow with depth) and runs the rest eager; "regional-graph"
    also captures the whole step (forward, backward and the flat update) as one CUDA graph per batch kind
    (step.CapturedStep); on the CPU, which has no CUDA graphs, the same static step runs uncaptured."""
    if setting not in COMPILE_SETTINGS:
        raise UserError(f"compile {setting!r}: use {', '.join(COMPILE_SETTINGS)}")
    if strategy == "deepspeed":
        return CompileChoice("off", "DeepSpeed's engine runs the step")
    if setting in ("off", "on", "regional"):
        return CompileChoice(setting, "as requested")
    blocker = ""
    if processes > 1:
        blocker = f"{processes} processes (DDP's gradient hooks would run inside captured graphs)"
    elif micro_batches > 1:
        blocker = (f"{micro_batches} micro-batches per step (a graph replays fixed memory: each micro-batch's backward "
                   "would overwrite the gradients accumulated so far)")
    if setting in ("reduce-overhead", "regional-graph"):
        if processes > 1:
            raise UserError(f"train.compile={setting} (CUDA graphs) is for one process; with torchrun use "
                            "train.compile=on (or auto)")
        if micro_batches > 1:
            raise UserError(f"train.compile={setting} (CUDA graphs) needs one micro-batch per step; this run "
                            f"accumulates {micro_batches} micro-batches: use train.compile=on (or auto), or a "
                            "micro-batch as large as the per-process batch")
        return CompileChoice(setting, "as requested"
                             + ("" if device.type == "cuda" else " (no CUDA graphs on the CPU)"))
    if device.type != "cuda":
        return CompileChoice("off", "auto: off on the CPU (compile time outweighs the gain for short runs)")
    card = card_of(device)
    if not card.inductor:
        return CompileChoice("off", f"auto: eager on {card.label}: inductor's code generator (Triton) needs compute "
                                    "capability 7.0+")
    if blocker:
        return CompileChoice("on", f"auto: inductor without CUDA graphs: {blocker}")
    return CompileChoice("reduce-overhead",
                         "auto: inductor + CUDA graphs (one CUDA device, one process, one micro-batch per step)")


def configure_inductor_gemms(device: torch.device) -> str:
    """Keep torch.compile's matrix products on cuBLAS where Triton has no tensor-core path (`Card.pins_gemms`: below
    compute capability 8.0): inductor's `max_autotune_gemm_backends` becomes "ATEN" (cuBLAS), so that even with
    max_autotune on (TORCHINDUCTOR_MAX_AUTOTUNE) no Triton template runs a GEMM. With max_autotune off, tinyelectra's
    default, inductor already calls cuBLAS for every GEMM on every card. Returns a note ("" where nothing changed)."""
    if device.type != "cuda" or not card_of(device).pins_gemms:
        return ""
    import torch._inductor.config as inductor_config  # noqa: PLC0415

    inductor_config.max_autotune_gemm_backends = "ATEN"
    return "GEMMs on cuBLAS"


def compile_cache(default_root: Path | None = None) -> str:
    """Where torch.compile keeps what it compiled, so that a resumed or repeated run of the same shapes does not
    compile cold: inductor's FX graph cache and AOTAutograd's cache (both on by default in torch >= 2.6; their Triton
    kernels are bundled into the FX graph cache) live under TORCHINDUCTOR_CACHE_DIR. torch's default for it is a
    folder in /tmp, which a reboot or a batch system's per-job /tmp empties: unless the variable is set, it becomes
    `default_root`/inductor (TINYELECTRA_CACHE, else ~/.cache/tinyelectra). Dynamo's tracing and the CUDA-graph
    recording are not cached: they run again at every start. Returns a note naming the folder and the caches' state."""
    if os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
        where, chosen = os.environ["TORCHINDUCTOR_CACHE_DIR"], "TORCHINDUCTOR_CACHE_DIR from the environment"
    else:
        root = default_root or Path(os.environ.get("TINYELECTRA_CACHE", Path.home() / ".cache" / "tinyelectra"))
        where, chosen = str(root / "inductor"), "tinyelectra's default; set TORCHINDUCTOR_CACHE_DIR to choose"
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = where
    try:
        import torch._functorch.config as functorch_config  # noqa: PLC0415
        import torch._inductor.config as inductor_config  # noqa: PLC0415

        caches = [name for name, on in (("FX graph", inductor_config.fx_graph_cache),
                                        ("AOTAutograd", functorch_config.enable_autograd_cache)) if on]
    except (ImportError, AttributeError):
        caches = []
    state = f"{' and '.join(caches)} caches on" if caches else "no persistent caches in this torch"
    return f"compile cache: {where} ({chosen}; {state})"


def maybe_compile(fn_or_module, mode_setting: str, device: torch.device, fullgraph: bool = False):
    """torch.compile `fn_or_module` when `mode_setting` asks for it; returns (obj, note).

    "on" (or "auto" on CUDA): inductor's default mode. "reduce-overhead": inductor plus CUDA graphs (on a GPU; the
    CPU has none, so there it is the default mode). A training step resolves "auto" with `choose_compile` first
    (CUDA graphs where they apply) and passes the mode it chose. `fullgraph=True` makes a graph break an error, i.e.
    a fallback to eager that the note reports, instead of a silently slower, partly compiled step.

    Compilation is lazy: the forward graph is compiled at the first call, the backward graph (and inductor's kernels)
    at the first backward. The returned object falls back to eager when the first call fails, and when `verify` or
    `verify_compiled` sees a forward + backward fail; its `note` always says what runs."""
    if mode_setting not in WHOLE_COMPILE_SETTINGS:
        raise UserError(f"compile {mode_setting!r}: use {', '.join(WHOLE_COMPILE_SETTINGS)}")
    if mode_setting == "off" or (mode_setting == "auto" and device.type != "cuda"):
        why = ("off as requested" if mode_setting == "off"
               else "auto: off on the CPU (compile time outweighs the gain for short runs)")
        return fn_or_module, f"compile: {why}"
    if sys.platform == "win32" or not hasattr(torch, "compile"):
        return fn_or_module, "compile: not available on this platform; running eager"
    mode = "reduce-overhead" if mode_setting == "reduce-overhead" else None
    label = "torch.compile (inductor"
    if mode:
        label += (", mode reduce-overhead: CUDA graphs" if device.type == "cuda"
                  else ", mode reduce-overhead: no CUDA graphs on the CPU")
    backend = os.environ.get("TINYELECTRA_COMPILE_BACKEND", "inductor")  # tests and the CPU smoke run: aot_eager
    kwargs: dict = {"mode": mode} if backend == "inductor" else {"backend": backend}
    if backend != "inductor":
        label = (f"torch.compile ({backend} backend from TINYELECTRA_COMPILE_BACKEND, not inductor"
                 f"{'; no CUDA graphs' if mode else ''}")
    label += ", fullgraph)" if fullgraph else ")"
    if gemms := configure_inductor_gemms(device):
        label += f"; {gemms}"
    try:
        compiled = torch.compile(fn_or_module, fullgraph=fullgraph, **kwargs)
    except Exception as e:  # noqa: BLE001 - any failure means: run eager
        return fn_or_module, f"compile: failed ({type(e).__name__}: {_short(e)}); running eager"
    wrapped = _CompiledWithFallback(compiled, fn_or_module, f"compile: {label}")
    return wrapped, wrapped.note


def compile_regions(step, regions: list[nn.Module], device: torch.device):
    """Regional compilation (train.compile = regional / regional-graph): torch.compile each of `regions` (the
    model's repeated blocks, its embeddings and heads), `step` (the module that calls them) staying eager around them;
    returns (obj, note) as `maybe_compile` does, `obj` calling `step` and falling back to eager (every region put
    back) when compilation is seen to fail.

    One compiled function per class (`forward` of Block, of Embeddings, ...), bound to each instance: dynamo keeps one
    cache entry per shape and attention-mask kind for the class's code and reuses it for every layer of that shape
    (the parameters are inputs, not constants), so a 12-layer encoder compiles what a 1-layer one does. `dynamic=False`:
    the discriminator's and the generator's widths are two static compilations, not one dynamic-shape one; fullgraph:
    a graph break inside a region is a failure (eager, said so), not a silently slower step. Inductor's default mode
    (no CUDA graphs of its own: step.CapturedStep captures the whole step where asked)."""
    import functools

    if sys.platform == "win32" or not hasattr(torch, "compile"):
        return step, "compile: not available on this platform; running eager"
    backend = os.environ.get("TINYELECTRA_COMPILE_BACKEND", "inductor")  # tests and the CPU smoke run: aot_eager
    kwargs: dict = {} if backend == "inductor" else {"backend": backend}
    gemms = configure_inductor_gemms(device)
    compiled: dict[type, object] = {}
    try:
        for region in regions:
            cls = type(region)
            if cls not in compiled:
                compiled[cls] = torch.compile(cls.forward, dynamic=False, fullgraph=True, **kwargs)
            region.forward = functools.partial(compiled[cls], region)  # this instance calls the compiled function
    except Exception as e:  # noqa: BLE001 - any failure means: run eager
        _uncompile(regions)
        return step, f"compile: failed ({type(e).__name__}: {_short(e)}); running eager"
    kinds = ", ".join(f"{cls.__name__} x{sum(type(r) is cls for r in regions)}" for cls in compiled)
    what = "inductor" if backend == "inductor" else f"{backend} backend from TINYELECTRA_COMPILE_BACKEND, not inductor"
    note = (f"compile: torch.compile per region ({what}, regional: {len(regions)} regions of {len(compiled)} kinds "
            f"({kinds}), each kind compiled once per shape; the rest eager, fullgraph per region)"
            f"{'; ' + gemms if gemms else ''}")
    wrapped = _CompiledWithFallback(step, step, note, undo=lambda: _uncompile(regions))
    return wrapped, wrapped.note


def _uncompile(regions: list[nn.Module]) -> None:
    for region in regions:
        region.__dict__.pop("forward", None)  # the class's own forward again


def clear_compile_times() -> None:
    """Forget torch's compilation records so far (`compile_time_split` then reads what follows)."""
    with contextlib.suppress(ImportError, AttributeError):
        from torch._dynamo.utils import clear_compilation_metrics  # noqa: PLC0415

        clear_compilation_metrics()


def compile_time_split(metrics: list | None = None) -> dict:
    """Where the compile time since the last `torch._dynamo.utils.clear_compilation_metrics()` went, in seconds, from
    torch's own per-compilation records (`torch._dynamo.utils.get_compilation_metrics()`, CompilationMetrics; the
    same fields in torch 2.6 to 2.13, read with getattr so that a missing one is None, not an error):
      dynamo     tracing the Python code and building guards (each frame's total less its backend compile);
      aot        AOTAutograd: the joint forward + backward graph, its partition (backend compile less inductor's);
      inductor   lowering, code generation and the kernels' compilation, forward and backward graphs;
      backward   the backward graphs' compile, lazy at the first backward (inductor's share of it counted above too);
      graphs     the frames compiled (forward graphs), and `cudagraphify` inductor's CUDA-graph recording
                 (mode reduce-overhead; runtime records), None where nothing was recorded.
    tinyelectra's own CUDA-graph capture (step.CapturedStep) is timed where it runs."""
    if metrics is None:
        try:
            from torch._dynamo.utils import get_compilation_metrics  # noqa: PLC0415

            metrics = list(get_compilation_metrics())
        except (ImportError, AttributeError):
            return {"available": False}

    def us(m, field: str) -> float:
        return (getattr(m, field, None) or 0) / 1e6

    frames = [m for m in metrics if getattr(m, "dynamo_cumulative_compile_time_us", None) is not None]
    backward = [m for m in metrics if getattr(m, "backward_cumulative_compile_time_us", None) is not None]
    cudagraphify = sum(us(m, "runtime_cudagraphify_time_us") for m in metrics)
    return {
        "available": True,
        "dynamo_s": round(sum(us(m, "dynamo_cumulative_compile_time_us")
                              - us(m, "aot_autograd_cumulative_compile_time_us") for m in frames), 3),
        "aot_s": round(sum(us(m, "aot_autograd_cumulative_compile_time_us")
                           - us(m, "inductor_cumulative_compile_time_us") for m in frames), 3),
        "inductor_s": round(sum(us(m, "inductor_cumulative_compile_time_us") for m in frames + backward), 3),
        "backward_s": round(sum(us(m, "backward_cumulative_compile_time_us") for m in backward), 3),
        "cudagraphify_s": round(cudagraphify, 3) if cudagraphify else None,
        "graphs": len(frames),
    }


def compile_split_line(split: dict) -> str:
    """`compile_time_split`'s record in words, for the log."""
    if not split.get("available"):
        return "compile time split: not available in this torch"
    parts = [f"dynamo {split['dynamo_s']:.1f} s", f"AOT autograd {split['aot_s']:.1f} s",
             f"inductor {split['inductor_s']:.1f} s (backward graphs {split['backward_s']:.1f} s)"]
    if split.get("cudagraphify_s"):
        parts.append(f"inductor's CUDA-graph recording {split['cudagraphify_s']:.1f} s")
    if split.get("capture_s") is not None:
        parts.append(f"whole-step CUDA-graph capture {split['capture_s']:.1f} s")
    return f"compile time: {', '.join(parts)}; {split['graphs']} graph(s)"


def _short(e: BaseException, limit: int = 200) -> str:
    text = " ".join(str(e).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class _CompiledWithFallback:
    """Calls the compiled function or module; runs the eager one from the moment compilation is seen to fail (the
    first call raising, or `verify`'s forward + backward raising), and says so in `note`. Other attributes are the
    eager object's."""

    def __init__(self, compiled, eager, note: str = "compile: torch.compile (inductor)", undo=None) -> None:
        self.compiled, self.eager = compiled, eager
        self.undo = undo  # what makes `eager` eager again when it was compiled in place (compile_regions)
        self.note = note
        self.compiled_ok = True  # False once it fell back
        self.before_call = None  # e.g. torch.compiler.cudagraph_mark_step_begin for a CUDA-graphed training step
        self._checked = False

    def __call__(self, *args, **kwargs):
        if self.before_call is not None and self.compiled_ok:
            self.before_call()
        if self._checked:
            return self.compiled(*args, **kwargs)
        try:
            out = self.compiled(*args, **kwargs)
        except torch.OutOfMemoryError:
            raise
        except Exception as e:  # noqa: BLE001
            self.fall_back("on its first call", e)
            out = self.eager(*args, **kwargs)
        self._checked = True
        return out

    def fall_back(self, when: str, e: BaseException) -> None:
        """Run eager from now on; the note says when and why."""
        self.compiled = self.eager
        if self.undo is not None:
            self.undo()
        self.compiled_ok = False
        self._checked = True
        self.note = f"compile: failed {when} ({type(e).__name__}: {_short(e)}); running eager"
        # the whole error once, for whoever reads the log (the note above is one line)
        print(f"torch.compile failed {when}; running eager. {type(e).__name__}: {str(e)[:4000]}", file=sys.stderr)

    def verify(self, trial, reset=None) -> bool:
        """See `verify_compiled`."""
        return verify_compiled(trial, [self], reset)

    def __getattr__(self, name: str):
        return getattr(self.eager, name)


def verify_compiled(trial, objs, reset=None) -> bool:
    """Run `trial()` — one forward and backward through the objects `maybe_compile` returned — before the real
    work, so that a compilation failure in the forward *or the backward* (compiled lazily at the first backward)
    happens here. On failure every compiled object in `objs` falls back to eager with a note saying so and
    `reset()` runs (e.g. zero the gradients a failed backward may have left); an out-of-memory error is not a
    compilation failure and is raised. Returns True when everything compiled still runs compiled."""
    wrapped = [o for o in objs if isinstance(o, _CompiledWithFallback) and o.compiled_ok]
    if not wrapped:
        return False
    try:
        trial()
    except torch.OutOfMemoryError:
        raise
    except Exception as e:  # noqa: BLE001 - a backend failing in forward or backward: run eager
        for o in wrapped:
            o.fall_back("in the first forward + backward", e)
        if reset is not None:
            reset()
        return False
    for o in wrapped:
        o._checked = True
    return all(o.compiled_ok for o in wrapped)


def compile_note(obj, default: str) -> str:
    """The note of an object `maybe_compile` returned, as it stands now (it changes when compilation falls back)."""
    return getattr(obj, "note", default) if isinstance(obj, _CompiledWithFallback) else default


SDPA_KERNELS = {0: "math (unfused: T x T scores in memory)", 1: "flash", 2: "memory-efficient", 3: "cuDNN",
                4: "overrideable"}


def sdpa_kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None,
                dropout_p: float) -> dict:
    """Which kernel F.scaled_dot_product_attention picks for inputs like these (torch's own dispatcher,
    `torch._fused_sdp_choice`, under the current `sdpa_kernel` / backend settings), and on CUDA why FlashAttention
    is not eligible when it is not (torch's debug reasons). Returns {"kernel", "flash_eligible", "why_not_flash"}."""
    out: dict = {"kernel": "unknown", "flash_eligible": None, "why_not_flash": None}
    try:
        choice = int(torch._fused_sdp_choice(q, k, v, attn_mask, dropout_p, False))
        out["kernel"] = SDPA_KERNELS.get(choice, f"backend {choice}")
    except (AttributeError, RuntimeError, TypeError) as e:
        out["kernel"] = f"unknown ({type(e).__name__}: {_short(e, 120)})"
    if q.device.type == "cuda":
        import warnings

        try:
            params = torch.backends.cuda.SDPAParams(q, k, v, attn_mask, dropout_p, False, False)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                ok = torch.backends.cuda.can_use_flash_attention(params, True)
            out["flash_eligible"] = bool(ok)
            if not ok:
                out["why_not_flash"] = ("; ".join(_short(w.message, 160) for w in caught)
                                        or "not eligible (no reason given)")
        except (AttributeError, RuntimeError, TypeError) as e:
            out["why_not_flash"] = f"unknown ({type(e).__name__}: {_short(e, 120)})"
    return out


# glibc mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def tune_cpu() -> str:
    """Keep freed memory in the process instead of handing it back to the OS (glibc only). Returns a note.

    A training step allocates the same large temporaries every time (generator logits and their gradient, Gumbel
    noise, activations). glibc serves blocks above its mmap threshold (at most 32 MiB by default) with fresh mmap
    pages and unmaps them on free, so every step page-faults and zeroes those pages again. Raising the threshold to
    1 GiB and never trimming the heap makes later steps reuse the same memory (measured in benchmarks/NOTES.md)."""
    if not sys.platform.startswith("linux"):
        return "CPU allocator: unchanged (not Linux)"
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return "CPU allocator: unchanged (no glibc mallopt)"
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    ok = mallopt(_M_MMAP_THRESHOLD, 1 << 30) == 1 and mallopt(_M_TRIM_THRESHOLD, -1) == 1  # -1: "never trim"
    return ("CPU allocator: glibc mmap threshold 1 GiB, no trimming" if ok
            else "CPU allocator: mallopt refused; unchanged")


def openmp_note() -> tuple[str, dict]:
    """torch's CPU thread count and how its OpenMP threads wait for work, with who chose it: (log line, record).

    The command line sets OMP_WAIT_POLICY=PASSIVE (and TINYELECTRA_SET_OMP_WAIT_POLICY=1, so that this can tell)
    when neither it nor libgomp's GOMP_SPINCOUNT is set: libgomp's own default spins about 300,000 times before a
    waiting thread sleeps, which on a CPU where another program keeps a core busy made training 2-21x slower
    (benchmarks/NOTES.md). OpenMP reads these once, when torch is loaded."""
    policy, spins = os.environ.get("OMP_WAIT_POLICY"), os.environ.get("GOMP_SPINCOUNT")
    if policy == "PASSIVE" and os.environ.get("TINYELECTRA_SET_OMP_WAIT_POLICY") == "1":
        set_by, how = "tinyelectra", ("OMP_WAIT_POLICY=PASSIVE, tinyelectra's default (sleep, do not spin; "
                                      "set OMP_WAIT_POLICY to choose)")
    elif policy is not None or spins is not None:
        set_by = "environment"
        how = ", ".join(f"{k}={v}" for k, v in (("OMP_WAIT_POLICY", policy), ("GOMP_SPINCOUNT", spins))
                        if v is not None)
        how += " from the environment"
    else:
        set_by, how = None, ("OpenMP's default (libgomp: spin, then sleep; OMP_WAIT_POLICY=PASSIVE is faster beside "
                             "busy programs)")
    threads = torch.get_num_threads()
    record = {"threads": threads, "omp_wait_policy": policy, "gomp_spincount": spins, "set_by": set_by}
    return f"CPU threads: {threads}; OpenMP waits: {how}", record


_CPU_FAST_PATHS = [True]


def cpu_fast_path(t: torch.Tensor) -> bool:
    """Whether `t` takes the CPU-only fast paths (oneDNN linear, NumPy-drawn dropout masks, the baddbmm attention,
    inverse-CDF sampling): CPU tensors outside torch.compile, unless `plain_cpu_paths` turned them off."""
    return t.device.type == "cpu" and _CPU_FAST_PATHS[0] and not torch.compiler.is_compiling()


@contextlib.contextmanager
def plain_cpu_paths():
    """Within: the CPU runs the plain torch operators that compiled code runs (F.linear, F.dropout from torch's
    generator, SDPA, Gumbel-max sampling), so an eager and a compiled step draw the same random numbers on the CPU
    too (benchmarks/loss_check.py); the same mathematics, slower."""
    _CPU_FAST_PATHS[0] = False
    try:
        yield
    finally:
        _CPU_FAST_PATHS[0] = True


def _onednn_mm(a: torch.Tensor, b_t: torch.Tensor) -> torch.Tensor:
    """a (M, K) @ b_t (N, K)^T -> (M, N) in fp32 through oneDNN (strided inputs accepted, no copies)."""
    return torch.ops.mkldnn._linear_pointwise(a, b_t, None, "none", [], "")


class _OneDNNLinear(torch.autograd.Function):
    """y = x W^T + b with forward and both backward products on oneDNN's fp32 matmul.

    Why: torch routes fp32 CPU matmuls to MKL, which on AMD CPUs runs well below oneDNN (1.7-2x slower on the
    AMD EPYC of benchmarks/NOTES.md); oneDNN picks its kernels by CPU feature, not vendor. Same fp32 arithmetic,
    different summation order (results equal up to float rounding)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])  # (M, K)
        y = torch.ops.mkldnn._linear_pointwise(x2, weight, bias, "none", [], "")  # (M, N)
        ctx.save_for_backward(x2, weight)
        ctx.x_shape, ctx.has_bias = x.shape, bias is not None
        return y.view(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x2, weight = ctx.saved_tensors
        g2 = grad.reshape(-1, grad.shape[-1])  # (M, N)
        gx = gw = gb = None
        if ctx.needs_input_grad[0]:
            gx = _onednn_mm(g2, weight.t()).view(ctx.x_shape)  # (M, N) @ (N, K)
        if ctx.needs_input_grad[1]:
            gw = _weight_grad(g2, x2)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            gb = g2.sum(0)
        return gx, gw, gb


def _weight_grad(g2: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
    """g2 (M, N)^T @ x2 (M, K) -> (N, K). oneDNN copies its first operand into a contiguous block when it is a
    transposed view, so the product is oriented to copy the narrower of the two (measured: up to 1.4x on the MLM
    head's (304, 128) x (304, 30522) and the FFN's 256 -> 1024 layer)."""
    if x2.shape[1] > g2.shape[1]:
        return _onednn_mm(g2.t(), x2.t())  # copies g2^T (N, M)
    return _onednn_mm(x2.t(), g2.t()).t()  # copies x2^T (K, M); (K, N) -> transposed view (N, K)


def _onednn_linear_works() -> bool:
    """The private op exists in this build and agrees with F.linear (checked once, on tiny tensors)."""
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")):
        return False
    try:
        g = torch.Generator().manual_seed(0)
        x, w, b = (torch.randn(s, generator=g) for s in ((5, 7), (3, 7), (3,)))
        return bool(torch.allclose(_OneDNNLinear.apply(x, w, b), F.linear(x, w, b), atol=1e-5))
    except (RuntimeError, AttributeError, NotImplementedError):
        return False


_ONEDNN_LINEAR: bool | None = None


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear, except fp32 on the CPU outside autocast and torch.compile, where oneDNN does the matmuls."""
    global _ONEDNN_LINEAR
    if (not cpu_fast_path(x) or x.dtype != torch.float32 or weight.dtype != torch.float32
            or torch.is_autocast_enabled("cpu")):
        return F.linear(x, weight, bias)
    if _ONEDNN_LINEAR is None:
        _ONEDNN_LINEAR = _onednn_linear_works()
    return _OneDNNLinear.apply(x, weight, bias) if _ONEDNN_LINEAR else F.linear(x, weight, bias)


class Linear(nn.Linear):
    """nn.Linear (same parameters, same state dict) whose forward is `linear`: the model's layers are built from it,
    so model.py reads `self.qkv(x)` while fp32 on the CPU takes oneDNN and everything else F.linear. Under autocast
    it reads the low-precision copies of its weight and bias where `WeightCopies` gave it some."""

    weight_copy: torch.Tensor | None = None
    bias_copy: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, read_weight(self.weight, self.weight_copy), read_weight(self.bias, self.bias_copy))


# ----------------------------------------------------------------------------------------------------------
# train.weight_copy: the low-precision weights a mixed-precision forward reads, kept instead of cast at every use.
# ----------------------------------------------------------------------------------------------------------

class _ReadCopy(torch.autograd.Function):
    """`copy` as the value of `master` in the forward, with the gradient autocast's cast would give `master`: this
    use's low-precision gradient cast to fp32."""

    @staticmethod
    def forward(ctx, master: torch.Tensor, copy: torch.Tensor) -> torch.Tensor:
        return copy.view_as(copy)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad.float(), None


def read_weight(master: torch.Tensor | None, copy: torch.Tensor | None) -> torch.Tensor | None:
    """What a matmul reads of the fp32 weight `master`: under autocast its copy when it has one (`WeightCopies`),
    else `master` itself (which autocast then casts at this use)."""
    if copy is None or not torch.is_autocast_enabled(master.device.type):
        return master
    return _ReadCopy.apply(master, copy)


class WeightCopies:
    """train.weight_copy=copy under bf16/fp16 autocast: a low-precision copy of every weight a matmul reads, kept beside
    its fp32 master and refreshed once per optimizer step, after the update (one multi-tensor copy), so the forward
    reads it instead of casting the master at every use (autocast: 204 casts a forward for electra-small).

    `reads`: (module, attribute, master): the copy becomes `module.<attribute>`, a plain attribute (not a parameter
    or buffer: never in a state_dict, checkpoint, resume state or export), static for CUDA graphs. The same
    arithmetic: the copy holds what autocast's cast would compute (round to nearest), and its gradient reaches the
    master as autocast's does, cast to fp32 per use (`_ReadCopy`). Whoever changes the masters outside the update
    (a load, a restore) calls `refresh`."""

    def __init__(self, reads: list[tuple[nn.Module, str, torch.Tensor]], dtype: torch.dtype) -> None:
        self.masters = [master for _, _, master in reads]
        self.copies = [master.detach().to(dtype) for master in self.masters]
        for (module, attribute, _), copy in zip(reads, self.copies):
            torch._dynamo.mark_static_address(copy)  # inductor's CUDA graphs read it in place (no address guard)
            setattr(module, attribute, copy)

    @torch.no_grad()
    def refresh(self) -> None:
        torch._foreach_copy_(self.copies, self.masters)


# ----------------------------------------------------------------------------------------------------------
# CPU fast path: random numbers and dropout.
# ----------------------------------------------------------------------------------------------------------


def cpu_rand(shape: tuple[int, ...] | torch.Size, generator: torch.Generator | None = None) -> torch.Tensor:
    """Uniform [0, 1) float32 numbers on the CPU, like torch.rand, drawn by NumPy's PCG64 seeded from one draw of
    torch's generator (so torch.manual_seed still fixes them).

    Why: torch's CPU generator (mt19937, one thread) costs ~4 ns per float here; PCG64 about a third of that, and
    dropout draws ~32M numbers per ELECTRA-Small step (benchmarks/NOTES.md)."""
    seed = int(torch.randint(0, 2**62, (1,), generator=generator))
    out = np.random.Generator(np.random.PCG64(seed)).random(int(np.prod(shape, dtype=np.int64)), dtype=np.float32)
    return torch.from_numpy(out).view(shape)


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """F.dropout(x, p, training), with the CPU's keep mask drawn by `cpu_rand` (fp32/bf16 CPU tensors, eager)."""
    if not training or p == 0.0:
        return x
    if not cpu_fast_path(x):
        return F.dropout(x, p, True)
    keep_scaled = (cpu_rand(x.shape) >= p).to(x.dtype).mul_(1.0 / (1.0 - p))  # 0 or 1/(1-p), no gradient
    return x * keep_scaled
