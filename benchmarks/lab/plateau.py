"""Why does ELECTRA's discriminator sit at its all-"original" prior where a plain encoder of the same size learns?

Replaced-token detection alone, as disc_context.py runs it (15% of the positions take draws from the training rows'
unigram distribution, so only context gives them away; the AUC matched by token id is the context number), on
two kinds of rows:

- a generated grammar (`Grammar`; grammar0, grammar1, ... are seeds of its generator): 4 word classes of 16 ids,
  each class followed by one other (fixed per seed), ids Zipf-distributed inside a class, rows of 32. A unigram
  draw mostly belongs to another class than its neighbours allow, so a model that reads its neighbours (or the row's
  class order, which its position gives) ranks it high; `grammarS-cCwWsN` gives other shapes;
- enwiki rows (a prepared directory, `--enwiki`; their first 64 tokens).

One configurable discriminator (`Net`, `Spec`) spans both ends: every difference between a plain pre-LN
`torch.nn.TransformerEncoder` with PyTorch's default initialisation and a linear head, and ELECTRA's discriminator
(tiny's shape: 4 layers, hidden 128, 2 heads, embeddings 64), is one switch, and so are the optimizer's settings.
Its two ends are checked against the real modules on identical weights (`check`: the ELECTRA end against
tinyelectra's `Electra` and transformers' `ElectraForPreTraining`, forward and every gradient; the plain end against
`torch.nn.TransformerEncoder`), and the real implementations also run as arms (`impl:*`). The arms walk from one
end to the other one switch at a time (singly and cumulatively) and back, then through the learning rate and the
CPU recipes' optimizer.

    python -m benchmarks.lab.plateau run --data grammar0,grammar1,grammar2 --steps 2000 --arms electra,plain,...
    python -m benchmarks.lab.plateau run --data enwiki --steps 2000 --arms ...
                                        # data/enwiki10-v8k (benchmarks/README.md)
    python -m benchmarks.lab.plateau check     # -> plateau_check_cpu.json: the equivalences, gradient RMS per layer
    python -m benchmarks.lab.plateau analyse   # -> plateau_attention_cpu.json: what trained weights attend to
    python -m benchmarks.lab.plateau report    # -> plateau_cpu.json and .md: the tables and every run's curve
    python -m benchmarks.lab.plateau corpus --data grammar0 --out grammar0.txt
                                        # the grammar as text, for full runs
    python -m benchmarks.lab.plateau tiny --data grammar0 --steps 2500 --set optim.lr=3e-4
                                        # tests/test_plateau.py's run
    python -m benchmarks.lab.plateau prior --data RUN,RUN --out NAME
                                        # full runs: when the discriminator left its prior

Each (data, arm) run is one process with one torch thread, at most `--parallel` (default 2) at a time, 32 rows a
step (`--batch-size`; another size or row length is a data key of its own, e.g. grammar0-b8t32), AdamW after a
100-step linear warm-up then constant (`Spec`), clipping at 1.0, dropout 0.1. It rewrites its curve in
benchmarks/lab/results/plateau_cpu/ and its state in runs/plateau/ after every evaluation: run again, an interrupted run
resumes and a finished one extends to more steps on the same curve.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from benchmarks import ROOT, child_env
from benchmarks.common import command_line, git_commit, machine, run_main, write_result
from benchmarks.lab import RESULTS

from tinyelectra.config import ModelConfig, ObjectiveConfig
from tinyelectra.electra import SpecialIds, mask_batch
from tinyelectra.errors import UserError
from tinyelectra.files import write_json
from tinyelectra.metrics import roc_auc
from tinyelectra.optim import TorchAdamW

RUNS = RESULTS / "plateau_cpu"  # one file per (data, arm)
WEIGHTS = ROOT / "runs" / "plateau"  # trained weights for the analysis (git-ignored)
SPECIAL = SpecialIds(pad=0, cls=1, sep=2, mask=3)  # the grammar's ids (enwiki's come from its tokenizer)
OBJECTIVE = ObjectiveConfig()  # 15% of positions, as disc_context.py


# ---------------------------------------------------------------------------------------------------- the data
class Grammar:
    """Rows of [CLS] w ... w [SEP]: a walk over `classes` word classes, each class followed by one of `successors`
    others (fixed per seed), each word drawn inside its class by Zipf's law (weight 1 / rank). Ids 0-3 are the
    specials, then class c's words are 4 + c * words .. 4 + (c + 1) * words - 1."""

    def __init__(self, seed: int, classes: int = 4, words: int = 16, successors: int = 1) -> None:
        rng = np.random.default_rng(1000 + seed)
        self.classes, self.words = classes, words
        self.next = np.stack([rng.choice(np.delete(np.arange(classes), c), successors, replace=False)
                              for c in range(classes)])
        zipf = 1.0 / np.arange(1, words + 1)
        self.zipf = zipf / zipf.sum()
        self.vocab_size = 4 + classes * words

    def rows(self, n: int, seq_len: int, rng: np.random.Generator) -> Tensor:
        """(n, seq_len) int64 token ids."""
        cls = np.empty((n, seq_len - 2), dtype=np.int64)
        cls[:, 0] = rng.integers(0, self.classes, n)
        pick = rng.integers(0, self.next.shape[1], (n, seq_len - 3))
        for t in range(1, seq_len - 2):
            cls[:, t] = self.next[cls[:, t - 1], pick[:, t - 1]]
        word = rng.choice(self.words, size=cls.shape, p=self.zipf)
        ids = 4 + cls * self.words + word
        out = np.concatenate([np.full((n, 1), SPECIAL.cls), ids, np.full((n, 1), SPECIAL.sep)], axis=1)
        return torch.from_numpy(out)


def grammar_from_name(name: str) -> Grammar:
    """grammarS (seed S, the default shape) or grammarS-cCwWsN (C classes of W words, N successors each)."""
    m = re.fullmatch(r"grammar(\d+)(?:-c(\d+)w(\d+)s(\d+))?", name)
    if m is None:
        raise UserError(f"data {name!r}: expected grammarS or grammarS-cCwWsN")
    seed, shape = int(m[1]), m.groups()[1:]
    return Grammar(seed) if shape[0] is None else Grammar(seed, *map(int, shape))


@dataclasses.dataclass
class Batch:
    input_ids: Tensor
    token_type_ids: Tensor
    attention_mask: Tensor


