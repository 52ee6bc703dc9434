"""Shared benchmark plumbing: machine description, git commit, atomic JSON results, alternating A/B timing, peak
memory, and the two pre-training steps every speed benchmark compares.

- `machine()`, `git_commit()`, `write_result(name, payload)`: every result file names the device, torch version,
  commit and exact command.
- `alternate(steps, ...)`: runs the candidates in turn (A B, then B A, ...) in one process after warm-up, so that a
  noisy neighbour slows both equally; `summarize` gives medians and quartiles.
- `PeakMemory`: CUDA `max_memory_allocated`, or on CPU the process's peak RSS (VmHWM, reset through
  /proc/self/clear_refs); `HeldMemory`: what a CUDA run holds from its construction on, the CUDA-graph pools counted.
- `TinyElectraStep` / `HFStep`: one full pre-training step (masking, generator, Gumbel sampling, discriminator,
  backward, clip 1.0, optimizer) of tinyelectra, and of transformers' `ElectraForMaskedLM` +
  `ElectraForPreTraining` wired the common way (shared embeddings, full-vocabulary generator logits at every
  position with labels = -100 outside the masked ones, Gumbel-max at the masked positions, torch AdamW).
  Both take the same (B, T) batches and the same masking (tinyelectra's `mask_batch`, timed on both sides).
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from benchmarks import ROOT
from tinyelectra.runtime import synchronize  # noqa: F401  (the benchmarks wait for the device as the trainer does)

RESULTS = ROOT / "benchmarks" / "results"


# ----------------------------------------------------------------------------------------------------------
# Where and what ran.
# ----------------------------------------------------------------------------------------------------------


def machine(device: torch.device | None = None) -> dict:
    """CPU model and core count from /proc/cpuinfo, platform, Python and torch versions, and the GPU if used."""
    cpu, cores = platform.processor() or "unknown", os.cpu_count()
    try:
        info = Path("/proc/cpuinfo").read_text().splitlines()
        cpu = next(line.split(":", 1)[1].strip() for line in info if line.startswith("model name"))
        cores = sum(1 for line in info if line.startswith("processor"))
    except (OSError, StopIteration):
        pass
    out = {
        "cpu": cpu,
        "cores": cores,
        "torch_threads": torch.get_num_threads(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "unset"),
        "load_average_1min_at_write": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
    }
    try:
        import transformers  # noqa: PLC0415

        out["transformers"] = transformers.__version__
    except ImportError:
        pass
    if device is not None and device.type == "cuda":
        out["gpu"] = torch.cuda.get_device_name(device)
        out["cuda"] = torch.version.cuda
    return out


def git_commit() -> str:
    """HEAD, with "+dirty" when tracked files under tinyelectra/ or benchmarks/ differ from it."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "tinyelectra", "benchmarks"],
                               cwd=ROOT).returncode != 0
        return head + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def command_line(module: str | None = None, argv: list[str] | None = None) -> str:
    """The command that ran: `python -m MODULE ARGV...` when given, else this process's own command line."""
    if module is None or argv is None:
        return " ".join(shlex.quote(a) for a in [Path(sys.executable).name, *sys.argv])
    parts = ["python", "-m", module, *argv]
    return " ".join(shlex.quote(a) for a in parts)


