"""The ELECTRA objective (electra.py): masking counts and corruption rates, sampling (Gumbel-max and inverse CDF),
labels, losses in fp32 and bf16, overfitting one batch, and the micro-batch loss arithmetic.

Reference numbers: N = int((0.15 + 0.005) * 128) = 19 and round(0.15 * tokens) per short row (official
pretrain_helpers.py), 85/15 (ELECTRA) and 80/10/10 (BERT) corruption, softmax probabilities (Gumbel-max).
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from scipy.stats import chi2

from tinyelectra.config import ModelConfig, ObjectiveConfig
from tinyelectra.electra import SpecialIds, combine, electra_terms, loss_terms, mask_batch, sample_tokens
from tinyelectra.model import Electra
from tinyelectra.optim import PaperAdam

SPECIAL = SpecialIds(pad=0, cls=101, sep=102, mask=103)
ELECTRA = ObjectiveConfig()
BERT = ObjectiveConfig(kind="mlm", mask_token_fraction=0.8, random_token_fraction=0.1)
TINY = ModelConfig(vocab_size=200, embedding_size=16, hidden_size=32, num_layers=2, num_heads=4, ffn_size=64,
                   max_positions=128, generator_fraction=0.5, dropout=0.0, attention_dropout=0.0)


pytestmark = pytest.mark.usefixtures("one_thread")


def pretraining_batch(B: int, T: int, V: int, seed: int, full_rows: int):
    """Rows as the data builder writes them: [CLS] A [SEP] B [SEP] then [PAD]; the first `full_rows` rows fill T.
    Short-row lengths avoid 0.15 * n ending in .5, where float32 and float64 rounding could disagree."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(104, V, (B, T), generator=g)
    lengths = []
    while len(lengths) < B - full_rows:
        n = int(torch.randint(5, T, (1,), generator=g))
        if n % 20 != 10:
            lengths.append(n)
    lengths = [T] * full_rows + lengths
    mask = torch.zeros(B, T, dtype=torch.bool)
    types = torch.zeros(B, T, dtype=torch.long)
    for b, n in enumerate(lengths):
        cut = max(2, n // 2)
        ids[b, 0], ids[b, cut - 1], ids[b, n - 1] = SPECIAL.cls, SPECIAL.sep, SPECIAL.sep
        ids[b, n:] = SPECIAL.pad
        mask[b, :n] = True
        types[b, cut:n] = 1
    # A literal [MASK] already in the text must not be chosen either.
    ids[full_rows:, 3] = torch.where(mask[full_rows:, 3] & (ids[full_rows:, 3] != SPECIAL.sep), SPECIAL.mask,
                                     ids[full_rows:, 3])
    return ids, types, mask, torch.tensor(lengths)


def test_fixed_slot_count():
    assert ELECTRA.num_masked(128) == 19  # int(0.155 * 128) = int(19.84)
    assert ELECTRA.num_masked(512) == 79  # int(79.36)


def test_masking_counts_and_never_touches_specials_or_padding():
    B, T, V = 256, 128, 1000
    ids, types, mask, lengths = pretraining_batch(B, T, V, seed=0, full_rows=64)
    m = mask_batch(ids, types, mask, ELECTRA, SPECIAL, V, generator=torch.Generator().manual_seed(1))
    assert m.positions.shape == (B, 19) and m.weights.shape == (B, 19)
    used = m.weights > 0
    at = torch.gather(ids, 1, m.positions)
    special = (at == SPECIAL.cls) | (at == SPECIAL.sep) | (at == SPECIAL.mask) | (at == SPECIAL.pad)
    assert not (special & used).any()
    assert torch.gather(mask, 1, m.positions)[used].all()
    # Exactly N slots on full rows; round(0.15 * tokens), within [1, N], on short rows (official code).
    expected = torch.tensor([min(19, max(1, round(0.15 * int(n)))) for n in lengths])
    assert torch.equal(m.weights.sum(1).long(), expected)
    assert (m.weights.sum(1)[:64] == 19).all()
    # Used positions are distinct in a row; tokens change only at used positions; targets are the originals.
    for b in range(B):
        p = m.positions[b][used[b]]
        assert p.unique().numel() == p.numel()
    changed = m.masked_ids != ids
    slot_mask = torch.zeros_like(mask).scatter(1, m.positions, used)
    assert not (changed & ~slot_mask).any()
    assert torch.equal(m.targets, at)


def test_positions_are_uniform_over_candidates():
    B, T = 4000, 32
    ids = torch.randint(104, 500, (B, T))
    ids[:, 0], ids[:, -1] = SPECIAL.cls, SPECIAL.sep
    mask = torch.ones(B, T, dtype=torch.bool)
    m = mask_batch(ids, torch.zeros_like(ids), mask, ELECTRA, SPECIAL, 500, generator=torch.Generator().manual_seed(2))
    counts = torch.zeros(T).index_add_(0, m.positions[m.weights > 0], torch.ones(int(m.weights.sum())))
    assert counts[0] == 0 and counts[-1] == 0
    inner = counts[1:-1]
    expected = inner.sum() / inner.numel()
    stat = float(((inner - expected) ** 2 / expected).sum())
    assert chi2.sf(stat, inner.numel() - 1) > 1e-4


@pytest.mark.parametrize("cfg,mask_rate,random_rate", [(ELECTRA, 0.85, 0.0), (BERT, 0.8, 0.1)])
def test_corruption_rates(cfg, mask_rate, random_rate):
    B, T, V = 1024, 128, 30000
    ids, types, mask, _ = pretraining_batch(B, T, V, seed=3, full_rows=B)
    m = mask_batch(ids, types, mask, cfg, SPECIAL, V, generator=torch.Generator().manual_seed(4))
    used = m.weights > 0
    new = torch.gather(m.masked_ids, 1, m.positions)[used]
    orig = m.targets[used]
    n = new.numel()  # 1024 * 19 = 19456 slots: a binomial share has sd <= 0.0036
    share_mask = (new == SPECIAL.mask).float().mean().item()
    share_kept = (new == orig).float().mean().item()
    share_random = ((new != orig) & (new != SPECIAL.mask)).float().mean().item()
    assert n == B * 19
    assert abs(share_mask - mask_rate) < 0.02
    assert abs(share_random - random_rate) < 0.02
    assert abs(share_kept - (1 - mask_rate - random_rate)) < 0.02


def chi_square(counts: torch.Tensor, p: torch.Tensor) -> float:
    """Pearson's statistic of `counts` against probabilities `p` (entries of p > 0)."""
    n = counts.sum()
    return float(((counts - n * p) ** 2 / (n * p)).sum())


@pytest.mark.parametrize("sampler", ["gumbel-max", "inverse-cdf"])
def test_sampling_matches_softmax(sampler):
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])
    n = 200_000
    for temperature in (1.0, 2.0):
        draws = sample_tokens(logits.expand(n, -1), temperature, torch.Generator().manual_seed(5), sampler)
        counts = torch.bincount(draws, minlength=6).double()
        p = torch.softmax(logits.double() / temperature, -1)
        assert chi2.sf(chi_square(counts, p), 5) > 1e-4, (temperature, counts / n, p)
    # Control: the statistic does notice a wrong temperature.
    draws = sample_tokens(logits.expand(n, -1), 1.0, torch.Generator().manual_seed(6), sampler)
    counts = torch.bincount(draws, minlength=6).double()
    assert chi2.sf(chi_square(counts, torch.softmax(logits.double() / 1.2, -1)), 5) < 1e-6


