"""The networks (model.py): parameter counts against the paper's and a hand-derived formula, padding invariance,
the three sharing modes, split state dicts, gradient checkpointing and the classifier.

Equality with transformers' ELECTRA on the same weights is in test_hf.py.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tinyelectra.config import ModelConfig
from tinyelectra.model import Classifier, Electra, count_parameters

TINY = ModelConfig(vocab_size=150, embedding_size=16, hidden_size=32, num_layers=2, num_heads=4, ffn_size=48,
                   max_positions=64, generator_fraction=0.5, dropout=0.0, attention_dropout=0.0)


pytestmark = pytest.mark.usefixtures("one_thread")


def block_params(H: int, F: int) -> int:
    """One post-LN block, by hand: q, k, v and output projections (H x H + H each), FFN in/out, two LayerNorms."""
    return 4 * (H * H + H) + (H * F + F) + (F * H + H) + 2 * (2 * H)


def discriminator_params(V: int, E: int, H: int, F: int, L: int, P: int = 512, types: int = 2) -> int:
    embeddings = (V + P + types) * E + 2 * E
    projection = (E * H + H) if E != H else 0
    head = (H * H + H) + (H + 1)
    return embeddings + projection + L * block_params(H, F) + head


def generator_extra_params(V: int, E: int, Hg: int, Fg: int, L: int) -> int:
    """What the generator adds when it shares the embeddings: its projection, blocks and MLM head (dense, LN, bias)."""
    projection = (E * Hg + Hg) if E != Hg else 0
    head = (Hg * E + E) + 2 * E + V
    return projection + L * block_params(Hg, Fg) + head


def test_small_parameter_counts():
    m = Electra(ModelConfig())  # the paper's Small
    disc = {id(p): p for mod in (m.embeddings, m.discriminator, m.disc_head) for p in mod.parameters()}
    n_disc = sum(p.numel() for p in disc.values())
    assert discriminator_params(30522, 128, 256, 1024, 12) == 13_549_057  # the formula reproduces the paper's number
    assert n_disc == 13_549_057
    n_total = count_parameters(m)
    assert n_total == 13_549_057 + generator_extra_params(30522, 128, 64, 256, 12)
    assert round(n_total / 1e6, 1) == 14.2  # the paper's Small shape (Appendix A); Table 1 rounds it to 14M
    assert 0.6e6 < n_total - n_disc < 0.7e6  # "generator adds about 0.65M non-shared"


def _inputs(B=3, T=20, V=150, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(104, V, (B, T), generator=g)
    ids[:, 0] = 101
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[1, 12:] = False
    mask[2, 5:] = False
    ids[~mask] = 0
    types = torch.zeros(B, T, dtype=torch.long)
    types[:, T // 2 :] = 1
    return ids, types, mask


def test_padding_does_not_change_real_tokens():
    """Whatever sits in padded positions, outputs at real tokens are the same (the attention mask works)."""
    m = Electra(TINY).eval()
    ids, types, mask = _inputs()
    other = ids.clone()
    other[~mask] = torch.randint(104, 150, (int((~mask).sum()),))
    B, T = ids.shape
    pos = torch.arange(T).expand(B, T)
    with torch.no_grad():
        d1, d2 = m.discriminator_logits(ids, types, mask), m.discriminator_logits(other, types, mask)
        g1, g2 = m.generator_logits(ids, types, mask, pos), m.generator_logits(other, types, mask, pos)
    assert torch.allclose(d1[mask], d2[mask], atol=1e-6)
    assert torch.allclose(g1[mask], g2[mask], atol=1e-6)
    assert not torch.allclose(d1[~mask], d2[~mask], atol=1e-6)  # control: padded positions themselves do change


def test_generator_logits_at_positions_equal_gathered_full_logits():
    m = Electra(TINY).eval()
    ids, types, mask = _inputs()
    B, T = ids.shape
    positions = torch.stack([torch.randperm(T)[:5] for _ in range(B)])  # (B, N)
    with torch.no_grad():
        full = m.generator_logits(ids, types, mask, torch.arange(T).expand(B, T))  # (B, T, V)
        at = m.generator_logits(ids, types, mask, positions)  # (B, N, V)
    want = torch.gather(full, 1, positions.unsqueeze(-1).expand(-1, -1, full.shape[-1]))
    assert torch.allclose(at, want, atol=1e-6)


@pytest.mark.parametrize("sharing,fraction", [("embeddings", 0.5), ("all", 1.0), ("none", 0.5)])
def test_sharing_modes_and_split_state_dicts(sharing, fraction):
    cfg = dataclasses.replace(TINY, sharing=sharing, generator_fraction=fraction)
    m = Electra(cfg)
    if sharing == "all":
        assert m.generator is None and m.generator_encoder is m.discriminator
    else:
        assert m.generator is not None and m.generator.cfg.hidden_size == int(32 * fraction)
    assert (m.generator_embeddings is m.embeddings) == (sharing != "none")
    # The generator's output layer is always its (input) word-embedding matrix: a gradient through the logits
    # reaches the word embeddings.
    ids, types, mask = _inputs()
    m.generator_logits(ids, types, mask, torch.zeros(3, 2, dtype=torch.long)).sum().backward()
    assert m.generator_embeddings.word.weight.grad is not None
    # Split state dicts load back into a fresh model exactly.
    fresh = Electra(cfg)
    fresh.load_split_state_dict(m.discriminator_state_dict(), m.generator_state_dict())
    a, b = m.state_dict(), fresh.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert all(k.startswith(("embeddings.", "discriminator.", "disc_head.")) for k in m.discriminator_state_dict())


def test_mlm_model_is_one_full_size_encoder():
    m = Electra(TINY, objective="mlm")
    assert m.discriminator is None and m.backbone is m.generator and m.gen_cfg.hidden_size == TINY.hidden_size
    fresh = Electra(TINY, objective="mlm")
    fresh.load_split_state_dict(None, m.generator_state_dict())
    assert torch.equal(fresh.generator.layers[1].qkv.weight, m.generator.layers[1].qkv.weight)


def test_gradient_checkpointing_gives_the_same_gradients():
    ids, types, mask = _inputs()
    grads = []
    for enabled in (False, True):
        torch.manual_seed(0)
        m = Electra(TINY).train()  # dropout 0 in TINY: the two runs are deterministic
        m.set_grad_checkpointing(enabled)
        loss = (m.discriminator_logits(ids, types, mask).square().sum()
                + m.generator_logits(ids, types, mask, torch.zeros(3, 2, dtype=torch.long)).square().mean())
        loss.backward()
        grads.append(torch.cat([p.grad.flatten() for p in m.parameters() if p.grad is not None]))
    assert torch.allclose(grads[0], grads[1], atol=1e-6)


def test_classifier_uses_cls_and_loads_backbone_strictly():
    clf = Classifier(TINY, num_labels=2).eval()
    ids, types, mask = _inputs()
    out = clf(ids, types, mask)
    assert out.shape == (3, 2)
    # Only the [CLS] vector matters: changing a later token changes the output only through attention, and a
    # Classifier whose head weights are zero outputs exactly its bias.
    with torch.no_grad():
        clf.head.weight.zero_()
        clf.head.bias.copy_(torch.tensor([0.25, -0.5]))
    assert torch.equal(clf(ids, types, mask), torch.tensor([[0.25, -0.5]]).expand(3, 2))
    src = Electra(TINY)
    clf.load_backbone(src.embeddings.state_dict(), src.discriminator.state_dict())
    assert torch.equal(clf.encoder.layers[0].qkv.weight, src.discriminator.layers[0].qkv.weight)
    with pytest.raises(RuntimeError):
        clf.load_backbone(src.embeddings.state_dict(), src.generator.state_dict())  # a generator-width encoder


@pytest.mark.parametrize("hidden,heads,ffn,fraction,want", [
    (256, 4, 1024, 0.25, (64, 256, 1)),  # Small (paper, Appendix A)
    (768, 12, 3072, 1 / 3, (256, 1024, 4)),  # Base
    (1024, 16, 4096, 0.25, (256, 1024, 4)),  # Large
    (256, 4, 1024, 1 / 3, (85, 340, 1)),  # off the paper's sizes: FFN 4 x 85 and 85 // 64 heads, not 1024 / 3 and 4 / 3
    (384, 6, 1536, 0.5, (192, 768, 3)),
])
def test_generator_shape_follows_the_official_rule(hidden, heads, ffn, fraction, want):
    """Official run_pretraining.get_generator_config: hidden = round(f x H), FFN = 4 x hidden, heads = max(1, hidden //
    64)."""
    g = ModelConfig(hidden_size=hidden, num_heads=heads, ffn_size=ffn, generator_fraction=fraction).generator()
    assert (g.hidden_size, g.ffn_size, g.num_heads) == want
    assert g.embedding_size == 128  # shared embeddings keep the discriminator's width (projected)
    untied = ModelConfig(hidden_size=hidden, num_heads=heads, ffn_size=ffn, generator_fraction=fraction, sharing="none")
    assert untied.generator().embedding_size == want[0]  # official untied generator: its own width, no projection


def test_cpu_training_attention_is_sdpa_mathematics(monkeypatch):
    """model._attention's CPU branch (taken when training with attention dropout) computes what SDPA computes: with
    its dropout made the identity, equal to F.scaled_dot_product_attention without dropout, with and without a
    padding mask."""
    import torch.nn.functional as F

    from tinyelectra import model as model_module

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 6, 8, generator=g) for _ in range(3))
    mask = torch.ones(2, 1, 1, 6, dtype=torch.bool)
    mask[1, ..., 4:] = False
    monkeypatch.setattr(model_module, "dropout", lambda x, p, training: x)
    for m in (None, mask):
        ours = model_module._attention(q, k, v, m, dropout_p=0.1)
        torch.testing.assert_close(ours, F.scaled_dot_product_attention(q, k, v, attn_mask=m), rtol=1e-5, atol=1e-6)
