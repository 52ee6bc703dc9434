"""FLOP accounting in two named conventions, a table of GPU peak throughputs, MFU, and `tinyelectra flops`.

1. The **paper convention** ("paper convention (Clark et al. 2020, official script)"): the counting rules of
   google-research/electra `flops_computation.py`, which produced every FLOP number in the paper
   (the paper's FLOPs appendix). A (m×n)·(n×p) matmul is 2mnp; embedding look-ups are dense one-hot matmuls (2·E·V per
   token); element-wise costs: dropout 4, LayerNorm 5, GELU 8, softmax 5 per element; the backward pass costs
   the same as the forward pass (train = 2 × forward); the MLM output head is charged for a fixed share
   f = 0.15625 of positions, for every model (the official script passes no other value, not even for
   ELECTRA-Large, whose mask rate is 0.25). Use it to put a run beside the paper's Table 1.

2. The **hardware convention** ("hardware convention (matmuls, sparse look-ups, bwd = 2 x fwd)"): the
   matmul work a GPU really does, for utilisation (MFU). Embedding look-ups are sparse gathers (0 FLOPs); the
   E->H projection, Q/K/V/output projections, attention scores (QK^T) and weighted values (PV), the FFN, the
   discriminator head and the generator MLM head count; the generator head only at the N = int((p+0.005)·T)
   masked slots per row (dense H->E, then E×V logits for N rows); backward = 2 × forward, so
   train = 3 × forward. Element-wise work (LayerNorm, GELU, softmax, dropout, biases) is not counted.

All counts are floats in FLOPs. Shapes: B batch, T tokens per sequence, N masked slots per row, V vocab,
H hidden, E embedding, I FFN, L layers, A heads. This module imports neither torch nor the model: the
trainer, the planner and the report call these functions with config objects.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tinyelectra.config import INT_LIMIT, ModelConfig, ObjectiveConfig, Recipe, load_recipe, recipe_from_dict
from tinyelectra.console import make_console
from tinyelectra.errors import UserError

PAPER_CONVENTION = "paper convention (Clark et al. 2020, official script)"
HARDWARE_CONVENTION = "hardware convention (matmuls, sparse look-ups, bwd = 2 x fwd)"

# The official script's constants (flops_computation.py). FLOPs per element.
DROPOUT_FLOPS = 4  # random number, compare, mask multiply, 1/(1-p) rescale
LAYER_NORM_FLOPS = 5  # mean, variance, normalise, scale, shift
GELU_FLOPS = 8  # tanh approximation
SOFTMAX_FLOPS = 5  # max-subtract, exp, sum, divide, ...
# Share of positions charged for the MLM softmax in the official script, for every model and mask rate.
PAPER_OUTPUT_FRACTION = 0.15625

# The checkpoint fractions of the paper's Table 1 (ELECTRA-Small at 6.25% .. 100% of 1M steps).
TABLE1_FRACTIONS: tuple[float, ...] = (1 / 16, 1 / 8, 1 / 4, 1 / 2, 1.0)


# ----------------------------------------------------------------------------------------------------------
# Paper convention: one forward pass over one sequence of T = seq_len tokens, piece by piece.
# ----------------------------------------------------------------------------------------------------------


def paper_block_flops(hidden_size: int, ffn_size: int, num_heads: int, seq_len: int) -> float:
    """Forward FLOPs of one post-LN transformer block over one sequence (official `get_block_flops`).

    Per position, with k = H (the Q/K/V width):
    6Hk + 3k (Q/K/V kernels and biases) + 2kT (scores) + 10·T·A (softmax 5, dropout 4, scale 1 per score)
    + 2HT (weighted values) + 2H² + 6H (output projection, bias, dropout, residual)
    + 5 (the official code charges the attention LayerNorm once, not per element: kept to match)
    + 4HI + 9I (FFN kernels, GELU, bias) + 11H (bias, dropout, residual, LayerNorm).
    """
    h, i, a, t = hidden_size, ffn_size, num_heads, seq_len
    k = h
    per_position = (
        6 * h * k + 3 * k
        + 2 * k * t
        + (SOFTMAX_FLOPS + DROPOUT_FLOPS + 1) * t * a
        + 2 * h * t
        + 2 * h * h + (1 + DROPOUT_FLOPS + 1) * h
        + LAYER_NORM_FLOPS
        + 4 * h * i + (GELU_FLOPS + 1) * i
        + (1 + DROPOUT_FLOPS + 1 + LAYER_NORM_FLOPS) * h
    )
    return float(t * per_position)


def paper_input_embedding_flops(hidden_size: int, embedding_size: int, vocab_size: int, seq_len: int) -> float:
    """Forward FLOPs of the input embeddings over one sequence (official `get_embedding_flops(output=False)`).

    Per position: 2EV (token look-up as a dense one-hot matmul) + 2E(T+2) (position and type look-ups, dense)
    + 2E (adding them) + 5E (LayerNorm) + 4E (dropout), plus 2HE + H for the E->H projection when E != H.
    """
    h, e, v, t = hidden_size, embedding_size, vocab_size, seq_len
    per_position = 2 * e * v + 2 * e * (t + 2) + 2 * e + LAYER_NORM_FLOPS * e + DROPOUT_FLOPS * e
    if e != h:
        per_position += 2 * h * e + h
    return float(t * per_position)


def paper_mlm_head_flops(
    hidden_size: int, embedding_size: int, vocab_size: int, seq_len: int,
    output_fraction: float = PAPER_OUTPUT_FRACTION,
) -> float:
    """Forward FLOPs of the MLM output head over one sequence (official `get_embedding_flops(output=True)`).

    f·T positions, each: 2HE + E (dense H->E and bias) + 8E (GELU) + 5E (LayerNorm) + 2EV (tied output matmul)
    + 5V (softmax) + 2V (picking the target word) = 2EV + 2HE + 14E + 7V.
    """
    h, e, v = hidden_size, embedding_size, vocab_size
    per_position = 2 * e * v + 2 * h * e + e + GELU_FLOPS * e + LAYER_NORM_FLOPS * e + SOFTMAX_FLOPS * v + 2 * v
    return output_fraction * per_position * seq_len


def paper_binary_head_flops(hidden_size: int, seq_len: int) -> float:
    """Forward FLOPs of the discriminator head over one sequence: dense H->H, bias, GELU, dense H->1 (2H² + 11H)."""
    h = hidden_size
    return float(seq_len * (2 * h * h + h + GELU_FLOPS * h + 2 * h))


def paper_encoder_flops(model: ModelConfig, seq_len: int) -> float:
    """Forward FLOPs of embeddings + all blocks of one encoder over one sequence (paper convention)."""
    blocks = model.num_layers * paper_block_flops(model.hidden_size, model.ffn_size, model.num_heads, seq_len)
    return blocks + paper_input_embedding_flops(model.hidden_size, model.embedding_size, model.vocab_size, seq_len)


def paper_inference_flops(model: ModelConfig, seq_len: int) -> float:
    """Paper-convention FLOPs to run the discriminator on one sequence of `seq_len` tokens (the paper's
    "infer FLOPs": encoder + binary classification head). ELECTRA-Small at T = 128: 3.677e9."""
    return paper_encoder_flops(model, seq_len) + paper_binary_head_flops(model.hidden_size, seq_len)


def paper_forward_flops_per_sequence(model: ModelConfig, objective: ObjectiveConfig, seq_len: int) -> float:
    """One pre-training forward pass over one sequence, paper convention.

    electra: discriminator (encoder + binary head) + generator (its own encoder, with the discriminator's
    embedding width E, + MLM head on f·T positions). mlm (the BERT baseline): encoder + MLM head.
    """
    if objective.kind == "mlm":
        return paper_encoder_flops(model, seq_len) + paper_mlm_head_flops(
            model.hidden_size, model.embedding_size, model.vocab_size, seq_len)
    gen = model.generator()
    discriminator = paper_inference_flops(model, seq_len)
    generator = paper_encoder_flops(gen, seq_len) + paper_mlm_head_flops(
        gen.hidden_size, gen.embedding_size, gen.vocab_size, seq_len)
    return discriminator + generator


def paper_train_flops_per_step(model: ModelConfig, objective: ObjectiveConfig, batch_size: int, seq_len: int) -> float:
    """Paper-convention FLOPs of one optimizer step over `batch_size` sequences: 2 × batch × forward
    (the official script's backward = forward). Multiply by steps for a run: ELECTRA-Small, 1M steps of
    128 × 128, generator hidden 64 -> 1.294e18."""
    return 2.0 * batch_size * paper_forward_flops_per_sequence(model, objective, seq_len)


def paper_dense_lookup_flops_per_step(
    model: ModelConfig, objective: ObjectiveConfig, batch_size: int, seq_len: int,
) -> float:
    """The part of `paper_train_flops_per_step` that is dense one-hot embedding look-ups (token, position and
    type, once per encoder): real hardware does sparse gathers instead (about 40% for ELECTRA-Small)."""
    e, t = model.embedding_size, seq_len
    per_encoder = t * (2 * e * model.vocab_size + 2 * e * (t + 2))
    encoders = 1 if objective.kind == "mlm" else 2
    return 2.0 * batch_size * encoders * per_encoder


# ----------------------------------------------------------------------------------------------------------
# Hardware convention: matmul FLOPs actually executed.
# ----------------------------------------------------------------------------------------------------------


def hardware_encoder_forward_flops(model: ModelConfig, seq_len: int) -> float:
    """Matmul FLOPs of one encoder's forward pass over one sequence: sparse look-ups (0), the E->H projection
    when E != H (2EH per token), and per block and token 8H² (Q, K, V, output projections) + 4TH (QK^T and
    PV) + 4HI (FFN)."""
    h, e, i, t = model.hidden_size, model.embedding_size, model.ffn_size, seq_len
    projection = 2 * e * h if e != h else 0
    block = 8 * h * h + 4 * t * h + 4 * h * i
    return float(t * (projection + model.num_layers * block))


def hardware_inference_flops(model: ModelConfig, seq_len: int) -> float:
    """Matmul FLOPs to run the discriminator (encoder + dense H->H + dense H->1) on one sequence."""
    h = model.hidden_size
    return hardware_encoder_forward_flops(model, seq_len) + seq_len * (2 * h * h + 2 * h)


def hardware_mlm_head_flops(hidden_size: int, embedding_size: int, vocab_size: int, num_masked: int) -> float:
    """Matmul FLOPs of the MLM head evaluated at `num_masked` rows only: dense H->E, then E×V logits."""
    return float(num_masked * (2 * hidden_size * embedding_size + 2 * embedding_size * vocab_size))


def hardware_forward_flops_per_sequence(model: ModelConfig, objective: ObjectiveConfig, seq_len: int) -> float:
    """Matmul FLOPs of one pre-training forward pass over one sequence (generator head at N slots only)."""
    n = objective.num_masked(seq_len)  # N: fixed prediction slots per row (static shapes)
    if objective.kind == "mlm":
        return hardware_encoder_forward_flops(model, seq_len) + hardware_mlm_head_flops(
            model.hidden_size, model.embedding_size, model.vocab_size, n)
    gen = model.generator()
    generator = hardware_encoder_forward_flops(gen, seq_len) + hardware_mlm_head_flops(
        gen.hidden_size, gen.embedding_size, gen.vocab_size, n)
    return hardware_inference_flops(model, seq_len) + generator


def hardware_train_flops_per_step(model: ModelConfig, objective: ObjectiveConfig, batch_size: int,
                                  seq_len: int) -> float:
    """Matmul FLOPs of one optimizer step over `batch_size` sequences (the recipe's global batch, whatever the
    micro-batching): forward + backward = 3 × forward. Divide by batch_size × seq_len for FLOPs per token
    (the `hw_flops_per_token` that `mfu` takes). Sampling, losses and the optimizer update are not matmuls."""
    return 3.0 * batch_size * hardware_forward_flops_per_sequence(model, objective, seq_len)


# ----------------------------------------------------------------------------------------------------------
# Peak throughputs and MFU.
# ----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuPeak:
    """Dense (no 2:4 sparsity) peak throughput of one GPU in FLOP/s, by precision; None = not supported.

    bf16 / fp16: tensor-core matmuls with FP32 accumulation (what PyTorch uses). GeForce cards run FP32
    accumulation at half their FP16-accumulate tensor rate, so their numbers here are that halved rate.
    tf32: tensor-core TF32. fp32: plain CUDA-core FP32 (torch with TF32 matmuls disabled).
    """

    name: str
    pattern: str  # regex searched in the lower-cased torch.cuda.get_device_name()
    fp32: float
    tf32: float | None
    bf16: float | None
    fp16: float | None


_T = 1e12
# Order matters: the first pattern that matches wins (PCIe / NVL before the plain SXM name).
# Datasheet numbers marked "*" there are with sparsity; the dense number is half of it.
GPU_PEAKS: tuple[GpuPeak, ...] = (
    # NVIDIA Tesla V100 datasheet (2020): SXM2 15.7 FP32, 125 tensor (mixed precision); PCIe 14 / 112;
    # V100S PCIe 16.4 / 130. Volta has no TF32 or BF16.
    GpuPeak("V100S PCIe", r"v100s", 16.4 * _T, None, None, 130 * _T),
    GpuPeak("V100 PCIe", r"v100-pcie", 14.0 * _T, None, None, 112 * _T),
    GpuPeak("V100 SXM2", r"v100-(sxm2|dgxs)", 15.7 * _T, None, None, 125 * _T),
    # NVIDIA T4 datasheet: 8.1 FP32, 65 mixed-precision FP16/FP32 tensor. Turing has no TF32 or BF16.
    GpuPeak("T4", r"\bt4\b", 8.1 * _T, None, None, 65 * _T),
    # NVIDIA Turing architecture whitepaper, Table 1, RTX 2080 Ti at reference clocks: 13.4 FP32;
    # FP16 tensor 107.6 with FP16 accumulate, 53.8 with FP32 accumulate (GeForce half rate).
    GpuPeak("GeForce RTX 2080 Ti", r"rtx 2080 ti\s*$", 13.4 * _T, None, None, 53.8 * _T),
    # NVIDIA A100 Tensor Core GPU datasheet (SXM and PCIe, 40/80 GB): 19.5 FP32, 156 TF32, 312 BF16/FP16.
    GpuPeak("A100", r"\ba100\b", 19.5 * _T, 156 * _T, 312 * _T, 312 * _T),
    # NVIDIA A10 datasheet: 31.2 FP32, 62.5 TF32, 125 BF16/FP16 (dense).
    GpuPeak("A10", r"\ba10\b", 31.2 * _T, 62.5 * _T, 125 * _T, 125 * _T),
    # NVIDIA A40 datasheet: 37.4 FP32, 74.8 TF32, 149.7 BF16/FP16 (dense).
    GpuPeak("A40", r"\ba40\b", 37.4 * _T, 74.8 * _T, 149.7 * _T, 149.7 * _T),
    # NVIDIA Ampere GA102 GPU architecture whitepaper, RTX 3080 / RTX 3090 columns: FP32 29.8 / 35.6;
    # TF32 tensor 29.8 / 35.6; FP16 and BF16 tensor with FP32 accumulate 59.5 / 71 (GeForce half rate; the
    # FP16-accumulate rate is 119 / 142).
    GpuPeak("GeForce RTX 3080", r"rtx 3080\s*$", 29.8 * _T, 29.8 * _T, 59.5 * _T, 59.5 * _T),
    GpuPeak("GeForce RTX 3090", r"rtx 3090\s*$", 35.6 * _T, 35.6 * _T, 71 * _T, 71 * _T),
    # NVIDIA Ada Lovelace GPU architecture whitepaper, RTX 4090 column: FP32 82.6; TF32 tensor 82.6;
    # FP16 and BF16 tensor with FP32 accumulate 165.2 (GeForce half rate; FP16-accumulate 330.3).
    GpuPeak("GeForce RTX 4090", r"rtx 4090\s*$", 82.6 * _T, 82.6 * _T, 165.2 * _T, 165.2 * _T),
    # NVIDIA L4 datasheet: 30.3 FP32, 120* TF32, 242* BF16/FP16.
    GpuPeak("L4", r"\bl4\b", 30.3 * _T, 60 * _T, 121 * _T, 121 * _T),
    # NVIDIA L40S datasheet: 91.6 FP32, 366* TF32, 733* BF16/FP16.
    GpuPeak("L40S", r"\bl40s\b", 91.6 * _T, 183 * _T, 366.5 * _T, 366.5 * _T),
    # NVIDIA H100 datasheet: PCIe 51 FP32, 756* TF32, 1513* BF16/FP16; NVL 60 FP32, 835* TF32, 1671* BF16/FP16.
    GpuPeak("H100 NVL", r"\bh100\b.*\bnvl\b", 60 * _T, 417.5 * _T, 835.5 * _T, 835.5 * _T),
    GpuPeak("H100 PCIe", r"\bh100\b.*\bpcie\b", 51 * _T, 378 * _T, 756.5 * _T, 756.5 * _T),
    # NVIDIA H100 Tensor Core GPU architecture whitepaper, H100 SXM5: 66.9 FP32, 494.7 TF32, 989.4 BF16/FP16
    # (the datasheet rounds to 67 / 989* / 1979*). torch names it "NVIDIA H100 80GB HBM3".
    GpuPeak("H100 SXM", r"\bh100\b", 66.9 * _T, 494.7 * _T, 989.4 * _T, 989.4 * _T),
    # NVIDIA GH200 Grace Hopper datasheet: the GPU has H100 SXM's compute (67 FP32, 989* TF32, 1979* BF16).
    GpuPeak("GH200", r"\bgh200\b", 66.9 * _T, 494.7 * _T, 989.4 * _T, 989.4 * _T),
    # NVIDIA H200 datasheet: SXM 67 FP32, 989* TF32, 1979* BF16/FP16 (H100 SXM's compute, more memory);
    # NVL 60 FP32, 835* TF32, 1671* BF16/FP16.
    GpuPeak("H200 NVL", r"\bh200\b.*\bnvl\b", 60 * _T, 417.5 * _T, 835.5 * _T, 835.5 * _T),
    GpuPeak("H200 SXM", r"\bh200\b", 66.9 * _T, 494.7 * _T, 989.4 * _T, 989.4 * _T),
)

_PRECISION_ALIASES = {
    "bf16": "bf16", "bfloat16": "bf16",
    "fp16": "fp16", "float16": "fp16", "half": "fp16",
    "tf32": "tf32",
    "fp32": "fp32", "float32": "fp32",
}
# Laptop parts share desktop names but run at a fraction of the clocks and power: no honest single peak.
_MOBILE = re.compile(r"laptop|max-q|mobile")


def gpu_peak(device_name: str) -> GpuPeak | None:
    """The table row for a `torch.cuda.get_device_name()` string, or None when the GPU is not in the table."""
    name = device_name.lower().strip()
    if _MOBILE.search(name):
        return None
    for row in GPU_PEAKS:
        if re.search(row.pattern, name):
            return row
    return None


def peak_flops(device_name: str, precision: str) -> float | None:
    """Dense peak FLOP/s of `device_name` (as torch.cuda.get_device_name() spells it) at `precision`
    (bf16 | fp16 | tf32 | fp32; pass tf32 when fp32 matmuls run with TF32 allowed). None when the GPU is
    not in the table or does not support that precision in hardware (BF16 and TF32 before Ampere)."""
    key = _PRECISION_ALIASES.get(precision.lower())
    if key is None:
        raise UserError(f"unknown precision {precision!r} for peak FLOPs (use bf16, fp16, tf32 or fp32)")
    row = gpu_peak(device_name)
    return None if row is None else getattr(row, key)


def mfu(tokens_per_second: float, hw_flops_per_token: float, device_name: str, precision: str) -> float | None:
    """Model FLOPs utilisation: achieved hardware-convention FLOP/s over the GPU's dense peak at `precision`
    (a share, 0..1). `hw_flops_per_token` = hardware_train_flops_per_step(...) / (batch_size × seq_len).
    None when the peak is unknown (CPU, GPU not in the table, unsupported precision)."""
    peak = peak_flops(device_name, precision)
    if not peak:
        return None
    return tokens_per_second * hw_flops_per_token / peak


# ----------------------------------------------------------------------------------------------------------
# A recipe's numbers, and the `tinyelectra flops` command.
# ----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FlopsSummary:
    """Both conventions for one recipe at one batch size, sequence length and step count."""

    batch_size: int
    seq_len: int
    steps: int
    num_masked: int  # N slots per row
    train_flops_paper_per_step: float
    train_flops_hardware_per_step: float
    inference_flops_paper_per_sequence: float
    inference_flops_hardware_per_sequence: float
    dense_lookup_flops_paper_per_step: float

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.seq_len

    @property
    def train_flops_paper(self) -> float:
        return self.train_flops_paper_per_step * self.steps

    @property
    def train_flops_hardware(self) -> float:
        return self.train_flops_hardware_per_step * self.steps


def summarize(model: ModelConfig, objective: ObjectiveConfig, batch_size: int, seq_len: int,
              steps: int) -> FlopsSummary:
    """Every FLOP number `tinyelectra flops` prints, for a model and objective at batch × seq_len × steps."""
    return FlopsSummary(
        batch_size=batch_size,
        seq_len=seq_len,
        steps=steps,
        num_masked=objective.num_masked(seq_len),
        train_flops_paper_per_step=paper_train_flops_per_step(model, objective, batch_size, seq_len),
        train_flops_hardware_per_step=hardware_train_flops_per_step(model, objective, batch_size, seq_len),
        inference_flops_paper_per_sequence=paper_inference_flops(model, seq_len),
        inference_flops_hardware_per_sequence=hardware_inference_flops(model, seq_len),
        dense_lookup_flops_paper_per_step=paper_dense_lookup_flops_per_step(model, objective, batch_size, seq_len),
    )


def format_flops(value: float) -> str:
    """4 significant digits, compact exponent: 1.424e18, 3.677e9."""
    mantissa, exponent = f"{value:.3e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def recipe_for_flops(
    recipe_name: str, steps: int | None, batch: int | None, seq_len: int | None, overrides: list[str],
) -> Recipe:
    """Load the recipe with its --set overrides, then apply --steps/--batch/--seq-len on top: a value the recipe
    cannot take is an error naming the option typed (not the train.* key it sets)."""
    recipe = load_recipe(recipe_name, overrides)
    for value, flag, key in ((steps, "--steps", "steps"), (batch, "--batch", "batch_size"),
                             (seq_len, "--seq-len", "seq_len")):
        if value is None:
            continue
        if not 0 < value < INT_LIMIT:  # an int setting must fit int64
            raise UserError(f"{flag} must be a positive integer below 2^63 ({INT_LIMIT:.3e}), got {value}")
        raw = recipe.to_dict()
        raw["train"][key] = value
        try:
            recipe = recipe_from_dict(raw, where=flag)
        except UserError as e:
            raise UserError(str(e) if str(e).startswith(flag) else f"{flag} {value}: {e}") from None
    return recipe


def flops_command(
    recipe_name: str, steps: int | None, batch: int | None, seq_len: int | None, overrides: list[str],
) -> None:
    """`tinyelectra flops`: both conventions per step, per token and in total, inference FLOPs, Table 1 fractions."""
    from rich.markup import escape
    from rich.table import Table

    recipe = recipe_for_flops(recipe_name, steps, batch, seq_len, overrides)
    m, obj, tr = recipe.model, recipe.objective, recipe.train
    s = summarize(m, obj, tr.batch_size, tr.seq_len, tr.steps)
    console = make_console(stderr=False, highlight=False)

    shape = f"L{m.num_layers} H{m.hidden_size} E{m.embedding_size} I{m.ffn_size} A{m.num_heads} V{m.vocab_size}"
    if obj.kind == "electra":
        g = m.generator()
        what = f"ELECTRA: discriminator {shape}; generator H{g.hidden_size} I{g.ffn_size} A{g.num_heads}"
    else:
        what = f"MLM baseline (BERT-style): {shape}"
    console.print(f"[bold]{escape(recipe.name)}[/bold]  {what}")
    console.print(
        f"batch {s.batch_size} x seq_len {s.seq_len} = {s.tokens_per_step:,} tokens per step, {s.steps:,} steps, "
        f"N = {s.num_masked} masked slots per row"
    )

    table = Table(title="Pre-training FLOPs", title_justify="left")
    table.add_column("quantity")
    table.add_column("paper", justify="right")
    table.add_column("hardware", justify="right")
    table.add_row("train FLOPs per step", format_flops(s.train_flops_paper_per_step),
                  format_flops(s.train_flops_hardware_per_step))
    table.add_row(
        "train FLOPs per token",
        format_flops(s.train_flops_paper_per_step / s.tokens_per_step),
        format_flops(s.train_flops_hardware_per_step / s.tokens_per_step),
    )
    table.add_row(f"train FLOPs total ({s.steps:,} steps)", format_flops(s.train_flops_paper),
                  format_flops(s.train_flops_hardware))
    table.add_row(
        "inference FLOPs per sequence (discriminator)",
        format_flops(s.inference_flops_paper_per_sequence),
        format_flops(s.inference_flops_hardware_per_sequence),
    )
    console.print(table)
    # soft_wrap: the convention names must reach the user (and grep) in one piece, whatever the width.
    console.print(f"paper = {PAPER_CONVENTION}: train = 2 x forward; dense one-hot embedding look-ups "
                  f"({s.dense_lookup_flops_paper_per_step / s.train_flops_paper_per_step:.0%} of it); "
                  f"MLM head on f = {PAPER_OUTPUT_FRACTION} of positions; element-wise ops counted.", soft_wrap=True)
    console.print(f"hardware = {HARDWARE_CONVENTION}: train = 3 x forward; MLM head on the N masked "
                  f"slots only; element-wise ops not counted. Use it for MFU.", soft_wrap=True)

    fractions = Table(title="Checkpoints at the paper's Table 1 fractions", title_justify="left")
    fractions.add_column("fraction", justify="right")
    fractions.add_column("steps", justify="right")
    fractions.add_column("paper FLOPs", justify="right")
    fractions.add_column("hardware FLOPs", justify="right")
    for fraction in TABLE1_FRACTIONS:
        fraction_steps = round(s.steps * fraction)
        fractions.add_row(
            f"{fraction:.2%}", f"{fraction_steps:,}",
            format_flops(s.train_flops_paper_per_step * fraction_steps),
            format_flops(s.train_flops_hardware_per_step * fraction_steps),
        )
    console.print(fractions)
    if obj.kind == "electra" and (m.hidden_size, m.embedding_size, m.num_layers) == (256, 128, 12):
        console.print(
            "note: the paper's Table 1 gives ELECTRA-Small 1.4e18 (rows 8.9e16 .. 7.1e17); the official script "
            "yields that with a 128-wide generator (1.424e18); with the 64-wide generator the paper describes "
            "it gives 1.294e18.",
            soft_wrap=True,
        )