def test_inverse_cdf_over_blocks_matches_softmax_and_the_gumbel_max_sampler():
    """V = 300 spans two full blocks of electra.CDF_BLOCK (128) and a short one (44): the two-level search against
    the softmax (Pearson's chi-square over 300 cells) and against today's Gumbel-max draws (the chi-square test of
    homogeneity of the two count tables); each statistic's control is a softmax at another temperature."""
    V, n = 300, 150_000
    logits = torch.randn(V, generator=torch.Generator().manual_seed(0))  # probabilities from ~1.5e-4 to ~0.06
    p = torch.softmax(logits.double(), -1)
    inv = torch.bincount(sample_tokens(logits.expand(n, -1), 1.0, torch.Generator().manual_seed(1), "inverse-cdf"),
                         minlength=V).double()
    gum = torch.bincount(sample_tokens(logits.expand(n, -1), 1.0, torch.Generator().manual_seed(2), "gumbel-max"),
                         minlength=V).double()
    assert chi2.sf(chi_square(inv, p), V - 1) > 1e-4
    both = torch.stack([inv, gum])  # (2, V) contingency table, equal row totals
    expected = both.sum(0, keepdim=True) / 2
    assert chi2.sf(float(((both - expected) ** 2 / expected).sum()), V - 1) > 1e-4
    warmer = torch.bincount(sample_tokens(logits.expand(n, -1), 1.1, torch.Generator().manual_seed(2), "gumbel-max"),
                            minlength=V).double()
    assert chi2.sf(chi_square(inv, torch.softmax(logits.double() / 1.1, -1)), V - 1) < 1e-6
    other = torch.stack([inv, warmer])
    expected = other.sum(0, keepdim=True) / 2
    assert chi2.sf(float(((other - expected) ** 2 / expected).sum()), V - 1) < 1e-6