def write_result(name: str, payload: dict, device: torch.device | None = None, out_dir: Path | None = None,
                 command: str | None = None) -> Path:
    """Write benchmarks/results/NAME.json atomically (temp name, then os.replace) with machine, commit, command."""
    out_dir = RESULTS if out_dir is None else Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    doc = {"benchmark": name, "machine": machine(device), "git_commit": git_commit(), "command": command
           or command_line(),
           "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **payload}
    path = out_dir / f"{name}.json"
    tmp = path.with_suffix(f".json.tmp-{os.getpid()}")  # several processes may write one result
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    os.replace(tmp, path)
    return path


# ----------------------------------------------------------------------------------------------------------
# Timing and memory.
# ----------------------------------------------------------------------------------------------------------


def alternate(steps: dict[str, Callable[[], None]], warmup: int, repeats: int, device: torch.device,
              on_round: Callable[[int, dict[str, float]], None] | None = None,
              calls_per_round: int = 1) -> dict[str, list[float]]:
    """Seconds per call of each candidate, run in turn in one process. The order flips every round (A B, B A, ...)
    so that neither side always runs right after the other; `warmup` rounds are run first and discarded.

    Each round runs a candidate `calls_per_round` times back to back and synchronises the device once, at the end:
    on a GPU the host queues the next step while the device runs this one, as in training, so a synchronisation
    after every step would understate the throughput. The time of a round divided by its calls is recorded."""
    names = list(steps)
    for _ in range(warmup):
        for n in names:
            steps[n]()
    synchronize(device)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(repeats):
        this_round: dict[str, float] = {}
        for n in names if r % 2 == 0 else names[::-1]:
            synchronize(device)  # the previous candidate's work is not counted here
            t0 = time.perf_counter()
            for _ in range(calls_per_round):
                steps[n]()
            synchronize(device)  # one synchronisation per round
            this_round[n] = (time.perf_counter() - t0) / calls_per_round
            times[n].append(this_round[n])
        if on_round is not None:
            on_round(r, this_round)
    return times


def summarize(seconds: list[float]) -> dict:
    q = statistics.quantiles(seconds, n=4) if len(seconds) >= 2 else [seconds[0]] * 3
    return {"median_s": statistics.median(seconds), "q1_s": q[0], "q3_s": q[2], "min_s": min(seconds),
            "n": len(seconds)}


def paired_ratio(slow: list[float], fast: list[float]) -> dict:
    """Median of the per-round ratios slow/fast (robust to load that changes between rounds) and the ratio of
    medians."""
    per_round = [s / f for s, f in zip(slow, fast)]
    return {"median_of_round_ratios": statistics.median(per_round),
            "ratio_of_medians": statistics.median(slow) / statistics.median(fast)}


def _rss_peak_bytes() -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _rss_now_bytes() -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


class PeakMemory:
    """Peak memory of what runs inside `with PeakMemory(device) as pm:`, in bytes (`pm.peak_bytes`).

    CUDA: torch.cuda.max_memory_allocated (tensors only, what a card must hold besides the CUDA context).
    CPU: the process's peak resident set (VmHWM) after resetting it; it includes the Python interpreter, torch's
    libraries and everything else alive, so compare CPU numbers only with each other. `baseline_bytes` is the
    RSS (or allocated CUDA memory) when the block started."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.peak_bytes: int | None = None
        self.baseline_bytes: int | None = None

    def __enter__(self) -> "PeakMemory":
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.baseline_bytes = torch.cuda.memory_allocated(self.device)
        else:
            with contextlib.suppress(OSError):
                Path("/proc/self/clear_refs").write_text("5")  # 5 = reset the peak RSS (Linux >= 4.0)
            self.baseline_bytes = _rss_now_bytes()
        return self

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak_bytes = torch.cuda.max_memory_allocated(self.device)
        else:
            self.peak_bytes = _rss_peak_bytes()


class HeldMemory:
    """What a CUDA run holds, from before it was built to the end of the block (`with HeldMemory(device) as held:`),
    in bytes (`held.figures`), as deltas over the block's start so that what other code holds is not counted:

    - `peak_reserved_bytes`: torch.cuda.max_memory_reserved - memory_reserved at the start: the most the caching
      allocator held for it: tensors, cached free blocks, and the private memory pools CUDA graphs are recorded into
      (replaying a graph allocates nothing, so max_memory_allocated over replayed steps sees almost none of it);
    - `peak_allocated_bytes`: torch.cuda.max_memory_allocated - memory_allocated at the start: the tensors alone;
    - `device_used_bytes_at_end`: the device's used memory (torch.cuda.mem_get_info) at the end minus at the start:
      everything the process added, the libraries' workspaces included, as it stands at the end (not a peak).
    Call torch.cuda.empty_cache() before the block for the reserved figure to start from what is live. On the CPU
    the figures are None (the CPU path measures a fresh process's peak RSS instead)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.figures: dict[str, int | None] = {"peak_reserved_bytes": None, "peak_allocated_bytes": None,
                                               "device_used_bytes_at_end": None}

    def __enter__(self) -> "HeldMemory":
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)
            self._start = (torch.cuda.memory_reserved(self.device), torch.cuda.memory_allocated(self.device),
                           _device_used(self.device))
        return self

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.figures = held_figures(self._start, (torch.cuda.max_memory_reserved(self.device),
                                                      torch.cuda.max_memory_allocated(self.device),
                                                      _device_used(self.device)))


