"""FLOP accounting: the paper convention against the official script's printed values and the paper's Table 1,
the hardware convention against torch's FlopCounterMode on the real model and on transformers' Electra,
the GPU peak table and MFU, and the `tinyelectra flops` command."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tinyelectra import flops as F
from tinyelectra.config import ModelConfig, ObjectiveConfig
from tinyelectra.errors import UserError

# The paper's shapes (Appendix A), built here so the tests do not depend on recipe files.
SMALL = ModelConfig(embedding_size=128, hidden_size=256, num_layers=12, num_heads=4, ffn_size=1024,
                    generator_fraction=0.25)
SMALL_GEN128 = ModelConfig(embedding_size=128, hidden_size=256, num_layers=12, num_heads=4, ffn_size=1024,
                           generator_fraction=0.5)
BASE = ModelConfig(embedding_size=768, hidden_size=768, num_layers=12, num_heads=12, ffn_size=3072,
                   generator_fraction=1 / 3)
LARGE = ModelConfig(embedding_size=1024, hidden_size=1024, num_layers=24, num_heads=16, ffn_size=4096,
                    generator_fraction=0.25)
ELECTRA = ObjectiveConfig(kind="electra", mask_prob=0.15)
ELECTRA_LARGE = ObjectiveConfig(kind="electra", mask_prob=0.25)  # the script still charges f = 0.15625
MLM = ObjectiveConfig(kind="mlm", mask_prob=0.15, mask_token_fraction=0.8, random_token_fraction=0.1)


def paper_total(model, objective, batch, seq_len, steps):
    return F.paper_train_flops_per_step(model, objective, batch, seq_len) * steps


# --- paper convention ----------------------------------------------------------------------------------------
# "reference" values: the official script's outputs rounded to 4 digits, as the project's shared reference notes
# (outside this repository) record them (what the acceptance asks, within 0.1%); "script" values: what
# google-research/electra flops_computation.py prints for the same models (MODEL_FLOPS, get_infer_flops).
PAPER_CASES = [
    # name, model, objective, batch, seq_len, steps, reference, script
    ("small-gen64", SMALL, ELECTRA, 128, 128, 1_000_000, 1.294e18, 1.293743798272e18),
    ("small-gen128", SMALL_GEN128, ELECTRA, 128, 128, 1_000_000, 1.424e18, 1.424050337792e18),
    ("base", BASE, ELECTRA, 256, 512, 766_000, 6.425e19, 6.424541834277683e19),
    ("large-400k", LARGE, ELECTRA_LARGE, 2048, 512, 400_000, 7.118e20, 7.117606040895488e20),
    ("large-1.75M", LARGE, ELECTRA_LARGE, 2048, 512, 1_750_000, 3.114e21, 3.113952642891776e21),
    # BERT-Small (the MLM baseline on the Small encoder), 1.45M steps: the script's bert_small; paper 1.4e18.
    ("bert-small", SMALL, MLM, 128, 128, 1_450_000, 1.4e18, 1.4187399146496e18),
]


@pytest.mark.parametrize("name,model,objective,batch,seq_len,steps,reference,script", PAPER_CASES,
                         ids=[c[0] for c in PAPER_CASES])
def test_paper_train_flops_reproduce_official_values(name, model, objective, batch, seq_len, steps, reference, script):
    total = paper_total(model, objective, batch, seq_len, steps)
    tolerance = 0.05 if name == "bert-small" else 1e-3  # the paper prints BERT-Small to 2 digits only
    assert total == pytest.approx(reference, rel=tolerance)
    assert total == pytest.approx(script, rel=1e-9)


def test_paper_inference_flops():
    assert F.paper_inference_flops(SMALL, 128) == pytest.approx(3.677e9, rel=1e-3)
    assert F.paper_inference_flops(SMALL, 128) == pytest.approx(3_677_281_792, rel=1e-12)  # the script, exactly
    # Paper Table 1 "infer FLOPs" (one length-128 input): ELECTRA-Base / BERT-Base 2.9e10.
    assert float(f"{F.paper_inference_flops(BASE, 128):.1e}") == 2.9e10


def test_paper_table1_rows_are_fractions_of_the_gen128_count():
    """The paper's Table 1 prints ELECTRA-Small at 1/16..1 of training as 8.9e16, 1.8e17, 3.6e17, 7.1e17, 1.4e18."""
    total = paper_total(SMALL_GEN128, ELECTRA, 128, 128, 1_000_000)
    printed = [float(f"{total * f:.1e}") for f in F.TABLE1_FRACTIONS]
    assert printed == [8.9e16, 1.8e17, 3.6e17, 7.1e17, 1.4e18]