def test_inverse_cdf_never_draws_an_impossible_token():
    """Entries of probability 0 (logit -inf) beside the blocks' edges, in the short last block, and a row whose only
    possible token is the vocabulary's last: never drawn, and the possible ones all are."""
    V, n = 300, 20_000
    logits = torch.full((3, V), float("-inf"))
    allowed = [torch.tensor([127, 128, 255, 256]), torch.tensor([0, 299]), torch.tensor([299])]
    for row, ids in zip(logits, allowed):
        row[ids] = torch.tensor([0.0, 5.0, -2.0, 1.0][: len(ids)])
    draws = sample_tokens(logits.repeat(n, 1), 1.0, torch.Generator().manual_seed(3), "inverse-cdf").view(n, 3)
    for r, ids in enumerate(allowed):
        assert set(draws[:, r].unique().tolist()) == set(ids.tolist()), r


def test_inverse_cdf_sampler_compiles_whole():
    """No graph break (fullgraph) and the same draws as eager from the same seed (aot_eager runs torch's own random
    operators): the sampler runs inside a compiled step and its CUDA graph."""
    logits = torch.randn(4, 7, 300, generator=torch.Generator().manual_seed(4)) * 2
    compiled = torch.compile(lambda x: sample_tokens(x, 1.0, None, "inverse-cdf"), fullgraph=True, backend="aot_eager")
    torch.manual_seed(11)
    eager = sample_tokens(logits, 1.0, None, "inverse-cdf")
    torch.manual_seed(11)
    assert torch.equal(compiled(logits), eager) and eager.shape == (4, 7)


def _constant_text_batch(B: int, T: int, token: int):
    ids = torch.full((B, T), token)
    ids[:, 0], ids[:, -1] = SPECIAL.cls, SPECIAL.sep
    return ids, torch.zeros_like(ids), torch.ones(B, T, dtype=torch.bool)