class Source:
    """Training batches, fixed held-out batches and the unigram distribution, for a grammar or enwiki."""

    def __init__(self, name: str, enwiki: Path | None, batch_size: int, seq_len: int, eval_rows: int,
                 seed: int) -> None:
        self.name, self.batch_size = name, batch_size
        self.rng = np.random.default_rng(seed)
        if name.startswith("grammar"):
            self.grammar = grammar_from_name(name)
            self.vocab_size, self.special, self.seq_len = self.grammar.vocab_size, SPECIAL, seq_len
            held_out = self.grammar.rows(eval_rows, seq_len, np.random.default_rng(7))
            sample = self.grammar.rows(2000, seq_len, np.random.default_rng(8))
            self.val = [self._batch(held_out[i:i + batch_size]) for i in range(0, eval_rows, batch_size)]
            counts = np.bincount(sample.numpy().ravel(), minlength=self.vocab_size).astype(np.float64)
        elif name == "enwiki":
            from tinyelectra.data import PretrainData  # noqa: PLC0415

            if enwiki is None or not (enwiki / "manifest.json").exists():
                raise UserError(f"enwiki: no prepared directory at {enwiki} (see benchmarks/README.md: "
                                "data/enwiki10-v8k)")
            self.data = PretrainData(enwiki)
            self.vocab_size, self.special = self.data.vocab_size, SpecialIds.from_tokenizer(self.data.tokenizer)
            # rows cut to seq_len
            self.seq_len = min(seq_len, self.data.batch("train", np.arange(1)).input_ids.shape[1])
            n = min(eval_rows, self.data.num_rows("validation"))
            self.val = [self._from_data("validation", np.arange(i, min(i + batch_size, n)))
                        for i in range(0, n, batch_size)]
            ids = self.data.batch("train", np.arange(min(5000, self.data.num_rows("train")))).input_ids.numpy().ravel()
            counts = np.bincount(ids, minlength=self.vocab_size).astype(np.float64)
        else:
            raise UserError(f"unknown data {name!r} (grammarN or enwiki)")
        s = self.special
        counts[[s.pad, s.cls, s.sep, s.mask]] = 0
        self.unigram = torch.from_numpy(counts / counts.sum()).float()
        g = torch.Generator().manual_seed(seed + 2)
        self.val_fake = [corrupt(b, self.special, self.unigram, g) for b in self.val]

    def _batch(self, ids: Tensor) -> Batch:
        return Batch(ids, torch.zeros_like(ids), torch.ones_like(ids, dtype=torch.bool))

    def _from_data(self, split: str, rows: np.ndarray) -> Batch:
        b = self.data.batch(split, rows)
        T = self.seq_len
        return Batch(b.input_ids[:, :T], b.token_type_ids[:, :T], b.attention_mask[:, :T])

    def train_batch(self) -> Batch:
        if hasattr(self, "grammar"):
            return self._batch(self.grammar.rows(self.batch_size, self.seq_len, self.rng))
        return self._from_data("train", self.rng.integers(0, self.data.num_rows("train"), self.batch_size))


def corrupt(b: Batch, special: SpecialIds, freqs: Tensor, g: torch.Generator) -> tuple[Tensor, Tensor]:
    """(fake ids, labels): the positions mask_batch chooses take unigram draws; a draw equal to the original is
    "original" (disc_context.py's definition)."""
    m = mask_batch(b.input_ids, b.token_type_ids, b.attention_mask, OBJECTIVE, special, len(freqs), g)
    draws = torch.multinomial(freqs, m.positions.numel(), replacement=True, generator=g).view_as(m.positions)
    fake = b.input_ids.scatter(1, m.positions, torch.where(m.weights > 0, draws, m.targets))
    return fake, (fake != b.input_ids).float()


# ---------------------------------------------------------------------------------------------------- the model
@dataclasses.dataclass(frozen=True)
class Spec:
    """Every difference between the plain encoder and ELECTRA's discriminator (defaults: ELECTRA's, tiny's shape)."""

    # electra: N(0, init_std) weights, zero biases | torch: PyTorch's defaults (as nn.TransformerEncoder)
    init: str = "electra"
    init_std: float = 0.02  # ELECTRA's initializer_range
    embedding: int = 64  # E; != hidden: a linear projection E -> hidden (the factorised embedding)
    emb_norm: bool = True  # LayerNorm on the summed embeddings
    token_types: bool = True  # a token-type embedding (all rows here are one segment: type 0)
    norm: str = "post"  # post: x = LN(x + f(x)) | pre: x = x + f(LN(x)), and a final LN
    head: str = "mlp"  # mlp: dense(H) -> act -> dense(1) | linear: dense(1)
    act: str = "gelu"  # gelu | relu (feed-forward and head)
    dropout: float = 0.1  # hidden and attention dropout
    lr: float = 1e-3
    warmup: int = 100  # linear warm-up steps, then constant
    opt: str = "adamw"  # adamw: torch AdamW, weight decay on every tensor | paper: tinyelectra's PaperAdam (no bias
    # correction, no decay on LayerNorm and biases)
    eps: float = 1e-8
    wd: float = 0.01
    body_lr_scale: float = 1.0  # the encoder and the head train at lr x this; the embeddings at lr
    hidden: int = 128
    layers: int = 4
    heads: int = 2
    ffn: int = 512


PLAIN = Spec(init="torch", embedding=128, emb_norm=False, token_types=False, norm="pre", head="linear", act="relu")
ELECTRA = Spec()
# one switch each: (name, the plain end's value, ELECTRA's value)
SWITCHES = {
    "init": ("torch", "electra"), "embedding": (128, 64), "emb_norm": (False, True), "token_types": (False, True),
    "norm": ("pre", "post"), "head": ("linear", "mlp"), "act": ("relu", "gelu"),
}


class Block(nn.Module):
    def __init__(self, s: Spec) -> None:
        super().__init__()
        self.s = s
        self.qkv = nn.Linear(s.hidden, 3 * s.hidden)
        self.attn_out = nn.Linear(s.hidden, s.hidden)
        self.norm1 = nn.LayerNorm(s.hidden, eps=1e-12 if s.init == "electra" else 1e-5)
        self.ffn_in = nn.Linear(s.hidden, s.ffn)
        self.ffn_out = nn.Linear(s.ffn, s.hidden)
        self.norm2 = nn.LayerNorm(s.hidden, eps=self.norm1.eps)

    def attend(self, x: Tensor, mask: Tensor | None) -> Tensor:
        B, T, H = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.s.heads, H // self.s.heads).permute(2, 0, 3, 1, 4)
        p = self.s.dropout if self.training else 0.0
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
        return F.dropout(self.attn_out(a.transpose(1, 2).reshape(B, T, H)), self.s.dropout, self.training)

    def feed_forward(self, x: Tensor) -> Tensor:
        act = F.gelu if self.s.act == "gelu" else F.relu
        return F.dropout(self.ffn_out(act(self.ffn_in(x))), self.s.dropout, self.training)

    def forward(self, x: Tensor, mask: Tensor | None) -> Tensor:
        if self.s.norm == "post":
            x = self.norm1(x + self.attend(x, mask))
            return self.norm2(x + self.feed_forward(x))
        x = x + self.attend(self.norm1(x), mask)
        return x + self.feed_forward(self.norm2(x))


class Net(nn.Module):
    """Embeddings (+ LN) (+ projection) -> blocks (-> final LN for pre-LN) -> head: one logit per token."""

    def __init__(self, s: Spec, vocab_size: int, max_positions: int) -> None:
        super().__init__()
        self.s = s
        E, H = s.embedding, s.hidden
        self.word = nn.Embedding(vocab_size, E)
        self.position = nn.Embedding(max_positions, E)
        self.token_type = nn.Embedding(2, E) if s.token_types else None
        eps = 1e-12 if s.init == "electra" else 1e-5
        self.emb_norm = nn.LayerNorm(E, eps=eps) if s.emb_norm else None
        self.project = nn.Linear(E, H) if E != H else None
        self.layers = nn.ModuleList(Block(s) for _ in range(s.layers))
        self.final_norm = nn.LayerNorm(H, eps=eps) if s.norm == "pre" else None
        self.dense = nn.Linear(H, H) if s.head == "mlp" else None
        self.out = nn.Linear(H, 1)
        if s.init == "electra":
            self.apply(lambda m: electra_init(m, s.init_std))
        else:
            for block in self.layers:
                torch_encoder_init(block)

    def forward(self, ids: Tensor, types: Tensor, attention_mask: Tensor) -> Tensor:
        x = self.word(ids) + self.position.weight[: ids.shape[1]]
        if self.token_type is not None:
            x = x + self.token_type(types)
        if self.emb_norm is not None:
            x = self.emb_norm(x)
        x = F.dropout(x, self.s.dropout, self.training)
        if self.project is not None:
            x = self.project(x)
        mask = None if bool(attention_mask.all()) else attention_mask[:, None, None, :]
        for layer in self.layers:
            x = layer(x, mask)
        if self.final_norm is not None:
            x = self.final_norm(x)
        if self.dense is not None:
            x = (F.gelu if self.s.act == "gelu" else F.relu)(self.dense(x))
        return self.out(x).squeeze(-1)