def _device_used(device: torch.device) -> int:
    free, total = torch.cuda.mem_get_info(device)
    return total - free


def held_figures(start: tuple[int, int, int], end: tuple[int, int, int]) -> dict[str, int]:
    """HeldMemory's figures from (reserved, allocated, device used) at the start and (peak reserved, peak allocated,
    device used) at the end."""
    return {"peak_reserved_bytes": end[0] - start[0], "peak_allocated_bytes": end[1] - start[1],
            "device_used_bytes_at_end": end[2] - start[2]}


# ----------------------------------------------------------------------------------------------------------
# The two pre-training steps.
# ----------------------------------------------------------------------------------------------------------


def synthetic_batches(vocab_size: int, batch_size: int, seq_len: int, count: int, seed: int = 0,
                      device: torch.device | str = "cpu",
                      padding: str = "builder") -> list[tuple[Tensor, Tensor, Tensor]]:
    """`count` batches shaped like the official builder's: [CLS] A [SEP] B [SEP], some rows padded.
    Ids: [PAD]=0, [CLS]=101, [SEP]=102, [MASK]=103 (BERT's); words drawn from 1000..V-1.
    `padding`: "builder" (each row short with probability 0.05, as the builder's random-length rows), "none" (every
    row full: no batch needs an attention mask), "alternate" (odd batches as "none", even ones with a short row)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(count):
        ids = torch.randint(1000, vocab_size, (batch_size, seq_len), generator=g)
        types = torch.zeros_like(ids)
        lengths = torch.full((batch_size,), seq_len)
        short = torch.rand(batch_size, generator=g) < 0.05  # 5% random-length rows, as the official builder
        if padding == "none" or (padding == "alternate" and i % 2):
            short[:] = False
        elif padding == "alternate":
            short[0] = True
        lengths[short] = torch.randint(5, seq_len + 1, (int(short.sum()),), generator=g)
        if padding == "alternate" and i % 2 == 0:
            lengths[0] = min(int(lengths[0]), seq_len - 1)  # at least one padding token
        for r in range(batch_size):
            n = int(lengths[r])
            cut = int(torch.randint(2, max(3, n - 1), (1,), generator=g))
            ids[r, 0], ids[r, cut], ids[r, n - 1] = 101, 102, 102
            types[r, cut + 1 : n] = 1
            ids[r, n:] = 0
            types[r, n:] = 0
        mask = ids != 0
        out.append((ids.to(device), types.to(device), mask.to(device)))
    return out


@dataclass
class StepSetup:
    """What both steps are built from."""

    model_cfg: object  # tinyelectra.config.ModelConfig
    objective: object  # tinyelectra.config.ObjectiveConfig
    optim: object  # tinyelectra.config.OptimConfig
    device: torch.device
    precision: str = "fp32"  # fp32 | bf16 | fp16 (autocast on both sides)
    special: object = None  # tinyelectra.electra.SpecialIds; None = BERT's ids (SPECIAL_IDS)

    def special_ids(self):
        from tinyelectra.electra import SpecialIds  # noqa: PLC0415

        return self.special if self.special is not None else SpecialIds(**SPECIAL_IDS)


def _autocast(precision: str, device: torch.device):
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device.type, dtype=dtype)


SPECIAL_IDS = dict(pad=0, cls=101, sep=102, mask=103)


class _TimedStep:
    """What both timed steps share: `_loss` compiled or not, then backward, clip, optimizer step (fp16: scaled)."""

    def _compile(self, compile_mode: str, device: torch.device) -> None:
        self._compile_note = "off"
        self.loss_fn = self._loss
        if compile_mode != "off":
            from tinyelectra.runtime import maybe_compile  # noqa: PLC0415

            self.loss_fn, self._compile_note = maybe_compile(self._loss, compile_mode, device)

    @property
    def compile_note(self) -> str:
        """What runs now (a compilation that failed in the first step's forward or backward says so)."""
        from tinyelectra.runtime import compile_note  # noqa: PLC0415

        return compile_note(self.loss_fn, self._compile_note)

    def first_call(self, *batch) -> None:
        """The untimed first step: compiles when asked, and falls back to eager when the compiled forward or backward
        fails (the gradients a failed backward left are discarded)."""
        if hasattr(self.loss_fn, "verify"):  # compiled (runtime.maybe_compile's wrapper)
            self.loss_fn.verify(lambda: self(*batch), reset=lambda: self.opt.zero_grad(set_to_none=True))
        else:
            self(*batch)

    def _update(self, loss: Tensor, params: list, clip_norm: float, **clip_options) -> None:
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            self.scaler.unscale_(self.opt)
            torch.nn.utils.clip_grad_norm_(params, clip_norm, **clip_options)
            self.scaler.step(self.opt)
            self.scaler.update()
        else:
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, clip_norm, **clip_options)
            self.opt.step()
        self.opt.zero_grad(set_to_none=True)