@pytest.mark.parametrize("sampler", ["gumbel-max", "inverse-cdf"])
@pytest.mark.parametrize("favoured,replaced", [(150, False), (151, True)])
def test_sampled_original_is_labelled_original(favoured, replaced, sampler):
    """Text made of token 150; a generator forced (through its output bias) to always sample `favoured`."""
    torch.manual_seed(0)
    model = Electra(TINY).eval()
    with torch.no_grad():
        model.gen_head.bias.fill_(-1e4)
        model.gen_head.bias[favoured] = 1e4
    ids, types, mask = _constant_text_batch(8, 64, 150)
    m = mask_batch(ids, types, mask, ELECTRA, SPECIAL, TINY.vocab_size, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        terms = electra_terms(model, m, ELECTRA, generator=torch.Generator().manual_seed(8), sampler=sampler)
    n_used = int(m.weights.sum())
    assert n_used == 8 * min(ELECTRA.num_masked(64), round(0.15 * 64))
    assert int(terms.stats["replaced"]) == (n_used if replaced else 0)


def _tiny_setup(seed=0):
    torch.manual_seed(seed)
    model = Electra(TINY)
    ids, types, mask, _ = pretraining_batch(8, 64, TINY.vocab_size, seed=seed, full_rows=4)
    return model, ids, types, mask


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("cfg", [ELECTRA, BERT])
def test_losses_finite(dtype, cfg):
    model, ids, types, mask = _tiny_setup()
    model.train()
    m = mask_batch(ids, types, mask, cfg, SPECIAL, TINY.vocab_size, generator=torch.Generator().manual_seed(9))
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
        terms = loss_terms(Electra(TINY, objective=cfg.kind) if cfg.kind == "mlm" else model, m, cfg,
                           torch.Generator().manual_seed(10))
        loss = combine(terms, cfg, m.mlm_count, m.token_count)
    assert torch.isfinite(loss) and loss.dtype == torch.float32
    assert torch.isfinite(terms.mlm_sum) and torch.isfinite(terms.disc_sum)
    if cfg.kind == "electra":
        assert terms.disc_sum > 0
    loss.backward()


@pytest.mark.slow
def test_tiny_model_overfits_one_batch():
    """Same batch, same masking, same sampling noise every step: the discriminator loss must fall by >= 90%."""
    model, ids, types, mask = _tiny_setup(seed=1)
    model.train()
    opt = PaperAdam(model.parameters(), lr=3e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0, fused=False)
    disc_means = []
    for _ in range(150):
        m = mask_batch(ids, types, mask, ELECTRA, SPECIAL, TINY.vocab_size, generator=torch.Generator().manual_seed(11))
        terms = electra_terms(model, m, ELECTRA, generator=torch.Generator().manual_seed(12))
        loss = combine(terms, ELECTRA, m.mlm_count, m.token_count)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        disc_means.append(float(terms.disc_sum.detach() / m.token_count))
    assert disc_means[-1] <= 0.1 * disc_means[0], (disc_means[0], disc_means[-1])
    # The generator also learns this batch, so fewer tokens end up replaced; the discriminator must still beat the
    # best constant guess (the entropy of the replaced share), i.e. it learned which tokens, not just how many.
    p = float(terms.stats["replaced"] / terms.stats["disc_count"])
    assert 0 < p < 0.5, p  # with these seeds some sampled tokens still differ from the originals
    constant_bce = -(p * math.log(p) + (1 - p) * math.log(1 - p))
    assert disc_means[-1] < constant_bce, (disc_means[-1], p, constant_bce)


def test_combine_over_micro_batches_equals_one_batch():
    """Two halves normalised by the global counts give the one-batch loss and the one-batch gradients."""
    cfg = dataclasses.replace(ELECTRA, temperature=1e-4)  # near-argmax sampling: both runs sample the same tokens
    model, ids, types, mask = _tiny_setup(seed=2)
    model.train()
    m = mask_batch(ids, types, mask, cfg, SPECIAL, TINY.vocab_size, generator=torch.Generator().manual_seed(13))
    full = combine(electra_terms(model, m, cfg), cfg, m.mlm_count, m.token_count)
    full.backward()
    want = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    total = torch.zeros(())
    for half in (slice(0, 3), slice(3, 8)):  # unequal halves: a per-half mean would be wrong
        part = dataclasses.replace(m, **{f.name: getattr(m, f.name)[half] for f in dataclasses.fields(m)
                                         if f.name != "full"})
        loss = combine(electra_terms(model, part, cfg), cfg, m.mlm_count, m.token_count)
        loss.backward()
        total = total + loss.detach()
    assert torch.allclose(total, full.detach(), rtol=1e-5)
    for w, p in zip(want, model.parameters()):
        assert torch.allclose(p.grad, w, rtol=1e-4, atol=1e-7)