def electra_init(m: nn.Module, std: float = 0.02) -> None:
    """BERT/ELECTRA's initialisation (tinyelectra's init_weights, transformers' _init_weights): N(0, std) weights,
    zero biases, unit LayerNorms."""
    if isinstance(m, (nn.Linear, nn.Embedding)):
        nn.init.normal_(m.weight, mean=0.0, std=std)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)
    elif isinstance(m, nn.LayerNorm):
        nn.init.ones_(m.weight)
        nn.init.zeros_(m.bias)


def torch_encoder_init(block: Block) -> None:
    """The block's weights as a fresh nn.TransformerEncoderLayer of the same shape has them (xavier-uniform fused
    query/key/value with zero bias, zero output bias, nn.Linear's defaults elsewhere): copied from one."""
    s = block.s
    ref = nn.TransformerEncoderLayer(s.hidden, s.heads, s.ffn, batch_first=True)
    load_from_torch_layer(block, ref)


def load_from_torch_layer(block: Block, ref: nn.TransformerEncoderLayer) -> None:
    with torch.no_grad():
        block.qkv.weight.copy_(ref.self_attn.in_proj_weight)
        block.qkv.bias.copy_(ref.self_attn.in_proj_bias)
        block.attn_out.weight.copy_(ref.self_attn.out_proj.weight)
        block.attn_out.bias.copy_(ref.self_attn.out_proj.bias)
        for mine, theirs in ((block.ffn_in, ref.linear1), (block.ffn_out, ref.linear2), (block.norm1, ref.norm1),
                             (block.norm2, ref.norm2)):
            mine.weight.copy_(theirs.weight)
            mine.bias.copy_(theirs.bias)


# --------------------------------------------------------------------------------------------- the real implementations
def model_config(s: Spec, vocab_size: int, max_positions: int) -> ModelConfig:
    return ModelConfig(vocab_size=vocab_size, embedding_size=s.embedding, hidden_size=s.hidden, num_layers=s.layers,
                       num_heads=s.heads, ffn_size=s.ffn, max_positions=max_positions, dropout=s.dropout,
                       attention_dropout=s.dropout)


