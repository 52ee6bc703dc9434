"""What a pre-training checkpoint has learned, measured on held-out rows against the baselines it must beat.

- Discriminator (ELECTRA): accuracy beside its all-"original" prior (the accuracy of never answering "replaced"),
  ROC-AUC of its replaced-token scores (0.5 = chance, independent of the decision threshold), precision and recall
  of the "replaced" answer.
- Context (ELECTRA): the discriminator's ROC-AUC when the same slots hold words drawn from the training rows' unigram
  distribution instead of the generator's samples (`disc_auc_context`).
- Identity-matched AUCs, the two numbers word frequency cannot fool: replaced tokens ranked only against original
  occurrences of the same token id (special tokens left out), on unigram draws (`disc_auc_context_matched`: context
  and nothing else) and on the generator's own fakes (`disc_auc_matched`). One number per side: the probability that
  a replaced occurrence outscores an original occurrence of the same id (the per-id AUCs weighted by their pair
  counts, metrics.roc_auc with groups). Why the raw AUCs are not enough: a discriminator that scores token identity
  alone ranks above chance on both, since [CLS]/[SEP] are never replaced, a draw equal to the original counts as
  "original" (more often for frequent words), and a weak generator's samples are rare words; on the matched AUCs such
  a scorer gets exactly 0.5 (tests/test_diagnostics.py).
- Generator (ELECTRA) or masked LM (BERT baseline): accuracy at the masked slots beside the unigram baseline (always
  answering the most frequent word of the training rows).
- A verdict in words: which learning the checkpoint shows, if any: frequency cues, context through the generator,
  context in the discriminator (`verdict`). The trainer prints it at every checkpoint, the report repeats it, so
  nobody fine-tunes a discriminator that has learned nothing, or only word frequencies, unawares.

The held-out rows, their masks and the generator's samples are the same at every checkpoint of a run (fixed seeds).
What does not live here: the training loop (train.py), GLUE (glue.py).
"""

from __future__ import annotations

import numpy as np
import torch

from tinyelectra.config import Recipe
from tinyelectra.data import MIN_HELDOUT_ROWS
from tinyelectra.electra import STAT_KEYS, SpecialIds, loss_terms, mask_batch, summarize
from tinyelectra.metrics import roc_auc

UNIGRAM_SAMPLE_ROWS = 20_000  # training rows counted for the unigram baseline (~2.5M tokens at T = 128)
DISC_MARGIN = 0.01  # a discriminator has "left its prior" when its accuracy beats all-"original" by this much
MLM_MARGIN = 0.02  # a generator / masked LM has "left the unigram level" when it beats it by this much
# a discriminator "uses context" when its matched AUC on unigram draws reaches this, above the 0.46-0.53 measured
# without context (benchmarks/lab/README.md)
CONTEXT_AUC = 0.55


def unigram_distribution(data, special: SpecialIds, rows: int = UNIGRAM_SAMPLE_ROWS) -> torch.Tensor:
    """(V,) float32: the word frequencies of the first `rows` training rows ([CLS], [SEP], [MASK], padding excluded)."""
    n = min(rows, data.num_rows("train"))
    ids = data.batch("train", np.arange(n)).input_ids.numpy().ravel()
    counts = np.bincount(ids, minlength=data.vocab_size).astype(np.float64)
    counts[[special.pad, special.cls, special.sep, special.mask]] = 0
    return torch.from_numpy(counts / counts.sum()).float()


@torch.no_grad()
def evaluate(model, data, recipe: Recipe, special: SpecialIds, device: torch.device, autocast, micro: int,
             unigram: torch.Tensor | None = None) -> dict:
    """The first `train.eval_rows` held-out rows with fixed masks and samples: the metrics above. `unigram` is the
    training rows' word distribution (`unigram_distribution`; computed here when not given)."""
    rows = min(recipe.train.eval_rows, data.num_rows("validation"))
    if rows == 0:
        return {}
    if unigram is None:
        unigram = unigram_distribution(data, special)
    top_token = int(unigram.argmax())
    was_training = model.training
    model.eval()
    rng_state = torch.get_rng_state()
    sums = {k: 0.0 for k in STAT_KEYS}
    unigram_correct = 0.0
    specials = torch.tensor([special.pad, special.cls, special.sep, special.mask], device=device)
    generator_side, context_side = Ranked(specials), Ranked(specials)  # scores on the generator's / unigram fakes
    capture: dict = {}
    for start in range(0, rows, micro):
        b = data.batch("validation", np.arange(start, min(start + micro, rows))).to(device)
        torch.manual_seed(start)
        m = mask_batch(b.input_ids, b.token_type_ids, b.attention_mask, recipe.objective, special,
                       recipe.model.vocab_size)
        with autocast:
            t = loss_terms(model, m, recipe.objective, capture=capture)
        sums["mlm_sum"] += t.mlm_sum.item()
        sums["disc_sum"] += t.disc_sum.item()
        for k, v in t.stats.items():
            sums[k] += v.item()
        unigram_correct += float(((m.targets == top_token).float() * m.weights).sum())
        if "disc_logits" in capture:
            real = m.attention_mask
            generator_side.add(capture["disc_logits"], capture["disc_labels"], capture["disc_ids"], real)
            # the same slots filled with unigram draws (fixed per row block): what context alone can detect
            drawn = torch.multinomial(unigram, m.positions.numel(), replacement=True,
                                      generator=torch.Generator().manual_seed(start)).view(m.positions.shape).to(device)
            drawn = torch.where(m.weights > 0, drawn, m.targets)
            fake = m.input_ids.scatter(1, m.positions, drawn)  # (B, T)
            with autocast:
                logits = model.discriminator_logits(fake, m.token_type_ids, m.attention_mask)
            context_side.add(logits, fake != m.input_ids, fake, real)
    torch.set_rng_state(rng_state)
    model.train(was_training)
    out = {"rows": rows, "gen_loss": sums["mlm_sum"] / max(sums["mlm_count"], 1.0), **summarize(sums)}
    out["unigram_acc"] = unigram_correct / max(sums["mlm_count"], 1.0)
    if sums["disc_count"]:
        out["disc_loss"] = sums["disc_sum"] / sums["disc_count"]
        out["baseline_acc"] = 1.0 - out["replaced_frac"]  # always answering "original"
        out["disc_auc"], out["disc_auc_matched"] = generator_side.aucs()
        out["disc_auc_context"], out["disc_auc_context_matched"] = context_side.aucs()
    out.update(verdict(out))
    return out