def test_paper_base_mlm_and_dense_lookup_share():
    # BERT-Base in the paper: 6.4e19 (script: 6.428e19, 1M steps of 256 x 512).
    assert paper_total(BASE, MLM, 256, 512, 1_000_000) == pytest.approx(6.428335104e19, rel=1e-9)
    # The paper convention: about 40% of Small's paper-convention FLOPs are the dense embedding look-ups.
    share = (F.paper_dense_lookup_flops_per_step(SMALL, ELECTRA, 128, 128)
             / F.paper_train_flops_per_step(SMALL, ELECTRA, 128, 128))
    assert 0.38 < share < 0.42


# --- hardware convention against torch's FlopCounterMode ------------------------------------------------------


def _counted_train_step_flops(model_cfg: ModelConfig, objective: ObjectiveConfig, batch: int, seq_len: int) -> int:
    """Matmul FLOPs torch counts for one forward+backward of the real ELECTRA / MLM training step.

    The CPU fast path (runtime.linear through oneDNN's private op) is switched off here: FlopCounterMode has no
    formula for that op and would see none of the linear layers. Same mathematics, counted through F.linear."""
    torch = pytest.importorskip("torch")
    from tinyelectra import runtime
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    from tinyelectra.electra import SpecialIds, combine, loss_terms, mask_batch
    from tinyelectra.model import Electra

    torch.manual_seed(0)
    model = Electra(model_cfg, objective.kind).train()
    special = SpecialIds(pad=0, cls=1, sep=2, mask=3)
    ids = torch.randint(5, model_cfg.vocab_size, (batch, seq_len))
    ids[:, 0], ids[:, -1] = special.cls, special.sep
    masked = mask_batch(ids, torch.zeros_like(ids), torch.ones_like(ids, dtype=torch.bool), objective, special,
                        model_cfg.vocab_size)
    counter = FlopCounterMode(display=False)
    fast_path, runtime._ONEDNN_LINEAR = runtime._ONEDNN_LINEAR, False
    # The math SDPA backend decomposes attention into bmm's that the counter sees; CPU's fused kernel is not
    # registered with FlopCounterMode (and on GPU it charges a recomputation of the scores in the backward).
    try:
        with sdpa_kernel(SDPBackend.MATH), counter:
            terms = loss_terms(model, masked, objective)
            combine(terms, objective, terms.stats["mlm_count"], masked.token_count).backward()
    finally:
        runtime._ONEDNN_LINEAR = fast_path
    return counter.get_total_flops()


TINY = dict(vocab_size=1000, num_layers=2, num_heads=2, ffn_size=512, max_positions=128)
HW_CASES = [
    ("electra E<H", ModelConfig(embedding_size=64, hidden_size=128, generator_fraction=0.25, **TINY), ELECTRA),
    ("electra E=H", ModelConfig(embedding_size=128, hidden_size=128, generator_fraction=0.5, **TINY), ELECTRA),
    ("mlm", ModelConfig(embedding_size=64, hidden_size=128, **TINY), MLM),
]


@pytest.mark.parametrize("name,model_cfg,objective", HW_CASES, ids=[c[0] for c in HW_CASES])
def test_hardware_count_matches_flop_counter_on_real_model(name, model_cfg, objective):
    batch, seq_len = 4, 64
    counted = _counted_train_step_flops(model_cfg, objective, batch, seq_len)
    predicted = F.hardware_train_flops_per_step(model_cfg, objective, batch, seq_len)
    assert predicted == pytest.approx(counted, rel=0.05)  # acceptance: within 5% (it is exact today)