class TinyElectraStep(_TimedStep):
    """tinyelectra's pre-training step built from the library's parts (model, objective, paper Adam, clip)."""

    name = "tinyelectra"

    def __init__(self, setup: StepSetup, compile_mode: str = "off", seed: int = 0) -> None:
        from tinyelectra.model import Electra  # noqa: PLC0415
        from tinyelectra.optim import build_optimizer  # noqa: PLC0415

        torch.manual_seed(seed)
        self.setup = setup
        self.special = setup.special_ids()
        self.model = Electra(setup.model_cfg, setup.objective.kind).to(setup.device).train()
        self.opt = build_optimizer(self.model, setup.optim, setup.device.type)
        self.opt.set_lr(setup.optim.lr)
        self.scaler = torch.amp.GradScaler(setup.device.type) if setup.precision == "fp16" else None
        self._compile(compile_mode, setup.device)

    def _loss(self, ids: Tensor, types: Tensor, mask: Tensor) -> Tensor:
        from tinyelectra.electra import combine, loss_terms, mask_batch  # noqa: PLC0415

        s = self.setup
        m = mask_batch(ids, types, mask, s.objective, self.special, s.model_cfg.vocab_size)
        with _autocast(s.precision, s.device):
            terms = loss_terms(self.model, m, s.objective)
        return combine(terms, s.objective, m.mlm_count, m.token_count)

    def __call__(self, ids: Tensor, types: Tensor, mask: Tensor) -> None:
        params = [p for g in self.opt.param_groups for p in g["params"]]
        self._update(self.loss_fn(ids, types, mask), params, self.setup.optim.clip_norm, foreach=True)


def hf_configs(model_cfg) -> tuple:
    """transformers ElectraConfig for the discriminator and the generator of `model_cfg` (a ModelConfig)."""
    from transformers import ElectraConfig  # noqa: PLC0415

    def conf(c):
        return ElectraConfig(
            vocab_size=c.vocab_size, embedding_size=c.embedding_size, hidden_size=c.hidden_size,
            num_hidden_layers=c.num_layers, num_attention_heads=c.num_heads, intermediate_size=c.ffn_size,
            max_position_embeddings=c.max_positions, type_vocab_size=c.type_vocab_size, hidden_act="gelu",
            hidden_dropout_prob=c.dropout, attention_probs_dropout_prob=c.attention_dropout,
            layer_norm_eps=c.layer_norm_eps, pad_token_id=SPECIAL_IDS["pad"],
        )

    return conf(model_cfg), conf(model_cfg.generator())


