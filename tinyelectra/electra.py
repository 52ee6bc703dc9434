"""Everything ELECTRA-specific: choosing and masking positions, sampling replacements, labels and losses;
plus BERT's masked-LM objective on the same encoder, so the paper's central comparison runs in one tool.

Shapes stay static by construction (torch.compile and CUDA graphs need that): every row gets N = int((p+0.005)*T)
prediction slots; how many of them are used follows the official code (round(p * non-pad tokens), at least 1, at
most N), and unused slots carry weight 0 instead of being removed. Losses are returned as *sums* with their
weights, so the trainer can normalise by the whole global batch (gradient accumulation and DDP then give exactly
the mathematics of one big batch). Nothing here synchronises with the host.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from tinyelectra.config import ObjectiveConfig
from tinyelectra.model import Electra
from tinyelectra.runtime import cpu_fast_path


# The sums a step or an evaluation accumulates (losses and metric counts), in one fixed order for all-reduce.
STAT_KEYS = ("mlm_sum", "disc_sum", "mlm_correct", "mlm_count", "disc_correct", "disc_count", "replaced", "predicted",
             "true_positive")


@dataclass(frozen=True)
class SpecialIds:
    pad: int
    cls: int
    sep: int
    mask: int

    @classmethod
    def from_tokenizer(cls, tok) -> "SpecialIds":
        return cls(pad=tok.pad_id, cls=tok.cls_id, sep=tok.sep_id, mask=tok.mask_id)


@dataclass
class Masked:
    """A batch after masking. N is the fixed number of slots per row."""

    input_ids: Tensor  # (B, T) the original tokens
    masked_ids: Tensor  # (B, T) the generator's input
    token_type_ids: Tensor  # (B, T)
    attention_mask: Tensor  # (B, T) bool, True = real token
    positions: Tensor  # (B, N) int64, distinct within a row
    targets: Tensor  # (B, N) the original tokens at `positions`
    weights: Tensor  # (B, N) float, 1 for slots in use, 0 otherwise
    # Every row is real tokens to its end (no padding), known on the host (no sync): the encoders then get no
    # attention mask, which is the same mathematics (an all-True mask adds 0 to every score) and lets SDPA choose
    # FlashAttention, which takes no mask. torch.compile guards on it: one graph per value, both compiled at start-up.
    full: bool = False

    @property
    def encoder_mask(self) -> Tensor | None:
        """The attention mask the encoders get: None for a batch without padding, else `attention_mask`."""
        return None if self.full else self.attention_mask

    @property
    def mlm_count(self) -> Tensor:
        return self.weights.sum()

    @property
    def token_count(self) -> Tensor:
        return self.attention_mask.sum()


@dataclass
class LossTerms:
    """Loss sums (divide by the global counts) and metric sums (reduce over processes, divide on log steps)."""

    mlm_sum: Tensor  # sum over used slots of the generator / MLM cross-entropy
    disc_sum: Tensor  # sum over real tokens of the discriminator BCE (0 for MLM)
    # sums: mlm_correct, mlm_count, disc_correct, disc_count, replaced, predicted, true_positive
    stats: dict[str, Tensor]


def mask_batch(
    input_ids: Tensor,
    token_type_ids: Tensor,
    attention_mask: Tensor,
    cfg: ObjectiveConfig,
    special: SpecialIds,
    vocab_size: int,
    generator: torch.Generator | None = None,
    full: bool = False,
) -> Masked:
    """Choose the prediction positions and corrupt them: [MASK] / random token / kept, per `cfg`'s fractions.
    `full`: the caller knows (on the host) that `attention_mask` is all True; see `Masked.full`."""
    B, T = input_ids.shape
    N = cfg.num_masked(T)
    dev = input_ids.device
    candidates = attention_mask & (input_ids != special.cls) & (input_ids != special.sep) & (input_ids != special.mask)
    # A uniformly random subset: random scores, non-candidates pushed below every candidate, keep the top N.
    scores = torch.rand(B, T, device=dev, generator=generator).masked_fill(~candidates, -1.0)
    top_scores, positions = scores.topk(N, dim=1)  # (B, N), in random order among candidates
    num_tokens = attention_mask.sum(1, keepdim=True).float()  # (B, 1) incl. [CLS]/[SEP], as the official code
    n_use = torch.round(num_tokens * cfg.mask_prob).clamp(1, N)  # official: max(1, min(N, round(n * p)))
    slot = torch.arange(N, device=dev).unsqueeze(0)  # (1, N)
    weights = ((slot < n_use) & (top_scores >= 0)).float()  # (B, N)
    targets = torch.gather(input_ids, 1, positions)  # (B, N)

    u = torch.rand(B, N, device=dev, generator=generator)
    random_tokens = torch.randint(0, vocab_size, (B, N), device=dev, generator=generator)
    new = torch.where(u < cfg.mask_token_fraction, torch.full_like(targets, special.mask), targets)
    new = torch.where((u >= cfg.mask_token_fraction) & (u < cfg.mask_token_fraction + cfg.random_token_fraction),
                      random_tokens, new)
    new = torch.where(weights > 0, new, targets)  # unused slots write the original token back
    masked_ids = input_ids.scatter(1, positions, new)
    return Masked(input_ids, masked_ids, token_type_ids, attention_mask, positions, targets, weights, full)


CDF_BLOCK = 128  # vocabulary entries per block of the inverse-CDF sampler's two-level search


@torch.no_grad()
def sample_tokens(logits: Tensor, temperature: float, generator: torch.Generator | None = None,
                  sampler: str = "auto") -> Tensor:
    """An exact sample from softmax(logits / t) along the last dimension, computed in fp32. No gradient.

    `sampler` (train.sampler): "gumbel-max", the official code's argmax(logits / t + Gumbel noise), one random number
    per vocabulary entry; "inverse-cdf" (`inverse_cdf_sample`), the same distribution with one random number per row;
    "auto", inverse CDF on the CPU outside torch.compile (torch's CPU generator is serial, ~4 ns a number: V = 30522
    numbers per masked slot cost more than the whole search, benchmarks/NOTES.md) and Gumbel-max elsewhere, until a
    card's A/B run (issue 33) shows which is faster there."""
    # fp16 Gumbel noise gives NaN/inf (the official code, fp32 only, never met it): always fp32 here
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    if sampler == "inverse-cdf" or (sampler == "auto" and cpu_fast_path(logits)):
        return inverse_cdf_sample(logits, generator)
    u = torch.rand(logits.shape, device=logits.device, generator=generator)
    gumbel = -torch.log(-torch.log(u + 1e-9) + 1e-9)  # the official code's epsilons
    return (logits + gumbel).argmax(-1)