def test_hardware_discriminator_matches_flop_counter_on_transformers_electra():
    """An independent model: transformers' ElectraForPreTraining, forward + backward, equals 3 x the count."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    cfg = ModelConfig(embedding_size=64, hidden_size=128, **TINY)
    hf_cfg = transformers.ElectraConfig(
        vocab_size=cfg.vocab_size, embedding_size=cfg.embedding_size, hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads, intermediate_size=cfg.ffn_size,
        max_position_embeddings=cfg.max_positions,
    )
    model = transformers.ElectraForPreTraining(hf_cfg).train()
    batch, seq_len = 4, 64
    ids = torch.randint(5, cfg.vocab_size, (batch, seq_len))
    counter = FlopCounterMode(display=False)
    with sdpa_kernel(SDPBackend.MATH), counter:
        model(input_ids=ids, labels=torch.zeros_like(ids)).loss.backward()
    predicted = 3 * batch * F.hardware_inference_flops(cfg, seq_len)
    assert predicted == pytest.approx(counter.get_total_flops(), rel=0.01)


def test_hardware_is_below_paper_for_small():
    """Sparse look-ups and a masked-only head outweigh 3x vs 2x: about 0.89 of the paper's count for Small."""
    ratio = (F.hardware_train_flops_per_step(SMALL, ELECTRA, 128, 128)
             / F.paper_train_flops_per_step(SMALL, ELECTRA, 128, 128))
    assert 0.8 < ratio < 0.95


# --- GPU peaks and MFU -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "device_name,row",
    [
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H100 NVL", "H100 NVL"),
        ("NVIDIA H200", "H200 SXM"),
        ("NVIDIA H200 NVL", "H200 NVL"),
        ("NVIDIA GH200 480GB", "GH200"),
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA A100 80GB PCIe", "A100"),
        ("NVIDIA A10", "A10"),
        ("Tesla V100-SXM2-16GB", "V100 SXM2"),
        ("Tesla V100-PCIE-32GB", "V100 PCIe"),
        ("Tesla T4", "T4"),
        ("NVIDIA GeForce RTX 3090", "GeForce RTX 3090"),
        ("NVIDIA GeForce RTX 4090", "GeForce RTX 4090"),
        ("NVIDIA L4", "L4"),
    ],
)
def test_gpu_peak_lookup_by_torch_device_name(device_name, row):
    assert F.gpu_peak(device_name).name == row


@pytest.mark.parametrize(
    "device_name", ["NVIDIA A10G", "NVIDIA GeForce RTX 4090 Laptop GPU", "NVIDIA GeForce RTX 3090 Ti",
                    "NVIDIA GeForce RTX 4090 D", "cpu", ""]
)
def test_gpu_peak_unknown_parts_are_none(device_name):
    assert F.peak_flops(device_name, "bf16") is None


def test_peak_values_against_datasheets():
    # Dense numbers are half the datasheets' sparsity figures: H100 SXM 1979 TFLOPS bf16, A100 624.
    assert F.peak_flops("NVIDIA H100 80GB HBM3", "bf16") == pytest.approx(1979e12 / 2, rel=1e-3)
    assert F.peak_flops("NVIDIA A100-SXM4-40GB", "bfloat16") == pytest.approx(624e12 / 2, rel=1e-3)
    assert F.peak_flops("Tesla V100-SXM2-16GB", "fp16") == pytest.approx(125e12)
    # Volta and Turing have no BF16 or TF32 tensor cores.
    assert F.peak_flops("Tesla V100-SXM2-16GB", "bf16") is None
    assert F.peak_flops("Tesla T4", "tf32") is None
    # GeForce: FP16/BF16 tensor math with FP32 accumulation runs at 2x FP32, not the 4x of FP16 accumulation.
    for name in ("NVIDIA GeForce RTX 3090", "NVIDIA GeForce RTX 4090"):
        assert F.peak_flops(name, "bf16") / F.peak_flops(name, "fp32") == pytest.approx(2.0, rel=0.01)
    for row in F.GPU_PEAKS:
        assert row.tf32 is None or row.fp32 <= row.tf32 <= (row.bf16 or row.fp16)
    with pytest.raises(UserError):
        F.peak_flops("NVIDIA H100 80GB HBM3", "int8")