class HFStep(_TimedStep):
    """The common transformers wiring: ElectraForMaskedLM (generator) + ElectraForPreTraining (discriminator)
    sharing one ElectraEmbeddings module, the generator's output layer tied to the word embeddings; the generator
    computes full-vocabulary logits at all T positions (loss with labels = -100 elsewhere); Gumbel-max sampling
    at the masked positions (boolean indexing); disc loss through `labels=`; torch AdamW (its default
    implementation for the device) with the usual no-decay groups; loss = gen + 50 * disc."""

    name = "transformers"

    def __init__(self, setup: StepSetup, compile_mode: str = "off", seed: int = 0) -> None:
        from transformers import ElectraForMaskedLM, ElectraForPreTraining  # noqa: PLC0415

        torch.manual_seed(seed)
        self.setup = setup
        disc_cfg, gen_cfg = hf_configs(setup.model_cfg)
        self.disc = ElectraForPreTraining(disc_cfg)
        self.gen = ElectraForMaskedLM(gen_cfg)
        self.gen.electra.embeddings = self.disc.electra.embeddings  # share token/position/type embeddings + LN
        self.gen.generator_lm_head.weight = self.disc.electra.embeddings.word_embeddings.weight  # tie the output
        self.gen.to(setup.device).train()
        self.disc.to(setup.device).train()
        params = {id(p): (n, p) for mod in (self.gen, self.disc) for n, p in mod.named_parameters()}.values()
        no_decay = ("bias", "LayerNorm.weight")
        groups = [
            {"params": [p for n, p in params if not any(k in n for k in no_decay)],
             "weight_decay": setup.optim.weight_decay},
            {"params": [p for n, p in params if any(k in n for k in no_decay)], "weight_decay": 0.0},
        ]
        self.params = [p for g in groups for p in g["params"]]
        self.opt = torch.optim.AdamW(groups, lr=setup.optim.lr, betas=(setup.optim.beta1, setup.optim.beta2),
                                     eps=setup.optim.eps)
        self.scaler = torch.amp.GradScaler(setup.device.type) if setup.precision == "fp16" else None
        zero, one = torch.zeros((), device=setup.device), torch.ones((), device=setup.device)
        self.gumbel = torch.distributions.Gumbel(zero, one)
        self._compile(compile_mode, setup.device)

    def _loss(self, ids: Tensor, types: Tensor, mask: Tensor) -> Tensor:
        from tinyelectra.electra import mask_batch  # noqa: PLC0415

        s = self.setup
        m = mask_batch(ids, types, mask, s.objective, s.special_ids(), s.model_cfg.vocab_size)
        is_masked = torch.zeros_like(mask).scatter(1, m.positions, m.weights > 0)  # (B, T) bool
        labels = torch.where(is_masked, ids, torch.full_like(ids, -100))
        with _autocast(s.precision, s.device):
            gen_out = self.gen(input_ids=m.masked_ids, attention_mask=mask, token_type_ids=types, labels=labels)
            with torch.no_grad():
                logits = gen_out.logits[is_masked].float()  # (M, V)
                gumbel = self.gumbel.sample(logits.shape)  # (M, V), drawn on the device
                sampled = (logits + gumbel).argmax(-1)
                generated = m.masked_ids.clone()
                generated[is_masked] = sampled
                is_replaced = is_masked.clone()
                is_replaced[is_masked] = sampled != ids[is_masked]
            disc_out = self.disc(input_ids=generated, attention_mask=mask, token_type_ids=types,
                                 labels=is_replaced.long())
        return gen_out.loss + s.objective.disc_weight * disc_out.loss

    def __call__(self, ids: Tensor, types: Tensor, mask: Tensor) -> None:
        self._update(self.loss_fn(ids, types, mask), self.params, self.setup.optim.clip_norm)  # torch's default clip


