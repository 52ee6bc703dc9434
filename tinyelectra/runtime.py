"""Where and how a run executes: device, precision (with the reason for the choice), autocast, torch.compile with a
fallback, CPU allocator tuning, TF32, seeding. Every fast path lives here, returns one note string saying what was
chosen, and falls back to the plain path when it cannot be used.

Nothing here knows about ELECTRA; the trainer, GLUE fine-tuning and the benchmarks all call these.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import random
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from tinyelectra.errors import UserError


def device_name(device: torch.device) -> str:
    """The GPU's name, or the CPU model and core count, for logs, plans and checkpoint metadata."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    import platform

    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.exists() else []
    model = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), platform.processor())
    return f"CPU ({model}, {os.cpu_count()} cores)"


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
            return pick_device(gpu=dev.index or 0)
        if dev.type != "cpu":
            raise UserError(f"--device {device!r}: only cpu and cuda are supported")
        return dev
    if gpu is not None:
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if gpu < 0 or gpu >= count:
            have = f"this machine has {count} CUDA GPU(s)" if count else "no CUDA GPU is available"
            raise UserError(f"--gpu {gpu}: {have}; use --device cpu to run on the CPU")
        return torch.device("cuda", gpu)
    return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")


def pick_precision(requested: str, device: torch.device) -> tuple[str, str]:
    """("bf16" | "fp16" | "fp32", one-line reason). `requested` is auto | bf16 | fp16 | fp32."""
    if requested not in ("auto", "bf16", "fp16", "fp32"):
        raise UserError(f"precision {requested!r}: use auto, bf16, fp16 or fp32")
    if device.type != "cuda":
        if requested == "fp16":
            raise UserError("precision fp16 is for CUDA GPUs; on the CPU use fp32 (auto) or bf16")
        if requested == "bf16":
            return "bf16", "bf16 autocast on the CPU, as requested (fast only on CPUs with bf16 units)"
        return "fp32", "CPU: fp32, the paper's precision (matmuls through oneDNN where available)"
    name = torch.cuda.get_device_name(device)
    bf16_ok = torch.cuda.is_bf16_supported(including_emulation=False)
    if requested == "auto":
        if bf16_ok:
            return "bf16", f"{name} supports bf16: bf16 autocast (same range as fp32, no loss scaling); sampling and losses stay fp32"
        return "fp16", f"{name} has no bf16: fp16 autocast with dynamic loss scaling; sampling and losses stay fp32"
    if requested == "bf16" and not bf16_ok:
        raise UserError(f"precision bf16: {name} does not support bf16 (Volta/Turing); use fp16 or auto")
    reason = {"bf16": "bf16 autocast, as requested", "fp16": "fp16 autocast with dynamic loss scaling, as requested",
              "fp32": "fp32 as requested (TF32 matmuls off: the paper's arithmetic)"}[requested]
    return requested, reason


def autocast_context(precision: str, device: torch.device):
    """The autocast region for a forward pass (a no-op for fp32)."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16 if precision == "bf16" else torch.float16)


def configure_matmul(precision: str, device: torch.device) -> str:
    """TF32 for the fp32 matmuls that remain under mixed precision (Ampere+); off for an fp32 run, whose numbers
    must be the paper's fp32 arithmetic. Returns a note."""
    if device.type != "cuda":
        return "CPU: fp32 matmuls"
    tf32 = precision != "fp32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    return "TF32 on for fp32 leftovers under autocast" if tf32 else "TF32 off (true fp32)"


def maybe_compile(fn_or_module, mode_setting: str, device: torch.device):
    """torch.compile `fn_or_module` when `mode_setting` asks for it ("on", or "auto" on CUDA); returns (obj, note).

    Compilation is lazy (it happens on the first call), so the returned object falls back to the eager one if that
    first call fails to compile, and the note is updated then (`obj.note`)."""
    if mode_setting not in ("auto", "on", "off"):
        raise UserError(f"compile {mode_setting!r}: use auto, on or off")
    if mode_setting == "off" or (mode_setting == "auto" and device.type != "cuda"):
        why = "off as requested" if mode_setting == "off" else "auto: off on the CPU (compile time outweighs the gain for short runs)"
        return fn_or_module, f"compile: {why}"
    if sys.platform == "win32" or not hasattr(torch, "compile"):
        return fn_or_module, "compile: not available on this platform; running eager"
    try:
        compiled = torch.compile(fn_or_module)
    except Exception as e:  # noqa: BLE001 - any failure means: run eager
        return fn_or_module, f"compile: failed ({type(e).__name__}: {e}); running eager"
    return _CompiledWithFallback(compiled, fn_or_module), "compile: torch.compile (inductor)"


class _CompiledWithFallback:
    """Calls the compiled function or module; if its first call raises (missing compiler, unsupported op), runs
    eager from then on and says so in `note`. Other attributes are the eager object's."""

    def __init__(self, compiled, eager) -> None:
        self.compiled, self.eager = compiled, eager
        self.note = "compile: torch.compile (inductor)"
        self._checked = False

    def __call__(self, *args, **kwargs):
        if self._checked:
            return self.compiled(*args, **kwargs)
        try:
            out = self.compiled(*args, **kwargs)
        except Exception as e:  # noqa: BLE001
            self.compiled = self.eager
            self.note = f"compile: failed on first call ({type(e).__name__}); running eager"
            out = self.eager(*args, **kwargs)
        self._checked = True
        return out

    def __getattr__(self, name: str):
        return getattr(self.eager, name)


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
    return "CPU allocator: glibc mmap threshold 1 GiB, no trimming" if ok else "CPU allocator: mallopt refused; unchanged"


def set_seed(seed: int) -> torch.Generator:
    """Seed Python, NumPy and torch (all devices); returns a CPU torch.Generator seeded the same, for data order."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    os.environ.setdefault("PYTHONHASHSEED", str(seed))  # only affects child processes (e.g. data workers)
    return torch.Generator().manual_seed(seed)


# ----------------------------------------------------------------------------------------------------------
# CPU fast path: fp32 linear layers through oneDNN.
# ----------------------------------------------------------------------------------------------------------


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
    if (x.device.type != "cpu" or x.dtype != torch.float32 or weight.dtype != torch.float32
            or torch.is_autocast_enabled("cpu") or torch.compiler.is_compiling()):
        return F.linear(x, weight, bias)
    if _ONEDNN_LINEAR is None:
        _ONEDNN_LINEAR = _onednn_linear_works()
    return _OneDNNLinear.apply(x, weight, bias) if _ONEDNN_LINEAR else F.linear(x, weight, bias)


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
    if x.device.type != "cpu" or torch.compiler.is_compiling():
        return F.dropout(x, p, True)
    keep_scaled = (cpu_rand(x.shape) >= p).to(x.dtype).mul_(1.0 / (1.0 - p))  # 0 or 1/(1-p), no gradient
    return x * keep_scaled