class TinyElectraDisc(nn.Module):
    """tinyelectra's Electra, discriminator side only (the generator removed: nothing of it in the optimizer)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        from tinyelectra.model import Electra  # noqa: PLC0415

        self.m = Electra(cfg)
        self.m.generator = self.m.gen_head = None

    def forward(self, ids: Tensor, types: Tensor, attention_mask: Tensor) -> Tensor:
        return self.m.discriminator_logits(ids, types, attention_mask)


class HFDisc(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        from transformers import ElectraForPreTraining  # noqa: PLC0415

        from tinyelectra import hf  # noqa: PLC0415

        self.m = ElectraForPreTraining(hf.hf_config(cfg))

    def forward(self, ids: Tensor, types: Tensor, attention_mask: Tensor) -> Tensor:
        return self.m(input_ids=ids, token_type_ids=types, attention_mask=attention_mask.long()).logits


class TorchEncoderDisc(nn.Module):
    """The plain encoder itself: nn.Embedding words + learned positions, nn.TransformerEncoder (pre-LN, ReLU,
    final LN, PyTorch's initialisation), nn.Linear head."""

    def __init__(self, s: Spec, vocab_size: int, max_positions: int) -> None:
        super().__init__()
        self.word = nn.Embedding(vocab_size, s.hidden)
        self.position = nn.Embedding(max_positions, s.hidden)
        layer = nn.TransformerEncoderLayer(s.hidden, s.heads, s.ffn, dropout=s.dropout, batch_first=True,
                                           norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, s.layers, norm=nn.LayerNorm(s.hidden), enable_nested_tensor=False)
        self.out = nn.Linear(s.hidden, 1)
        self.dropout = nn.Dropout(s.dropout)

    def forward(self, ids: Tensor, types: Tensor, attention_mask: Tensor) -> Tensor:
        x = self.dropout(self.word(ids) + self.position.weight[: ids.shape[1]])
        pad = None if bool(attention_mask.all()) else ~attention_mask
        return self.out(self.encoder(x, src_key_padding_mask=pad)).squeeze(-1)


# ---------------------------------------------------------------------------------------------------- the arms
def arms() -> dict[str, tuple[str, Spec]]:
    """name -> (what it is, Spec). 'impl:' arms run a real implementation (their Spec gives shape and optimizer)."""
    out: dict[str, tuple[str, Spec]] = {
        "plain": ("the plain encoder (pre-LN, ReLU, PyTorch init, E = H, no embedding LN, linear head)", PLAIN),
        "electra": ("ELECTRA's discriminator (N(0, 0.02), E 64 -> 128, embedding LN + types, post-LN, GELU, "
                    "two-layer head)", ELECTRA),
        "impl:tinyelectra": ("tinyelectra's Electra, discriminator alone", ELECTRA),
        "impl:transformers": ("transformers' ElectraForPreTraining, same config", ELECTRA),
        "impl:torch": ("torch.nn.TransformerEncoder itself (pre-LN, ReLU, final LN, default init), nn.Linear head",
                       PLAIN),
    }
    for k, (plain_v, electra_v) in SWITCHES.items():
        out[f"plain+{k}"] = (f"plain, {k} = {electra_v!r} (ELECTRA's)", dataclasses.replace(PLAIN, **{k: electra_v}))
        out[f"electra-{k}"] = (f"ELECTRA, {k} = {plain_v!r} (the plain encoder's)",
                               dataclasses.replace(ELECTRA, **{k: plain_v}))
    # the walk, cumulative: plain, then each switch turned to ELECTRA's in turn
    s = PLAIN
    for i, k in enumerate(SWITCHES):
        s = dataclasses.replace(s, **{k: SWITCHES[k][1]})
        if 0 < i < len(SWITCHES) - 2:  # walk1 is plain+init, the last two are electra-act and ELECTRA
            out[f"walk{i + 1}"] = ("plain with " + ", ".join(list(SWITCHES)[: i + 1]) + " as ELECTRA's", s)
    # what both share, and the optimizer
    for base_name, base in (("plain", PLAIN), ("electra", ELECTRA)):
        out[f"{base_name}-dropout"] = (f"{base_name}, dropout 0", dataclasses.replace(base, dropout=0.0))
    out["electra-lr3e-3"] = ("ELECTRA, peak lr 3e-3 (tiny's)", dataclasses.replace(ELECTRA, lr=3e-3))
    out["electra-lr3e-4"] = ("ELECTRA, peak lr 3e-4", dataclasses.replace(ELECTRA, lr=3e-4))
    out["electra-warmup0"] = ("ELECTRA, no warm-up", dataclasses.replace(ELECTRA, warmup=0))
    out["electra-warmup1000"] = ("ELECTRA, 1,000-step warm-up", dataclasses.replace(ELECTRA, warmup=1000))
    out["electra-paperadam"] = ("ELECTRA, the paper's Adam (no bias correction, eps 1e-6, no decay on LN/biases)",
                                dataclasses.replace(ELECTRA, opt="paper", eps=1e-6))
    out["electra-wd0"] = ("ELECTRA, weight decay 0", dataclasses.replace(ELECTRA, wd=0.0))
    for std in (0.05, 0.1):
        out[f"electra-std{std:g}"] = (f"ELECTRA, initialised N(0, {std:g})", dataclasses.replace(ELECTRA, init_std=std))
    out["electra-init-act"] = ("ELECTRA, PyTorch's init and ReLU",
                               dataclasses.replace(ELECTRA, init="torch", act="relu"))
    out["electra-act-norm"] = ("ELECTRA, ReLU and pre-LN", dataclasses.replace(ELECTRA, act="relu", norm="pre"))
    # the tiny recipe's optimizer (the paper's Adam, eps 1e-6, peak 3e-3), with GELU and with ReLU
    recipe_opt = dataclasses.replace(ELECTRA, opt="paper", eps=1e-6, lr=3e-3)
    out["electra-recipeopt"] = ("ELECTRA, tiny's optimizer (the paper's Adam, eps 1e-6, peak lr 3e-3)", recipe_opt)
    out["electra-recipeopt-act"] = ("ELECTRA with ReLU, tiny's optimizer", dataclasses.replace(recipe_opt, act="relu"))
    out["electra-recipeopt-init"] = ("ELECTRA with PyTorch's init, tiny's optimizer",
                                     dataclasses.replace(recipe_opt, init="torch"))
    out["electra-recipeopt-init-act"] = ("ELECTRA with PyTorch's init and ReLU, tiny's optimizer",
                                         dataclasses.replace(recipe_opt, init="torch", act="relu"))
    out["electra-recipeopt-norm"] = ("ELECTRA with pre-LN, tiny's optimizer",
                                     dataclasses.replace(recipe_opt, norm="pre"))
    out["electra-recipeopt-act-norm"] = ("ELECTRA with ReLU and pre-LN, tiny's optimizer",
                                         dataclasses.replace(recipe_opt, act="relu", norm="pre"))
    plain_opt = dataclasses.replace(PLAIN, opt="paper", eps=1e-6, lr=3e-3)
    for k, (_, electra_v) in SWITCHES.items():
        out[f"plain-recipeopt+{k}"] = (f"plain with tiny's optimizer, {k} = {electra_v!r} (ELECTRA's)",
                                       dataclasses.replace(plain_opt, **{k: electra_v}))
    out["electra-lr1e-4"] = ("ELECTRA, peak lr 1e-4", dataclasses.replace(ELECTRA, lr=1e-4))
    out["electra-recipeopt-lr3e-4"] = ("ELECTRA, the paper's Adam (eps 1e-6) at 3e-4",
                                       dataclasses.replace(recipe_opt, lr=3e-4))
    for name, lr in (("5e-4", 5e-4), ("1e-3", 1e-3)):
        out[f"electra-recipeopt-lr{name}"] = (f"ELECTRA, the paper's Adam (eps 1e-6) at {name}",
                                              dataclasses.replace(recipe_opt, lr=lr))
    for name, lr in (("3e-4", 3e-4), ("1e-3", 1e-3)):
        out[f"electra-recipeopt-lr{name}-act"] = (f"ELECTRA with ReLU, the paper's Adam (eps 1e-6) at {name}",
                                                  dataclasses.replace(recipe_opt, lr=lr, act="relu"))
    for name, lr in (("3e-4", 3e-4), ("3e-3", 3e-3)):
        out[f"electra-recipeopt-lr{name}-L2"] = (f"ELECTRA, 2 layers, the paper's Adam (eps 1e-6) at {name}",
                                                 dataclasses.replace(recipe_opt, lr=lr, layers=2))
    out["electra-recipeopt-body0.1"] = ("ELECTRA, tiny's optimizer, encoder and head at 1/10 of its rate (3e-4)",
                                        dataclasses.replace(recipe_opt, body_lr_scale=0.1))
    out["electra-recipeopt-init-norm"] = ("ELECTRA with PyTorch's init and pre-LN, tiny's optimizer",
                                          dataclasses.replace(recipe_opt, init="torch", norm="pre"))
    out["electra-act-lr3e-3"] = ("ELECTRA with ReLU, peak lr 3e-3", dataclasses.replace(ELECTRA, act="relu", lr=3e-3))
    out["electra-act-paperadam"] = ("ELECTRA with ReLU, the paper's Adam (eps 1e-6) at 1e-3",
                                    dataclasses.replace(ELECTRA, act="relu", opt="paper", eps=1e-6))
    out["plain-lr3e-3"] = ("plain, peak lr 3e-3", dataclasses.replace(PLAIN, lr=3e-3))
    out["plain-recipeopt"] = ("plain, tiny's optimizer", dataclasses.replace(PLAIN, opt="paper", eps=1e-6, lr=3e-3))
    return out


def build(arm: str, s: Spec, vocab_size: int, max_positions: int) -> nn.Module:
    if arm == "impl:tinyelectra":
        return TinyElectraDisc(model_config(s, vocab_size, max_positions))
    if arm == "impl:transformers":
        return HFDisc(model_config(s, vocab_size, max_positions))
    if arm == "impl:torch":
        return TorchEncoderDisc(s, vocab_size, max_positions)
    return Net(s, vocab_size, max_positions)


EMBEDDING_NAMES = ("word.", "position.", "token_type.", "emb_norm.")


def optimizer(model: nn.Module, s: Spec) -> torch.optim.Optimizer:
    """torch's AdamW (decay on every tensor) or the paper's Adam (tinyelectra's PaperAdam and parameter groups);
    with body_lr_scale != 1, the groups past the embeddings carry lr_scale (as PaperAdam's set_lr reads it)."""
    if s.opt == "paper":
        from tinyelectra.optim import PaperAdam, param_groups  # noqa: PLC0415

        groups = param_groups(model, s.wd)
    else:
        groups = [{"params": list(model.parameters()), "weight_decay": s.wd}]
    if s.body_lr_scale != 1.0:
        names = {id(p): n for n, p in model.named_parameters()}
        split = []
        for g in groups:
            emb = [p for p in g["params"] if names[id(p)].startswith(EMBEDDING_NAMES)]
            body = [p for p in g["params"] if not names[id(p)].startswith(EMBEDDING_NAMES)]
            split += [{**g, "params": emb, "lr_scale": 1.0}, {**g, "params": body, "lr_scale": s.body_lr_scale}]
        groups = [g for g in split if g["params"]]
    if s.opt == "paper":
        return PaperAdam(groups, lr=s.lr, betas=(0.9, 0.999), eps=s.eps, weight_decay=s.wd)
    # torch's AdamW; set_lr: lr x each group's lr_scale
    return TorchAdamW(groups, lr=s.lr, eps=s.eps, weight_decay=s.wd)


# ---------------------------------------------------------------------------------------------------- one run
def default_seq_len(data: str) -> int:
    return 64 if data == "enwiki" else 32


def run_key(data: str, batch_size: int, seq_len: int | None) -> str:
    """A run's data key: the data's name, with -bBtT when the rows differ from the default (32 rows of
    default_seq_len)."""
    T = seq_len or default_seq_len(data)
    return data if (batch_size, T) == (32, default_seq_len(data)) else f"{data}-b{batch_size}t{T}"


def run_path(key: str, arm: str) -> Path:
    return RUNS / f"{key}__{arm.replace(':', '_')}.json"


@torch.no_grad()
def evaluate(model: nn.Module, src: Source) -> dict:
    model.eval()
    scores, labels, ids = [], [], []
    for b, (fake, lab) in zip(src.val, src.val_fake):
        keep = b.attention_mask
        scores.append(model(fake, b.token_type_ids, b.attention_mask)[keep].float())
        labels.append(lab[keep])
        ids.append(fake[keep])
    model.train()
    s, y, i = torch.cat(scores), torch.cat(labels), torch.cat(ids)
    sp = src.special
    words = ~torch.isin(i, torch.tensor([sp.pad, sp.cls, sp.sep, sp.mask]))
    prior = float(1.0 - y.mean())
    acc = float(((s > 0).float() == y).float().mean())
    return {"auc_matched": round(roc_auc(s[words].numpy(), y[words].numpy(), i[words].numpy()), 4),
            "auc": round(roc_auc(s.numpy(), y.numpy()), 4), "acc_minus_prior": round(acc - prior, 4),
            "loss": round(float(F.binary_cross_entropy_with_logits(s, y)), 4)}


def train_one(args, arm: str, data: str) -> dict:
    """One run to `args.steps`; continues from its saved state (every evaluation keeps one) when it has one, so an
    interrupted run resumes and a finished one extends to more steps with the same curve."""
    torch.set_num_threads(1)
    what, s = arms()[arm]
    key = run_key(data, args.batch_size, args.seq_len)
    src = Source(data, args.enwiki, args.batch_size, args.seq_len or default_seq_len(data), args.eval_rows, args.seed)
    torch.manual_seed(args.seed)
    model = build(arm, s, src.vocab_size, max(src.seq_len, 128))
    model.train()
    opt = optimizer(model, s)
    params = [p for p in model.parameters() if p.requires_grad]
    g_train = torch.Generator().manual_seed(args.seed + 1)
    doc = {"arm": arm, "what": what, "spec": dataclasses.asdict(s), "data": data, "key": key, "steps": args.steps,
           "batch_size": args.batch_size, "seq_len": src.seq_len, "vocab_size": src.vocab_size, "seed": args.seed,
           "held_out_rows": sum(len(b.input_ids) for b in src.val), "prior": None, "finished": False,
           "machine": machine(), "git_commit": git_commit(), "command": args.command, "evals": []}
    labels = torch.cat([lab[b.attention_mask] for b, (_, lab) in zip(src.val, src.val_fake)])
    doc["prior"] = round(float(1.0 - labels.mean()), 4)
    start, seconds_before = 0, 0.0
    state_path = WEIGHTS / "state" / f"{key}__{arm.replace(':', '_')}.pt"
    state_path.parent.mkdir(parents=True, exist_ok=True)
    if state_path.exists():
        st = torch.load(state_path, weights_only=False)
        same = Spec(**st["doc"]["spec"]) == s and all(st["doc"][k] == doc[k] for k in ("batch_size", "seq_len", "seed"))
        if same and st["step"] <= args.steps:
            model.load_state_dict(st["model"])
            opt.load_state_dict(st["opt"])
            src.rng.bit_generator.state = st["np_rng"]
            g_train.set_state(st["g_train"])
            torch.set_rng_state(st["torch_rng"])
            start = st["step"]
            doc["evals"] = [e for e in st["doc"]["evals"] if e["step"] <= start]
            seconds_before = doc["evals"][-1]["seconds"]
            doc["resumed_at"] = st["doc"].get("resumed_at", []) + [start]
    t0 = time.perf_counter()
    for step in range(start, args.steps + 1):
        evaluated = doc["evals"] and doc["evals"][-1]["step"] == step
        if (step % args.eval_every == 0 or step == args.steps) and not evaluated:
            doc["evals"].append({"step": step, **evaluate(model, src),
                                 "seconds": round(seconds_before + time.perf_counter() - t0, 1)})
            doc["finished"] = step == args.steps
            write_json(run_path(key, arm), doc)
            torch.save({"step": step, "model": model.state_dict(), "opt": opt.state_dict(),
                        "np_rng": src.rng.bit_generator.state,
                        "g_train": g_train.get_state(), "torch_rng": torch.get_rng_state(), "doc": doc}, state_path)
            print(json.dumps({"arm": arm, "data": key, **doc["evals"][-1]}), file=sys.stderr, flush=True)
        if step == args.steps:
            break
        if step in args.save_at:
            save_weights(model, key, arm, step)
        b = src.train_batch()
        fake, lab = corrupt(b, src.special, src.unigram, g_train)
        opt.set_lr(s.lr * min(1.0, (step + 1) / s.warmup) if s.warmup else s.lr)
        w = b.attention_mask.float()
        logits = model(fake, b.token_type_ids, b.attention_mask).float()
        loss = (F.binary_cross_entropy_with_logits(logits, lab, reduction="none") * w).sum() / w.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
    doc["finished"] = True
    write_json(run_path(key, arm), doc)
    save_weights(model, key, arm, args.steps)
    return doc


def save_weights(model: nn.Module, data: str, arm: str, step: int) -> None:
    """The weights at `step`, for the analysis (runs/, not committed)."""
    path = WEIGHTS / "weights" / f"{data}__{arm.replace(':', '_')}__{step}.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), path)


def run_all(args) -> None:
    """Every (arm, data) pair not finished yet, at most --parallel processes at once."""
    known = arms()
    for a in args.arms:
        if a not in known:
            raise UserError(f"unknown arm {a!r}; known: {', '.join(known)}")
    jobs = []
    for data in args.data:
        for arm in args.arms:
            p = run_path(run_key(data, args.batch_size, args.seq_len), arm)
            done = json.loads(p.read_text()) if p.exists() else {}
            if done.get("finished") and done["evals"][-1]["step"] >= args.steps:
                continue
            jobs.append((arm, data))
    running: list[tuple[subprocess.Popen, str, str]] = []
    env = child_env(dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1"))
    base = [sys.executable, "-m", __spec__.name, "one", "--steps", str(args.steps), "--batch-size",
            str(args.batch_size),
            *(["--seq-len", str(args.seq_len)] if args.seq_len else []), "--eval-every", str(args.eval_every),
            "--eval-rows", str(args.eval_rows),
            "--seed", str(args.seed), "--enwiki", str(args.enwiki), "--command", args.command,
            "--save-at", ",".join(map(str, args.save_at))]
    while jobs or running:
        while jobs and len(running) < args.parallel:
            arm, data = jobs.pop(0)
            print(f"start {data} {arm}", flush=True)
            proc = subprocess.Popen([*base, "--arm", arm, "--data", data], env=env, stdout=subprocess.DEVNULL)
            running.append((proc, arm, data))
        time.sleep(2)
        for item in list(running):
            if item[0].poll() is not None:
                running.remove(item)
                print(f"done {item[2]} {item[1]} exit {item[0].returncode}", flush=True)


# ---------------------------------------------------------------------------------------------------- checks
def net_from_electra(e: nn.Module, s: Spec, vocab_size: int, max_positions: int) -> Net:
    """A Net at ELECTRA's end holding a tinyelectra Electra's discriminator weights (names map one to one)."""
    net = Net(s, vocab_size, max_positions)
    sd = e.discriminator_state_dict()
    rename = {"embeddings.word.": "word.", "embeddings.position.": "position.", "embeddings.token_type.": "token_type.",
              "embeddings.norm.": "emb_norm.", "discriminator.": "", "disc_head.": ""}
    mapped = {}
    for k, v in sd.items():
        for a, b in rename.items():
            if k.startswith(a):
                mapped[b + k[len(a):]] = v
                break
    net.load_state_dict(mapped, strict=True)
    return net


def torch_encoder_from_net(net: Net) -> TorchEncoderDisc:
    """nn.TransformerEncoder holding a plain-end Net's weights."""
    s = net.s
    ref = TorchEncoderDisc(s, net.word.num_embeddings, net.position.num_embeddings)
    with torch.no_grad():
        ref.word.weight.copy_(net.word.weight)
        ref.position.weight.copy_(net.position.weight)
        for block, layer in zip(net.layers, ref.encoder.layers):
            layer.self_attn.in_proj_weight.copy_(block.qkv.weight)
            layer.self_attn.in_proj_bias.copy_(block.qkv.bias)
            layer.self_attn.out_proj.weight.copy_(block.attn_out.weight)
            layer.self_attn.out_proj.bias.copy_(block.attn_out.bias)
            for mine, theirs in ((block.ffn_in, layer.linear1), (block.ffn_out, layer.linear2),
                                 (block.norm1, layer.norm1),
                                 (block.norm2, layer.norm2)):
                theirs.weight.copy_(mine.weight)
                theirs.bias.copy_(mine.bias)
        ref.encoder.norm.weight.copy_(net.final_norm.weight)
        ref.encoder.norm.bias.copy_(net.final_norm.bias)
        ref.out.weight.copy_(net.out.weight)
        ref.out.bias.copy_(net.out.bias)
    return ref


def randomize(m: nn.Module, seed: int) -> None:
    """Non-trivial values everywhere (zero biases and unit LayerNorms would hide a mapping mistake)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)


def bce(logits: Tensor, labels: Tensor) -> Tensor:
    return F.binary_cross_entropy_with_logits(logits.float(), labels)


def grad_norms(model: nn.Module) -> dict[str, float]:
    """Gradient RMS over each group of parameters: embeddings, projection, each layer's attention and FFN, head."""
    groups: dict[str, list[Tensor]] = {}
    for name, p in model.named_parameters():
        if p.grad is None:
            continue
        parts = name.split(".")
        if parts[0] == "layers":
            key = f"layer{parts[1]}." + ("attention" if parts[2] in ("qkv", "attn_out")
                                         else "ffn" if parts[2].startswith("ffn") else "norm")
        elif parts[0] in ("word", "position", "token_type", "emb_norm"):
            key = "embeddings"
        else:
            key = {"dense": "head", "out": "head", "final_norm": "final_norm", "project": "project"}[parts[0]]
        groups.setdefault(key, []).append(p.grad.flatten())
    return {k: float(torch.cat(v).pow(2).mean().sqrt()) for k, v in groups.items()}


def check(args) -> dict:
    """The end points equal the real modules on identical weights (forward in eval mode, gradients of the loss),
    and every layer gets a gradient."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    src = Source("grammar0", None, 16, 32, 16, 0)
    b = src.val[0]
    fake, lab = src.val_fake[0]
    V, P = src.vocab_size, 128
    out: dict = {}
    from tinyelectra import hf  # noqa: PLC0415

    # ELECTRA's end: Net == tinyelectra's Electra == transformers' ElectraForPreTraining on the same weights
    ours = TinyElectraDisc(model_config(ELECTRA, V, P))
    randomize(ours, 1)
    ours.eval()
    net = net_from_electra(ours.m, ELECTRA, V, P).eval()
    theirs = hf.to_hf_discriminator(ours.m, pad_token_id=SPECIAL.pad)
    l_ours = ours(fake, b.token_type_ids, b.attention_mask)
    l_net = net(fake, b.token_type_ids, b.attention_mask)
    l_hf = theirs(input_ids=fake, token_type_ids=b.token_type_ids, attention_mask=b.attention_mask.long()).logits
    out["electra_end_forward_max_abs_diff"] = {
        "net_vs_tinyelectra": float((l_net - l_ours).abs().max().detach()),
        "tinyelectra_vs_transformers": float((l_ours - l_hf).abs().max().detach())}
    # gradients, ours vs transformers, every tensor, through the export mapping
    bce(l_ours, lab).backward()
    bce(l_hf, lab).backward()
    grads = TinyElectraDisc(model_config(ELECTRA, V, P))
    with torch.no_grad():
        for p, q in zip(grads.parameters(), ours.parameters()):
            p.copy_(q.grad)
    mapped = hf.discriminator_to_hf(grads.m)
    hf_grads = dict(theirs.named_parameters())
    # a key bias shifts every score of a query by the same amount: its true gradient is 0, both sides give rounding
    key_bias = [k for k in mapped if k.endswith("key.bias")]
    rel = {k: float((v - hf_grads[k].grad).norm() / hf_grads[k].grad.norm().clamp_min(1e-30)) for k, v in mapped.items()
           if k not in key_bias}
    out["electra_end_gradients_tinyelectra_vs_transformers"] = {
        "tensors_compared": len(rel), "max_relative_difference": max(rel.values()),
        "key_bias_gradients_max_abs (mathematically 0)": max(float(mapped[k].abs().max()) for k in key_bias),
        "tensors_without_gradient": sorted(k for k, p in hf_grads.items() if p.grad is None)}
    # the plain end: Net == nn.TransformerEncoder on the same weights
    plain = Net(PLAIN, V, P)
    randomize(plain, 2)
    plain.eval()
    ref = torch_encoder_from_net(plain).eval()
    out["plain_end_forward_max_abs_diff_vs_torch_transformer_encoder"] = float(
        (plain(fake, b.token_type_ids, b.attention_mask) - ref(fake, b.token_type_ids, b.attention_mask)).abs().max())
    # gradient reach at initialisation: the RMS gradient of every layer, each end, the same batch
    reach = {}
    for name, s in (("plain", PLAIN), ("electra", ELECTRA)):
        torch.manual_seed(0)
        m = Net(s, V, P).eval()
        bce(m(fake, b.token_type_ids, b.attention_mask), lab).backward()
        reach[name] = {k: float(f"{v:.3g}") for k, v in grad_norms(m).items()}
    out["gradient_rms_at_init"] = reach
    return out


# ----------------------------------------------------------------------------------------------- the tiny recipe itself
def tiny_curve(overrides: list[str], steps: int, batch_size: int, stop_at: float, data: str = "grammar0", seed: int = 0,
               eval_every: int = 100, warmup: int = 100) -> dict[int, float]:
    """Replaced-token detection alone with the tiny recipe itself (tests/test_plateau.py's check): tinyelectra's
    Electra (discriminator alone) from the recipe's model section (the grammar's vocabulary), its optimizer exactly as
    the recipe with `overrides` builds it (build_optimizer: the paper's Adam, its rate, eps, decay, clipping), a
    `warmup`-step warm-up then the peak rate, `batch_size` rows of 32 tokens of the grammar with unigram draws at 15% of
    the positions. The held-out AUC matched by token id every `eval_every` steps, until it reaches `stop_at` or `steps`
    run out."""
    from tinyelectra.config import load_recipe  # noqa: PLC0415
    from tinyelectra.optim import build_optimizer  # noqa: PLC0415

    recipe = load_recipe("tiny", overrides)
    src = Source(data, None, batch_size=batch_size, seq_len=32, eval_rows=128, seed=seed)
    torch.manual_seed(seed)
    model = TinyElectraDisc(dataclasses.replace(recipe.model, vocab_size=src.vocab_size)).train()
    opt = build_optimizer(model.m, recipe.optim, "cpu")
    g = torch.Generator().manual_seed(seed + 1)
    curve = {0: evaluate(model, src)["auc_matched"]}
    for step in range(steps):
        b = src.train_batch()
        fake, labels = corrupt(b, src.special, src.unigram, g)
        opt.set_lr(recipe.optim.lr * min(1.0, (step + 1) / warmup))
        loss = F.binary_cross_entropy_with_logits(model(fake, b.token_type_ids, b.attention_mask), labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.optim.clip_norm)
        opt.step()
        if (step + 1) % eval_every == 0:
            curve[step + 1] = evaluate(model, src)["auc_matched"]
            if curve[step + 1] >= stop_at:
                break
    return curve


# -------------------------------------------------------------------------------------------------- the grammar as text
def write_corpus(data: str, out: Path, documents: int = 2000, words: int = 300, seed: int = 0) -> Path:
    """The grammar as a text corpus for `tinyelectra prepare` (full ELECTRA runs on it): every id a made-up word of
    two syllables, a document one walk of `words` words in lines of 30, documents between blank lines."""
    g = grammar_from_name(data)
    rng = np.random.default_rng(seed)
    syllables = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]
    names = rng.choice([a + b for a in syllables for b in syllables], g.vocab_size, replace=False)
    ids = g.rows(documents, words + 2, rng)[:, 1:-1].numpy()  # drop [CLS]/[SEP]
    text = "\n\n".join("\n".join(" ".join(names[i] for i in doc[k:k + 30]) for k in range(0, words, 30)) for doc in ids)
    out.write_text(text + "\n", encoding="utf-8")
    return out


# -------------------------------------------------------------------------------------------- what a trained model uses
@torch.no_grad()
def attention_offsets(net: Net, ids: Tensor, types: Tensor, mask: Tensor) -> list[dict]:
    """Per layer: the mean attention probability (over heads, queries and rows) on the query's own position and on
    its left and right neighbours (uniform attention puts 1 / T on each), the spread of the attention logits, and
    the attention's entropy over that of uniform attention (1 = uniform, 0 = every query on one key)."""
    net.eval()
    x = net.word(ids) + net.position.weight[: ids.shape[1]]
    if net.token_type is not None:
        x = x + net.token_type(types)
    if net.emb_norm is not None:
        x = net.emb_norm(x)
    if net.project is not None:
        x = net.project(x)
    out = []
    B, T, H = x.shape
    for block in net.layers:
        h = block.norm1(x) if net.s.norm == "pre" else x
        q, k, _ = block.qkv(h).view(B, T, 3, net.s.heads, H // net.s.heads).permute(2, 0, 3, 1, 4)
        logits = q @ k.transpose(-1, -2) / math.sqrt(H // net.s.heads)  # (B, nh, T, T)
        p = logits.softmax(-1)
        entropy = float(-(p * p.clamp_min(1e-30).log()).sum(-1).mean() / math.log(T))  # 1 = uniform, 0 = one key
        diag = {name: float(torch.diagonal(p, offset=o, dim1=-2, dim2=-1).mean()) for name, o in
                (("left", -1), ("self", 0), ("right", 1))}
        out.append({k: round(v, 4) for k, v in diag.items()} | {"uniform": round(1.0 / T, 4),
                   "logit_std": round(float(logits.std()), 3), "entropy_over_uniform": round(entropy, 3),
                   "max_head_left_or_right": round(
                       max(float(torch.diagonal(p[:, h_], offset=o, dim1=-2, dim2=-1).mean())
                           for h_ in range(net.s.heads) for o in (-1, 1)), 4)})
        x = block(x, None)
    return out


def analyse(args) -> dict:
    """For each saved (data, arm, step): attention on the neighbours per layer, and the held-out matched AUC with
    the position embeddings replaced by their mean (what the model loses without word order)."""
    torch.set_num_threads(1)
    out = {}
    for path in sorted((WEIGHTS / "weights").glob("*.pt")):
        key, arm, step = path.stem.split("__")
        m = re.fullmatch(r"(.+?)(?:-b(\d+)t(\d+))?", key)
        data, T = m[1], int(m[3]) if m[3] else default_seq_len(m[1])
        arm = arm.replace("impl_", "impl:")
        if arm.startswith("impl:") or arm not in arms():
            continue
        s = arms()[arm][1]
        src = Source(data, args.enwiki, args.batch_size, T, args.eval_rows, args.seed)
        net = Net(s, src.vocab_size, max(src.seq_len, 128))
        net.load_state_dict(torch.load(path))
        b = src.val[0]
        auc = evaluate(net, src)["auc_matched"]
        att = attention_offsets(net, src.val_fake[0][0], b.token_type_ids, b.attention_mask)
        with torch.no_grad():  # every position the mean position vector: the model without word order
            mean = net.position.weight[: src.seq_len].mean(0, keepdim=True)
            net.position.weight.copy_(mean.expand_as(net.position.weight))
        out[f"{key}/{arm}/{step}"] = {"auc_matched": auc,
                                      "auc_matched_positions_averaged": evaluate(net, src)["auc_matched"],
                                       "attention": att}
        print(path.stem, json.dumps(out[f"{key}/{arm}/{step}"]), flush=True)
    return out


# ---------------------------------------------------------------------------------------------------- the table
LEFT_AT = 0.6  # matched AUC that counts as "left the plateau" (no-context discriminators measure 0.46-0.53)


def left_step(evals: list[dict]) -> int | None:
    """The first evaluated step whose matched AUC reaches LEFT_AT and stays there at every later evaluation."""
    for i, e in enumerate(evals):
        if all(x["auc_matched"] >= LEFT_AT for x in evals[i:]):
            return e["step"]
    return None


SECTIONS = [
    ("The two ends, and the real implementations", ["plain", "impl:torch", "electra", "impl:tinyelectra",
                                                    "impl:transformers"]),
    ("From the plain end, one of ELECTRA's choices at a time", [f"plain+{k}" for k in SWITCHES] + ["plain-dropout"]),
    ("From ELECTRA's end, one choice back to the plain encoder's at a time",
     [f"electra-{k}" for k in SWITCHES] + ["electra-dropout", "electra-init-act", "electra-act-norm"]),
    ("The walk: the plain encoder turned into ELECTRA's discriminator one choice at a time (cumulative)",
     ["plain", "plain+init", "walk2", "walk3", "walk4", "walk5", "electra-act", "electra"]),
    ("ELECTRA's discriminator and the optimizer (torch AdamW unless said)",
     ["electra-lr1e-4", "electra-lr3e-4", "electra", "electra-lr3e-3", "electra-warmup0", "electra-warmup1000",
      "electra-wd0", "electra-paperadam", "electra-std0.05", "electra-std0.1", "plain-lr3e-3"]),
    ("At tiny's optimizer (the paper's Adam, eps 1e-6, peak 3e-3), and the opt-in",
     ["plain-recipeopt"] + [f"plain-recipeopt+{k}" for k in SWITCHES]
     + ["electra-recipeopt", "electra-recipeopt-act", "electra-recipeopt-init", "electra-recipeopt-init-act",
        "electra-recipeopt-norm", "electra-recipeopt-act-norm", "electra-act-lr3e-3", "electra-act-paperadam",
        "electra-recipeopt-lr3e-4", "electra-recipeopt-lr5e-4", "electra-recipeopt-lr3e-4-act",
        "electra-recipeopt-lr1e-3-act", "electra-recipeopt-lr3e-4-L2", "electra-recipeopt-body0.1"]),
]
STEPS_SHOWN = [200, 400, 600, 1000, 1500, 2000]


def report(args) -> Path:
    """benchmarks/lab/results/plateau_cpu.json and .md from every run file: the tables, then every run's curve."""
    runs = [json.loads(p.read_text()) for p in sorted(RUNS.glob("*.json"))]
    for r in runs:
        r.setdefault("key", r["data"])
    by = {(r["key"], r["arm"]): r for r in runs}
    listed = [a for _, names in SECTIONS for a in names]
    sections = SECTIONS + [("Other arms", [a for a in arms() if a not in listed])]
    extra = {name: json.loads((RESULTS / f"{name}.json").read_text()) if (RESULTS / f"{name}.json").exists() else None
             for name in ("plateau_check_cpu", "plateau_attention_cpu")}
    payload = {"what": "replaced-token detection alone on unigram replacements, one switch at a time between a plain "
                       "pre-LN encoder and ELECTRA's discriminator (tiny's shape): held-out AUC matched by token id",
               "left_plateau_at_matched_auc": LEFT_AT,
               "arms": {a: {"what": w, "spec": dataclasses.asdict(sp)} for a, (w, sp) in arms().items()
                        if any(r["arm"] == a for r in runs)},
               "runs": runs, **extra}
    path = write_result("plateau_cpu", payload, out_dir=RESULTS, command=args.command)
    groups = {}  # table name -> data keys
    for k in sorted({r["key"] for r in runs}):
        name = re.sub(r"^grammar\d+", "grammar", k)  # the grammar's seeds in one table
        groups.setdefault(name, []).append(k)
    lines = ["# Why ELECTRA's discriminator sits at its prior: one choice at a time", "",
             findings(path.with_suffix(".md"), payload["what"]), "",
             payload["what"] + ". Cells: held-out AUC matched by token id (0.5 = no context), the mean over the runs "
             "that reached the step (their number in brackets when not all); \"left at\": each run's first evaluated "
             f"step from which it stays >= {LEFT_AT} (\"-\": never within the run). Machine, commit and command of "
             f"each run: plateau_cpu.json (`runs`); these tables: commit {git_commit()[:7]}, `{args.command}`.", ""]
    for gname, keys in sorted(groups.items(), key=lambda kv: (kv[0] != "grammar", kv[0].startswith("enwiki"), kv[0])):
        first = by[next((k, r["arm"]) for r in runs for k in keys if r["key"] == k)]
        lines += [f"## {gname}: {', '.join(keys)} ({first['batch_size']} rows of {first['seq_len']} tokens a step)", ""]
        for title, names in sections:
            present = [a for a in names if any((k, a) in by for k in keys)]
            if not present:
                continue
            lines += [f"**{title}**", "",
                      "| arm | what | " + " | ".join(str(st) for st in STEPS_SHOWN) + " | left at |",
                      "|---|---|" + "---|" * (len(STEPS_SHOWN) + 1)]
            for a in present:
                mine = [by[(k, a)] for k in keys if (k, a) in by]
                cells = []
                for st in STEPS_SHOWN:
                    v = [e["auc_matched"] for r in mine for e in r["evals"] if e["step"] == st]
                    cells.append("-" if not v
                                 else f"{sum(v) / len(v):.3f}" + ("" if len(v) == len(mine) else f" ({len(v)})"))
                left = ", ".join(("-" if left_step(r["evals"]) is None else str(left_step(r["evals"])))
                                 + ("" if r["finished"] else " (unfinished)") for r in mine)
                lines.append(f"| {a} | {arms()[a][0]} | " + " | ".join(cells) + f" | {left} |")
            lines.append("")
    att = extra["plateau_attention_cpu"]
    if att:
        lines += ["## What the attention looks like (grammar0's held-out rows, trained weights)", "",
                  "Per layer: the spread (std) of the attention logits and the attention's entropy over uniform "
                  "attention's (1.00 = uniform, 0 = every query on one key); the matched AUC, and the same with every "
                  "position vector replaced by their mean (no word order). `plateau_attention_cpu.json`.", "",
                  "| model (arm / step) | matched AUC | without word order | logit std by layer | entropy / uniform by "
                  "layer |",
                  "|---|---|---|---|---|"]
        for name, m in att["models"].items():
            if not name.startswith("grammar0/"):
                continue
            lines.append(f"| {name.removeprefix('grammar0/')} | {m['auc_matched']:.3f} | "
                         f"{m['auc_matched_positions_averaged']:.3f} | "
                         + " / ".join(f"{x['logit_std']:.2f}" for x in m["attention"]) + " | "
                         + " / ".join(f"{x['entropy_over_uniform']:.2f}" for x in m["attention"]) + " |")
        lines.append("")
    lines += ["## Every run's curve (matched AUC at each evaluated step)", ""]
    for r in runs:
        lines.append(f"- {r['key']} / {r['arm']}: "
                     + ", ".join(f"{e['step']}: {e['auc_matched']:.3f}" for e in r["evals"]))
    md = path.with_suffix(".md")
    md.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return md


def findings(md: Path, next_paragraph: str) -> str:
    """The "## Findings" section written by hand into the report (what the tables show), up to `next_paragraph`, the
    first one this writes after it: kept when the tables are written again; a placeholder in a new report."""
    text = md.read_text(encoding="utf-8") if md.exists() else ""
    start = text.find("## Findings")
    end = text.find(next_paragraph, start)
    if start < 0 or end < 0:
        return "## Findings\n\n(to be written from the tables below)"
    return text[start:end].rstrip()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=("run", "one", "check", "analyse", "report", "corpus", "tiny", "prior"))
    ap.add_argument("--arms", type=lambda t: t.split(","), default=list(arms()))
    ap.add_argument("--arm")
    ap.add_argument("--data", default="grammar0,grammar1,grammar2,enwiki")
    ap.add_argument("--enwiki", type=Path, default=Path("data/enwiki10-v8k"))
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--seq-len", type=int, default=None, help="tokens a row (default 32 on a grammar, the first 64 of "
                    "an enwiki row)")
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--eval-rows", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--save-at", type=lambda t: [int(x) for x in t.split(",") if x], default=[],
                    help="steps whose weights to keep")
    ap.add_argument("--out", type=Path, help="corpus: the text file to write")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="tiny: a recipe override")
    ap.add_argument("--command", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.command = args.command or command_line("benchmarks.lab.plateau", sys.argv[1:] if argv is None else argv)
    if args.mode == "one":
        train_one(args, args.arm, args.data)
    elif args.mode == "analyse":
        print(write_result("plateau_attention_cpu", {"what": "trained weights (runs/plateau/weights) on grammar0's "
                           "held-out rows: attention per layer, and the matched AUC with every position vector "
                           "replaced by their mean", "models": analyse(args)}, out_dir=RESULTS, command=args.command))
    elif args.mode == "tiny":  # the tiny recipe itself, as tests/test_plateau.py runs it: one curve per --data
        path = RESULTS / "plateau_test_config_cpu.json"
        runs = json.loads(path.read_text())["runs"] if path.exists() else []
        torch.set_num_threads(1)
        for data in args.data.split(","):
            t0 = time.perf_counter()
            curve = tiny_curve(args.set, args.steps, args.batch_size, 0.7, data, args.seed)
            runs.append({"overrides": args.set, "data": data, "seed": args.seed, "batch_size": args.batch_size,
                         "seconds": round(time.perf_counter() - t0, 1), "command": args.command, "curve": curve})
            write_result("plateau_test_config_cpu", {"what": "the tiny recipe's discriminator alone (tinyelectra's "
                         "Electra, the recipe's optimizer with the overrides), rows of 32 tokens of the grammar, "
                         "held-out AUC matched by token id every 100 steps until it reaches "
                         "0.7", "runs": runs}, out_dir=RESULTS,
                         command=args.command)
    elif args.mode == "prior":  # full runs' discriminator loss against its all-original loss, as the GPU suite reads it
        from benchmarks.gpu_check import suite  # noqa: PLC0415

        out = {}
        for d in args.data.split(","):
            records = [json.loads(line) for line in (Path(d) / "metrics.jsonl").read_text().splitlines()
                       if line.strip()]
            out[d] = suite.along_the_run([r for r in records if "disc_loss" in r], {})
        print(write_result(args.out.stem if args.out else "plateau_prior_cpu", {"what": "each run's training "
                           "discriminator loss over its all-original loss (suite.along_the_run)", "runs": out},
                           out_dir=RESULTS, command=args.command))
    elif args.mode == "corpus":
        print(write_corpus(args.data, args.out))
    elif args.mode == "check":
        doc = write_result("plateau_check_cpu", check(args), out_dir=RESULTS, command=args.command)
        print(doc.read_text())
    elif args.mode == "report":
        print(report(args))
    elif args.mode == "run":
        args.data = args.data.split(",")
        run_all(args)


if __name__ == "__main__":
    run_main(main)