def compare_steps(setup: StepSetup, batches: list[tuple[Tensor, Tensor, Tensor]], rounds: int, warmup: int,
                  compile_mode: str = "off", next_batch: Callable[[], tuple[Tensor, Tensor, Tensor]] | None = None,
                  measure_memory: bool = True, verbose: bool = True) -> dict:
    """Time tinyelectra's step against the transformers wiring, alternating in this process; then (optionally)
    the peak memory of one more step of each. Returns medians, tokens/s, the paired speed-up and memory.

    `next_batch`, when given, is called inside each timed step (data loading counted); otherwise the steps cycle
    through the pre-built `batches` (the same batch sequence for both sides)."""
    ours, theirs = TinyElectraStep(setup, compile_mode), HFStep(setup, compile_mode)
    B, T = batches[0][0].shape
    cursor = {"ours": 0, "theirs": 0}

    def runner(step, key):
        def run() -> None:
            if next_batch is not None:
                step(*next_batch())
            else:
                step(*batches[cursor[key] % len(batches)])
                cursor[key] += 1
        return run

    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    t_compile = {}
    for key, step in (("ours", ours), ("theirs", theirs)):  # first call separately: compile time, if any
        t0 = time.perf_counter()
        step.first_call(*(next_batch() if next_batch is not None else batches[0]))
        synchronize(setup.device)
        t_compile[key] = time.perf_counter() - t0

    def show(r: int, d: dict[str, float]) -> None:
        if verbose:
            print(f"round {r:3d}  " + "  ".join(f"{k} {v * 1000:8.1f} ms" for k, v in d.items()), flush=True)

    times = alternate({"tinyelectra": runner(ours, "ours"), "transformers": runner(theirs, "theirs")},
                      warmup=warmup, repeats=rounds, device=setup.device, on_round=show)
    out: dict = {"batch_size": B, "seq_len": T, "tokens_per_step": B * T, "rounds": rounds, "warmup_rounds": warmup,
                 "load_average_1min_before_after": [load_before,
                                                    os.getloadavg()[0] if load_before is not None else None],
                 "first_call_s": {"tinyelectra": t_compile["ours"], "transformers": t_compile["theirs"]},
                 "compile_note": {"tinyelectra": ours.compile_note, "transformers": theirs.compile_note}}
    for name, ts in times.items():
        s = summarize(ts)
        out[name] = {**s, "tokens_per_s": B * T / s["median_s"], "step_seconds": [round(x, 5) for x in ts]}
    out["speedup"] = paired_ratio(times["transformers"], times["tinyelectra"])
    if measure_memory:
        for name, step, key in (("tinyelectra", ours, "ours"), ("transformers", theirs, "theirs")):
            with PeakMemory(setup.device) as pm:
                runner(step, key)()
            out[name]["peak_memory_bytes"] = pm.peak_bytes
            out[name]["memory_baseline_bytes"] = pm.baseline_bytes
        out["peak_memory_kind"] = ("torch.cuda.max_memory_allocated during one step" if setup.device.type == "cuda"
                                   else "process peak RSS (VmHWM) during one step, both models alive in the process")
    return out


def add_step_arguments(ap, recipe: str = "electra-small") -> None:
    """The options every step benchmark shares: what to build, where, in which precision, and where to write."""
    ap.add_argument("--recipe", default=recipe)
    ap.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: a GPU if there is one)")
    ap.add_argument("--precision", default="auto", choices=("auto", "fp32", "bf16", "fp16"))
    ap.add_argument("--batch", type=int, default=None, help="sequences per step (default: 16 on CPU, 128 on GPU)")
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--threads", type=int, default=os.cpu_count(),
                    help="torch CPU threads, set and recorded (default: one per core)")
    ap.add_argument("--name", default=None, help="result file name (default: from the configuration)")
    ap.add_argument("--out-dir", default=None)


def step_setup(args) -> tuple[torch.device, str, str, int]:
    """From `add_step_arguments`' options: threads set, (device, precision, its reason, batch); `args.batch` filled."""
    from tinyelectra import runtime  # noqa: PLC0415

    torch.set_num_threads(args.threads)  # pinned, and recorded by machine() in every result
    device = runtime.pick_device(None, args.device)
    precision, reason = runtime.pick_precision(args.precision, device)
    args.batch = args.batch or (128 if device.type == "cuda" else 16)
    return device, precision, reason, args.batch


def run_main(main: Callable[[], object]) -> None:
    """Run a benchmark's main(): bad input (UserError) is one line on stderr and its exit code, as in the CLI; an
    interrupted training run (tinyelectra.errors.Interrupted: it has said what it saved) exits 130 or 143."""
    from tinyelectra.errors import Interrupted, UserError  # noqa: PLC0415

    try:
        main()
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
    except Interrupted as e:
        print(f"interrupted ({e.signal_name})", file=sys.stderr)
        sys.exit(e.exit_code)