def inverse_cdf_sample(logits: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """A sample from softmax(logits) along the last dimension with ONE uniform number per row: the first entry whose
    cumulative weight exceeds u x the total. Static shapes and no host sync (torch.compile and CUDA graphs take it).

    Two levels, so that no (rows, V) tensor is written (compiled, the weights live only inside the block sums'
    kernel) and fp32 keeps its precision: the unnormalised weights exp(x - max) are summed in blocks of CDF_BLOCK
    entries, the blocks' prefix sum (V / 128 entries) is fp64 and finds the block, then the fp32 prefix sum of that
    one block's recomputed weights finds the entry. A one-level fp32 prefix sum over V would round away up to
    ~V x 2^-25 of probability at its end; here only a block's own rounding is."""
    V = logits.shape[-1]
    x = logits.reshape(-1, V)  # (R, V)
    top = x.amax(-1, keepdim=True)  # (R, 1): weights exp(x - top) in (0, 1], softmax without its division
    full = V - V % CDF_BLOCK
    blocks = torch.exp(x[:, :full].reshape(x.shape[0], -1, CDF_BLOCK) - top.unsqueeze(-1)).sum(-1)  # (R, V // K)
    if full < V:
        blocks = torch.cat([blocks, torch.exp(x[:, full:] - top).sum(-1, keepdim=True)], 1)  # the shorter last block
    cdf = blocks.double().cumsum(-1)  # (R, nb)
    u = torch.rand(x.shape[0], 1, dtype=torch.float64, device=x.device, generator=generator) * cdf[:, -1:]  # (R, 1)
    b = torch.searchsorted(cdf, u, right=True).clamp_max_(cdf.shape[1] - 1)  # (R, 1): the block holding u
    rest = (u - cdf.gather(1, b) + blocks.gather(1, b).double()).float()  # u's offset into that block
    idx = b * CDF_BLOCK + torch.arange(CDF_BLOCK, device=x.device)  # (R, K)
    inner = torch.where(idx < V, torch.exp(x.gather(1, idx.clamp_max(V - 1)) - top), 0.0).cumsum(-1)  # (R, K)
    last = (inner < inner[:, -1:]).sum(-1, keepdim=True)  # the block's last entry of nonzero weight
    j = torch.minimum(torch.searchsorted(inner, rest, right=True), last)  # rounding never picks a zero-weight entry
    return (b * CDF_BLOCK + j).view(logits.shape[:-1])


def electra_terms(model: Electra, m: Masked, cfg: ObjectiveConfig, generator: torch.Generator | None = None,
                  capture: dict | None = None, sampler: str = "auto") -> LossTerms:
    """Generator MLM at the masked slots, sampled replacements (`sample_tokens`, `sampler` = train.sampler), then
    replaced-token detection on every token. `capture` (held-out diagnostics only) receives the discriminator's input
    ids, logits and labels, (B, T) each."""
    logits, mlm = mlm_terms(model, m)
    sampled = sample_tokens(logits.detach(), cfg.temperature, generator, sampler)  # (B, N)
    sampled = torch.where(m.weights > 0, sampled, m.targets)
    fake_ids = m.input_ids.scatter(1, m.positions, sampled)  # (B, T)
    labels = (fake_ids != m.input_ids).float()  # a sample equal to the original is "original"
    disc_logits = model.discriminator_logits(fake_ids, m.token_type_ids, m.encoder_mask).float()  # (B, T)
    tok_w = m.attention_mask.float()
    if capture is not None:
        capture["disc_ids"], capture["disc_logits"], capture["disc_labels"] = fake_ids, disc_logits.detach(), labels
    bce = F.binary_cross_entropy_with_logits(disc_logits, labels, reduction="none")
    disc_sum = (bce * tok_w).sum()

    with torch.no_grad():
        pred = (disc_logits > 0).float()
        stats = {
            **mlm.stats,
            "disc_correct": ((pred == labels).float() * tok_w).sum(),
            "disc_count": tok_w.sum(),
            "replaced": (labels * tok_w).sum(),
            "predicted": (pred * tok_w).sum(),
            "true_positive": (pred * labels * tok_w).sum(),
        }
    return LossTerms(mlm_sum=mlm.mlm_sum, disc_sum=disc_sum, stats=stats)


def mlm_terms(model: Electra, m: Masked) -> tuple[Tensor, LossTerms]:
    """The (B, N, V) logits and BERT's objective: cross-entropy of the MLM head at the masked slots (the generator's
    in ELECTRA, the full-size encoder's in the MLM baseline)."""
    logits = model.generator_logits(m.masked_ids, m.token_type_ids, m.encoder_mask, m.positions).float()  # (B, N, V)
    ce = F.cross_entropy(logits.flatten(0, 1), m.targets.flatten(), reduction="none").view_as(m.weights)  # (B, N)
    with torch.no_grad():
        stats = {"mlm_correct": ((logits.argmax(-1) == m.targets).float() * m.weights).sum(),
                 "mlm_count": m.weights.sum()}
    return logits, LossTerms(mlm_sum=(ce * m.weights).sum(), disc_sum=ce.new_zeros(()), stats=stats)


def loss_terms(model: Electra, m: Masked, cfg: ObjectiveConfig, generator: torch.Generator | None = None,
               capture: dict | None = None, sampler: str = "auto") -> LossTerms:
    if cfg.kind == "electra":
        return electra_terms(model, m, cfg, generator, capture, sampler)
    return mlm_terms(model, m)[1]


def combine(terms: LossTerms, cfg: ObjectiveConfig, mlm_count: Tensor, token_count: Tensor) -> Tensor:
    """The paper's loss for this slice of the batch: MLM mean + lambda * RTD mean, with the means taken over the
    *global* batch (`mlm_count`, `token_count` summed over all micro-batches and processes)."""
    loss = terms.mlm_sum / mlm_count.clamp_min(1)
    if cfg.kind == "electra":
        loss = loss + cfg.disc_weight * terms.disc_sum / token_count.clamp_min(1)
    return loss


def summarize(stats: dict[str, float]) -> dict[str, float]:
    """Turn metric sums (already reduced, on the host) into the logged rates."""
    out: dict[str, float] = {}
    if stats.get("mlm_count"):
        out["gen_acc"] = stats["mlm_correct"] / stats["mlm_count"]
    if stats.get("disc_count"):
        out["disc_acc"] = stats["disc_correct"] / stats["disc_count"]
        out["replaced_frac"] = stats["replaced"] / stats["disc_count"]
        out["disc_precision"] = stats["true_positive"] / stats["predicted"] if stats["predicted"] else 0.0
        out["disc_recall"] = stats["true_positive"] / stats["replaced"] if stats["replaced"] else 0.0
    return out