class Ranked:
    """The discriminator's held-out scores on one kind of fake, gathered batch by batch, and their two AUCs."""

    def __init__(self, specials: torch.Tensor) -> None:
        self.specials = specials  # ids the matched AUC leaves out ([CLS], [SEP] are never replaced)
        self.parts: list[tuple[np.ndarray, ...]] = []

    def add(self, logits, labels, ids, real) -> None:
        """(B, T) each: scores, replaced?, the token ids the discriminator saw, real tokens."""
        words = ~torch.isin(ids[real], self.specials)
        self.parts.append(tuple(x.cpu().numpy() for x in (logits[real].float(), labels[real], ids[real], words)))

    def aucs(self) -> tuple[float, float]:
        """(raw AUC over every real token, AUC matched by token id over the words)."""
        scores, labels, ids, words = (np.concatenate(column) for column in zip(*self.parts))
        return roc_auc(scores, labels), roc_auc(scores[words], labels[words], ids[words])


def verdict(ev: dict) -> dict:
    """learned (bool), learning (the kinds seen, in words) and verdict (one line) for an `evaluate` result. Three kinds,
    each from the number that shows it: frequency cues (the discriminator beats its all-original prior: it spots a weak
    generator's odd words, which token identity alone gives away), context through the generator (its masked-word
    accuracy beats the unigram answer) and context in the discriminator (its matched AUC on unigram draws). A masked LM
    is judged by its predictions. Warns when the held-out rows are too few for the numbers to mean much."""
    if "gen_acc" not in ev:
        return {"learned": False, "learning": "nothing to judge", "verdict": "no held-out rows to judge"}
    electra = "disc_acc" in ev
    context = ev["gen_acc"] - ev["unigram_acc"] >= MLM_MARGIN
    seen = [f"context{' through the generator' if electra else ''}"] if context else []
    clauses = [f"the {'generator' if electra else 'masked LM'} "
               f"{'predicts masked words from their context' if context else 'is not above the unigram answer'}: "
               f"masked-word accuracy {ev['gen_acc']:.4f} vs {ev['unigram_acc']:.4f} for the unigram answer "
               f"({ev['gen_acc'] / max(ev['unigram_acc'], 1e-9):.2f}x)"]
    if electra:
        gain = ev["disc_acc"] - ev["baseline_acc"]
        disc = (f"accuracy {gain:+.4f} over all-original, AUC {ev['disc_auc']:.3f}; matched by token id "
                f"{ev['disc_auc_matched']:.3f}, on unigram draws {ev['disc_auc_context_matched']:.3f}")
        if ev["disc_auc_context_matched"] >= CONTEXT_AUC:
            seen.insert(0, "context in the discriminator")
            disc = f"the discriminator ranks replaced words above the same words in place ({disc})"
        elif gain >= DISC_MARGIN:
            seen.insert(0, "frequency cues")
            disc = f"the discriminator spots its generator's odd words by their identity, no context yet ({disc})"
        elif gain <= -DISC_MARGIN:
            disc = f"the discriminator is below its all-original prior, still answering \"replaced\" too often ({disc})"
        else:
            disc = f"the discriminator is at its all-original prior, no context ({disc})"
        clauses.insert(0, disc)
    text = f"learned {' and '.join(seen)}" if seen else "NOT LEARNED YET"
    text += ": " + "; ".join(clauses)
    if not seen:
        text += "; fine-tuning this checkpoint measures little more than a random encoder"
    if ev["rows"] < MIN_HELDOUT_ROWS:
        text += (f" (only {ev['rows']} held-out rows: too few for these numbers to mean much; hold out more text with "
                 "prepare's --validation-fraction)")
    return {"learned": bool(seen), "learning": ", ".join(seen) or "nothing yet", "verdict": text}


def checkpoint_line(name: str, ev: dict) -> str:
    """The line the trainer prints after writing a checkpoint (without held-out rows: only that it was written; the
    trainer said once at start-up why it is not evaluated)."""
    return f"{name}: {ev['verdict']}" if ev else f"{name}: written (not evaluated)"