def test_mfu():
    # 1e6 tokens/s at 1e8 FLOPs per token = 1e14 FLOP/s; an H100 SXM does 989.4e12 in bf16 -> 10.1%.
    assert F.mfu(1e6, 1e8, "NVIDIA H100 80GB HBM3", "bf16") == pytest.approx(1e14 / 989.4e12)
    assert F.mfu(1e6, 1e8, "cpu", "fp32") is None


# --- the command -----------------------------------------------------------------------------------------


def _cli(*args: str):
    from typer.testing import CliRunner

    from tinyelectra.cli import app

    result = CliRunner().invoke(app, ["flops", *args], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    return result.output


def _fraction_rows(output: str) -> list[tuple[float, float, float]]:
    """(fraction %, paper FLOPs, hardware FLOPs) from the Table 1 fractions table."""
    rows = re.findall(r"│\s*([\d.]+)%\s*│\s*[\d,]+\s*│\s*([\d.]+e\d+)\s*│\s*([\d.]+e\d+)\s*│", output)
    return [(float(a), float(b), float(c)) for a, b, c in rows]


def test_cli_electra_small():
    out = _cli("--recipe", "electra-small")
    assert F.PAPER_CONVENTION in out and F.HARDWARE_CONVENTION in out
    assert "1.294e18" in out  # total, paper convention (official script, generator hidden 64)
    assert "3.677e9" in out  # inference per sequence
    assert f"{1.293743798272e18 / (128 * 128 * 1e6):.3e}".replace("e+0", "e") in out  # per token: 7.896e7
    rows = _fraction_rows(out)
    assert [r[0] for r in rows] == [6.25, 12.5, 25.0, 50.0, 100.0]
    assert [r[1] for r in rows] == pytest.approx([1.293743798272e18 * f for f in F.TABLE1_FRACTIONS], rel=1e-3)


def test_cli_paper_table1_with_gen128_and_steps():
    out = _cli("--recipe", "electra-small", "--set", "model.generator_fraction=0.5")
    assert "1.424e18" in out
    assert [float(f"{r[1]:.1e}") for r in _fraction_rows(out)] == [8.9e16, 1.8e17, 3.6e17, 7.1e17, 1.4e18]
    out = _cli("--recipe", "electra-small", "--steps", "62500", "--batch", "128", "--seq-len", "128")
    assert "8.086e16" in out  # 1/16 of 1.294e18


def test_cli_mlm_baseline():
    out = _cli("--recipe", "electra-small", "--set", "objective.kind=mlm", "--steps", "1450000")
    assert "1.419e18" in out  # the script's bert_small: 1.4187e18


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--recipe", "no-such-recipe"], "unknown recipe"),
        (["--recipe", "tiny", "--steps", "0"], "--steps"),
        (["--recipe", "tiny", "--batch", "-3"], "--batch"),
        (["--recipe", "tiny", "--seq-len", "4"], "seq_len"),
    ],
)
@pytest.mark.cli
def test_cli_bad_input_is_one_line_exit_2(args, needle):
    proc = subprocess.run([sys.executable, "-m", "tinyelectra", "flops", *args], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 2
    assert needle in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


@pytest.mark.parametrize("args,flag", [((0, None, None), "--steps"), ((None, -2, None), "--batch"),
                                       ((None, None, 0), "--seq-len")])
def test_flops_options_must_be_positive(args, flag):
    with pytest.raises(UserError, match=f"^{flag} must be a positive integer"):
        F.recipe_for_flops("tiny", *args, [])
    assert F.recipe_for_flops("tiny", 7, 3, 32, []).train.steps == 7
