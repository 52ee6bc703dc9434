"""Gradient parity with transformers (issue 9): one pre-training step on the same weights and the same batch gives
tinyelectra's generator + discriminator the gradients that transformers' ElectraForMaskedLM + ElectraForPreTraining
get when wired the official way — one embedding module shared by both, the generator's output layer tied to the word
embeddings, loss = the generator's own MLM loss + 50 x the discriminator's own replaced-token loss (each computed by
transformers from labels, not by our code).

Forward parity is tested in test_hf.py; a wrong gradient path (a detach, a broken tie, a custom backward with a bug —
the CPU's fp32 linear layers run through our own autograd function) would only show here. The reference gradients
come from transformers' modules and losses; only the masked positions and the generator's samples are taken from
our step (recorded), so both sides see the same corrupted batch.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tinyelectra import electra, hf
from tinyelectra.config import ModelConfig, ObjectiveConfig
from tinyelectra.electra import SpecialIds, combine, electra_terms, mask_batch
from tinyelectra.model import Electra

transformers = pytest.importorskip("transformers")

SPECIAL = SpecialIds(pad=0, cls=101, sep=102, mask=103)
OBJECTIVE = ObjectiveConfig()  # the paper's: 85% [MASK] / 15% kept, lambda = 50
REL_TOL = 1e-5  # issue 9: gradients equal to ~1e-5 relative (fp32)
# Dropout off on both sides: identical masks cannot be drawn by two implementations; everything else is training mode.
SMALLISH = ModelConfig(vocab_size=211, embedding_size=24, hidden_size=48, num_layers=2, num_heads=4, ffn_size=96,
                       max_positions=64, generator_fraction=0.5, dropout=0.0, attention_dropout=0.0)


pytestmark = pytest.mark.usefixtures("one_thread")


def pretraining_batch(V: int, B: int = 6, T: int = 40, seed: int = 0):
    """[CLS] A [SEP] B [SEP] [PAD]..., rows of different lengths (row 0 full)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(104, V, (B, T), generator=g)
    lengths = [T] + [int(x) for x in torch.randint(T // 3, T, (B - 1,), generator=g)]
    mask = torch.zeros(B, T, dtype=torch.bool)
    types = torch.zeros(B, T, dtype=torch.long)
    for b, n in enumerate(lengths):
        ids[b, 0], ids[b, n // 2], ids[b, n - 1] = SPECIAL.cls, SPECIAL.sep, SPECIAL.sep
        ids[b, n:] = SPECIAL.pad
        mask[b, :n] = True
        types[b, n // 2 + 1 : n] = 1
    return ids, types, mask


def randomize(module: torch.nn.Module, seed: int) -> None:
    """Non-trivial values everywhere (zero biases and unit LayerNorms would hide mapping bugs)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)


def our_step(model: Electra, ids, types, mask, monkeypatch):
    """One step of tinyelectra's objective; returns the masking and the generator's (recorded) samples."""
    recorded = {}
    real_sample = electra.sample_tokens

    def recording_sample(logits, temperature, generator=None, sampler="auto"):
        recorded["sampled"] = real_sample(logits, temperature, generator, sampler)
        return recorded["sampled"]

    monkeypatch.setattr(electra, "sample_tokens", recording_sample)
    m = mask_batch(ids, types, mask, OBJECTIVE, SPECIAL, model.cfg.vocab_size,
                   generator=torch.Generator().manual_seed(5))
    model.train()
    model.zero_grad(set_to_none=True)
    terms = electra_terms(model, m, OBJECTIVE, generator=torch.Generator().manual_seed(6))
    loss = combine(terms, OBJECTIVE, m.mlm_count, m.token_count)
    loss.backward()
    sampled = torch.where(m.weights > 0, recorded["sampled"], m.targets)
    fake_ids = m.input_ids.scatter(1, m.positions, sampled)
    return m, fake_ids, loss.detach()


def official_pair(model: Electra):
    """transformers' generator and discriminator holding `model`'s weights, wired as the official code: the
    generator reads the discriminator's embedding module (token, position, type embeddings and their LayerNorm),
    and its output layer is the word-embedding matrix itself. Untied (sharing "none"): the generator keeps embeddings
    of its own, at its own width, and its output layer is tied to those."""
    disc = hf.to_hf_discriminator(model).train()
    gen = hf.to_hf_generator(model).train()
    if model.cfg.sharing == "embeddings":
        gen.electra.embeddings = disc.electra.embeddings  # one module, as the official code's shared variable scope
    gen.generator_lm_head.weight = gen.electra.embeddings.word_embeddings.weight  # tied output layer
    return gen, disc


def official_step(gen, disc, m, fake_ids):
    """The official wiring's loss, computed by transformers from labels: MLM mean over the used slots (labels -100
    elsewhere) + 50 x BCE mean over the real tokens (transformers' ElectraForPreTraining loss)."""
    mlm_labels = torch.full_like(m.input_ids, -100)
    used = m.weights > 0
    mlm_labels.scatter_(1, torch.where(used, m.positions, 0), torch.where(used, m.targets, -100))
    mlm_labels[:, 0] = -100  # position 0 ([CLS]) is never a candidate; unused slots were pointed there
    g = gen(input_ids=m.masked_ids, token_type_ids=m.token_type_ids, attention_mask=m.attention_mask.long(),
            labels=mlm_labels)
    rtd_labels = (fake_ids != m.input_ids).long()
    d = disc(input_ids=fake_ids, token_type_ids=m.token_type_ids, attention_mask=m.attention_mask.long(),
             labels=rtd_labels)
    loss = g.loss + OBJECTIVE.disc_weight * d.loss
    loss.backward()
    return loss.detach()


def grads_as_hf(model: Electra) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Our gradients under transformers' names: a copy of the model whose parameters hold the gradients, converted
    with the same mapping as the weights (fused qkv split, names renamed)."""
    shadow = Electra(model.cfg, model.objective)
    with torch.no_grad():
        for (_, p), (_, q) in zip(model.named_parameters(), shadow.named_parameters()):
            q.copy_(p.grad if p.grad is not None else torch.zeros_like(p))
    return hf.discriminator_to_hf(shadow), hf.generator_to_hf(shadow)


def relative_errors(ours: dict[str, torch.Tensor], module: torch.nn.Module) -> dict[str, float]:
    """||ours - theirs|| / ||theirs|| per parameter. The attention key bias is the exception: softmax is invariant to
    a score shift that is the same for every key, so its true gradient is 0 and both sides hold rounding noise
    (~1e-10); there the error is taken relative to the whole model's gradient norm."""
    total = torch.stack([p.grad.norm() for p in module.parameters() if p.grad is not None]).norm().item()
    out = {}
    for name, p in module.named_parameters():
        ref = p.grad if p.grad is not None else torch.zeros_like(p)
        diff = (ours[name] - ref).norm().item()
        out[name] = diff / (total if name.endswith("attention.self.key.bias") else max(ref.norm().item(), 1e-12))
    return out


@pytest.mark.parametrize("cfg", [SMALLISH, dataclasses.replace(SMALLISH, embedding_size=48),
                                 dataclasses.replace(SMALLISH, sharing="none")], ids=["E<H", "E=H", "untied"])
def test_pretraining_gradients_equal_transformers(cfg, monkeypatch):
    torch.manual_seed(0)
    model = Electra(cfg)
    randomize(model, 1)
    ids, types, mask = pretraining_batch(cfg.vocab_size)
    ids = torch.where(ids >= 104, 104 + ids % 8, ids)  # few distinct words, and the generator favours them:
    with torch.no_grad():  # some samples then equal the original (label 0), the others are replacements (label 1)
        model.gen_head.bias[104:112] += 4.0
    m, fake_ids, our_loss = our_step(model, ids, types, mask, monkeypatch)
    assert 0 < int((fake_ids != ids).sum()) < int(m.weights.sum())  # some samples replaced, some kept the original

    gen, disc = official_pair(model)
    their_loss = official_step(gen, disc, m, fake_ids)
    assert torch.allclose(our_loss, their_loss, rtol=1e-6), (our_loss, their_loss)

    our_disc, our_gen = grads_as_hf(model)
    errors = relative_errors(our_disc, disc)
    shared = cfg.sharing == "embeddings"  # then the generator's embedding gradients are the discriminator's tensors
    gen_only = {k: v for k, v in relative_errors(our_gen, gen).items()
                if not (shared and k.startswith("electra.embeddings."))}
    errors.update({f"generator:{k}": v for k, v in gen_only.items()})
    # every parameter of both networks is compared, and every one received a gradient
    assert len(errors) == len(list(disc.parameters())) + len(gen_only)
    if not shared:  # the official untied generator: embeddings of its own width, no projection
        assert gen.electra.embeddings.word_embeddings.weight.shape[1] == gen.config.hidden_size
        assert not hasattr(gen.electra, "embeddings_project") and model.generator_encoder.project is None
    assert all(p.grad is not None and p.grad.norm() > 0 for p in disc.parameters())
    assert max(errors.values()) > 0  # the two sides are separate computations, not one tensor compared with itself
    worst = max(errors, key=errors.get)
    assert errors[worst] <= REL_TOL, f"{worst}: relative gradient error {errors[worst]:.2e}"


def test_a_broken_tie_is_detected(monkeypatch):
    """Negative control: detaching the generator's tied output layer (a classic bug) changes the word embeddings'
    gradient far beyond the tolerance."""
    torch.manual_seed(0)
    model = Electra(SMALLISH)
    randomize(model, 1)
    ids, types, mask = pretraining_batch(SMALLISH.vocab_size)
    m, fake_ids, _ = our_step(model, ids, types, mask, monkeypatch)
    gen, disc = official_pair(model)
    gen.generator_lm_head.weight = torch.nn.Parameter(disc.electra.embeddings.word_embeddings.weight.detach().clone())
    official_step(gen, disc, m, fake_ids)
    our_disc, _ = grads_as_hf(model)
    errors = relative_errors(our_disc, disc)
    assert errors["electra.embeddings.word_embeddings.weight"] > 100 * REL_TOL
