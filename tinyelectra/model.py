"""The ELECTRA networks: embeddings, the post-LN transformer encoder, and the three heads.

What lives here: modules and their forward passes, nothing about masking, sampling or losses (electra.py) and
nothing about transformers' weight names (hf.py). Shapes: B batch, T tokens, N masked slots per row,
V vocabulary, E embedding width, H hidden width.

- `Embeddings`: token + position + type embeddings (width E), LayerNorm, dropout. Shared by generator and
  discriminator in the paper's setting.
- `Encoder`: a linear projection E -> H when E != H, then post-LN blocks (attention through
  `F.scaled_dot_product_attention`, GELU feed-forward).
- `Electra`: the pre-training model: shared embeddings, a discriminator (encoder + binary head) and a generator
  (a narrower encoder + MLM head tied to the word embeddings, evaluated only at the masked positions). With
  `objective="mlm"` it is BERT's masked LM: one full-size encoder with the MLM head and no discriminator.
- `Classifier`: embeddings + encoder + [CLS] -> dropout -> linear, for fine-tuning.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from tinyelectra.config import ModelConfig
from tinyelectra.errors import UserError
from tinyelectra.runtime import (Linear, card_of, card_policy, cpu_fast_path, dropout, linear, read_weight,
                                 sdpa_kernel)


class Embeddings(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        E = cfg.embedding_size
        self.word = nn.Embedding(cfg.vocab_size, E)
        self.position = nn.Embedding(cfg.max_positions, E)
        self.token_type = nn.Embedding(cfg.type_vocab_size, E)
        self.norm = nn.LayerNorm(E, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, input_ids: Tensor, token_type_ids: Tensor) -> Tensor:
        T = input_ids.shape[1]
        x = self.word(input_ids) + self.token_type(token_type_ids) + self.position.weight[:T]  # (B, T, E)
        return dropout(self.norm(x), self.dropout.p, self.training)


class Block(nn.Module):
    """Post-LN transformer block: x = LN(x + Attn(x)); x = LN(x + FFN(x)), as BERT and ELECTRA."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        H = cfg.hidden_size
        self.num_heads = cfg.num_heads
        self.qkv = Linear(H, 3 * H)  # fused query/key/value: one matmul instead of three
        self.attn_out = Linear(H, H)
        self.norm1 = nn.LayerNorm(H, eps=cfg.layer_norm_eps)
        self.ffn_in = Linear(H, cfg.ffn_size)
        self.ffn_out = Linear(cfg.ffn_size, H)
        self.norm2 = nn.LayerNorm(H, eps=cfg.layer_norm_eps)
        self.dropout_p = cfg.dropout
        self.attention_dropout_p = cfg.attention_dropout

    def forward(self, x: Tensor, attn_mask: Tensor | None, cu_seqlens: Tensor | None = None) -> Tensor:
        """`attn_mask` (B, 1, 1, T) bool or None; or `cu_seqlens` (`row_segments`): the rows' lengths instead."""
        B, T, H = x.shape
        nh = self.num_heads
        p_attn = self.attention_dropout_p if self.training else 0.0
        if cu_seqlens is not None:  # the tokens of all rows as one packed sequence (B*T, nh, hd), no transposes
            q, k, v = self.qkv(x).view(B * T, 3, nh, H // nh).unbind(1)
            a = varlen_attention(q, k, v, cu_seqlens, T, p_attn).reshape(B, T, H)
        else:
            q, k, v = self.qkv(x).view(B, T, 3, nh, H // nh).permute(2, 0, 3, 1, 4)  # each (B, nh, T, hd)
            a = _attention(q, k, v, attn_mask, p_attn)  # (B, nh, T, hd)
            a = a.transpose(1, 2).reshape(B, T, H)
        p = self.dropout_p if self.training else 0.0
        x = self.norm1(x + dropout(self.attn_out(a), p, self.training))
        h = F.gelu(self.ffn_in(x))  # exact (erf) GELU, as BERT/ELECTRA and transformers' "gelu"
        return self.norm2(x + dropout(self.ffn_out(h), p, self.training))


class Encoder(nn.Module):
    """Projection E -> H (when E != H) and the stack of blocks; embeddings are passed in, so they can be shared."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        E, H = cfg.embedding_size, cfg.hidden_size
        self.project = Linear(E, H) if E != H else None
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.num_layers))
        self.grad_checkpointing = False
        self.attention = "mask"  # train.attention: "mask" | "varlen" (padded rows by their lengths: `row_segments`)

    def forward(self, embedded: Tensor, attention_mask: Tensor | None) -> Tensor:
        x = self.project(embedded) if self.project is not None else embedded  # (B, T, H)
        attn_mask = cu_seqlens = None
        if attention_mask is not None and self.attention == "varlen":
            cu_seqlens = row_segments(attention_mask)
        elif attention_mask is not None:
            attn_mask = attention_mask[:, None, None, :]  # (B, 1, 1, T) True = attend
        for layer in self.layers:
            if self.grad_checkpointing and self.training:
                x = checkpoint(layer, x, attn_mask, cu_seqlens, use_reentrant=False)
            else:
                x = layer(x, attn_mask, cu_seqlens)
        return x


class DiscriminatorHead(nn.Module):
    """dense(H) -> GELU -> dense(1): one replaced/original logit per token."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.dense = Linear(hidden_size, hidden_size)
        self.out = Linear(hidden_size, 1)

    def forward(self, h: Tensor) -> Tensor:
        return self.out(F.gelu(self.dense(h))).squeeze(-1)  # (B, T)


class GeneratorHead(nn.Module):
    """dense(H -> E) -> GELU -> LayerNorm -> tied word-embedding matrix + bias (the logits over V)."""

    word_copy: Tensor | None = None  # low-precision copies (runtime.WeightCopies) of the tied matrix and the bias
    bias_copy: Tensor | None = None

    def __init__(self, hidden_size: int, embedding_size: int, vocab_size: int, eps: float) -> None:
        super().__init__()
        self.dense = Linear(hidden_size, embedding_size)
        self.norm = nn.LayerNorm(embedding_size, eps=eps)
        self.bias = nn.Parameter(torch.zeros(vocab_size))

    def forward(self, h: Tensor, word_embeddings: Tensor) -> Tensor:
        x = self.norm(F.gelu(self.dense(h)))  # (..., E)
        w, b = read_weight(word_embeddings, self.word_copy), read_weight(self.bias, self.bias_copy)
        return linear(x, w, b)  # (..., V)


class Electra(nn.Module):
    """Generator + discriminator sharing embeddings (objective "electra"), or a masked LM alone ("mlm")."""

    def __init__(self, cfg: ModelConfig, objective: str = "electra") -> None:
        super().__init__()
        if objective not in ("electra", "mlm"):
            raise UserError(f"unknown objective {objective!r} (electra or mlm)")
        self.cfg = cfg
        self.objective = objective
        self.embeddings = Embeddings(cfg)
        if objective == "mlm":
            # BERT: the full-size encoder is the "generator" (it carries the MLM head); nothing to discriminate.
            self.gen_cfg = dataclasses.replace(cfg, generator_fraction=1.0, sharing="embeddings")
            self.generator = Encoder(self.gen_cfg)
            self.discriminator = None
            self.disc_head = None
            self.gen_embeddings = None
        else:
            self.gen_cfg = cfg.generator()
            self.discriminator = Encoder(cfg)
            self.disc_head = DiscriminatorHead(cfg.hidden_size)
            # sharing "all": the generator *is* the discriminator's encoder (same size), not a second module
            self.generator = None if cfg.sharing == "all" else Encoder(self.gen_cfg)
            self.gen_embeddings = Embeddings(self.gen_cfg) if cfg.sharing == "none" else None
        self.gen_head = GeneratorHead(self.gen_cfg.hidden_size, self.gen_cfg.embedding_size, cfg.vocab_size,
                                      cfg.layer_norm_eps)
        self.apply(init_weights)

    @property
    def generator_encoder(self) -> Encoder:
        return self.generator if self.generator is not None else self.discriminator

    @property
    def generator_embeddings(self) -> Embeddings:
        return self.gen_embeddings if self.gen_embeddings is not None else self.embeddings

    @property
    def backbone(self) -> Encoder:
        """The encoder a downstream task fine-tunes: the discriminator (ELECTRA) or the MLM encoder (BERT)."""
        return self.discriminator if self.discriminator is not None else self.generator

    def set_grad_checkpointing(self, enabled: bool) -> None:
        for enc in {id(e): e for e in (self.discriminator, self.generator) if e is not None}.values():
            enc.grad_checkpointing = enabled

    def set_attention(self, kind: str) -> None:
        """train.attention: "mask" (a boolean padding mask to SDPA) or "varlen" (padded batches by their rows' lengths:
        `varlen_attention`). The same mathematics for every real token; a choice of kernels, not of weights."""
        if kind not in ATTENTION_KINDS:
            raise UserError(f"train.attention {kind!r}: use {' or '.join(ATTENTION_KINDS)}")
        device = next(self.parameters()).device
        if kind == "varlen" and device.type == "cuda":
            head_dims = [c.hidden_size // c.num_heads for c in (self.cfg, self.gen_cfg)]
            if why := varlen_blocker(card_of(device).capability, head_dims):
                raise UserError(f"train.attention=varlen: {why}; use train.attention=mask")
        for enc in {id(e): e for e in (self.discriminator, self.generator) if e is not None}.values():
            enc.attention = kind

    def generator_logits(self, input_ids: Tensor, token_type_ids: Tensor, attention_mask: Tensor | None,
                         positions: Tensor) -> Tensor:
        """MLM logits only at `positions` (B, N): (B, N, V). The full-vocabulary product is never formed at all T.
        `attention_mask` None: no padding anywhere (no mask reaches attention)."""
        emb = self.generator_embeddings
        h = self.generator_encoder(emb(input_ids, token_type_ids), attention_mask)  # (B, T, Hg)
        idx = positions.unsqueeze(-1).expand(-1, -1, h.shape[-1])  # (B, N, Hg)
        return self.gen_head(torch.gather(h, 1, idx), emb.word.weight)  # (B, N, V)

    def discriminator_logits(self, input_ids: Tensor, token_type_ids: Tensor, attention_mask: Tensor | None) -> Tensor:
        """Replaced-token logits for every token: (B, T)."""
        assert self.discriminator is not None and self.disc_head is not None, "an MLM model has no discriminator"
        h = self.discriminator(self.embeddings(input_ids, token_type_ids), attention_mask)
        return self.disc_head(h)

    def matmul_weights(self) -> list[tuple[nn.Module, str, Tensor]]:
        """Every weight a matmul reads, as (module, attribute of its low-precision copy, weight), for
        train.weight_copy=copy (runtime.WeightCopies): each Linear's weight and bias, the generator head's tied word
        embeddings and bias."""
        linears = [(m, f"{n}_copy", getattr(m, n)) for m in self.modules() if isinstance(m, Linear)
                   for n in ("weight", "bias") if getattr(m, n) is not None]
        head = self.gen_head
        return linears + [(head, "word_copy", self.generator_embeddings.word.weight), (head, "bias_copy", head.bias)]

    def discriminator_state_dict(self) -> dict[str, Tensor]:
        """Embeddings + discriminator encoder + binary head (what `discriminator.safetensors` holds)."""
        return _prefixed(self, ("embeddings.", "discriminator.", "disc_head."))

    def generator_state_dict(self) -> dict[str, Tensor]:
        """What `generator.safetensors` holds: the embeddings it reads, its encoder and the MLM head."""
        sd = _prefixed(self, ("embeddings.", "gen_embeddings.", "generator.", "gen_head."))
        # sharing "all": the encoder is the discriminator's
        if self.generator is None and self.discriminator is not None:
            sd.update({"generator." + k[len("discriminator."):]: v
                       for k, v in _prefixed(self, ("discriminator.",)).items()})
        return sd

    def load_split_state_dict(self, disc: dict[str, Tensor] | None, gen: dict[str, Tensor]) -> None:
        """Inverse of the two methods above (strict: a missing or unexpected tensor is an error)."""
        merged = dict(gen)
        if self.generator is None:
            merged = {k: v for k, v in merged.items() if not k.startswith("generator.")}
        if disc is not None:
            merged.update(disc)
        self.load_state_dict(merged, strict=True)


class Classifier(nn.Module):
    """A fine-tuning model: embeddings + encoder + ([CLS] -> dropout -> linear), the paper's head (not HF's 2-layer
    one)."""

    def __init__(self, cfg: ModelConfig, num_labels: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.embeddings = Embeddings(cfg)
        self.encoder = Encoder(cfg)
        self.dropout = nn.Dropout(cfg.dropout)
        self.head = nn.Linear(cfg.hidden_size, num_labels)
        self.apply(init_weights)

    def forward(self, input_ids: Tensor, token_type_ids: Tensor, attention_mask: Tensor) -> Tensor:
        h = self.encoder(self.embeddings(input_ids, token_type_ids), attention_mask)  # (B, T, H)
        return self.head(self.dropout(h[:, 0]))  # (B, num_labels); regression when num_labels == 1

    def load_backbone(self, embeddings: dict[str, Tensor], encoder: dict[str, Tensor]) -> None:
        """Load pre-trained weights (keys relative to the Embeddings / Encoder modules); the head stays fresh."""
        self.embeddings.load_state_dict(embeddings, strict=True)
        self.encoder.load_state_dict(encoder, strict=True)


def _attention(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None, dropout_p: float) -> Tensor:
    """softmax(q k^T / sqrt(hd) + mask) -> dropout -> @ v, for q, k, v (B, nh, T, hd) and a bool mask (True = attend)
    broadcastable to (B, nh, T, T).

    F.scaled_dot_product_attention everywhere (flash / memory-efficient kernels on GPU, the fused CPU kernel without
    dropout), except CPU training with attention dropout: there SDPA falls back to its unfused math path, and this
    one does the same mathematics with fewer passes (one baddbmm for scale + mask, a plain softmax, runtime's
    dropout with its cheaper random numbers)."""
    if dropout_p == 0.0 or not cpu_fast_path(q):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p)
    B, nh, T, hd = q.shape
    q3, k3, v3 = (t.reshape(B * nh, T, hd) for t in (q, k, v))  # (B*nh, T, hd)
    if attn_mask is None:
        scores = torch.bmm(q3, k3.transpose(1, 2)).mul_(hd**-0.5)  # (B*nh, T, T)
    else:
        bias = torch.zeros(attn_mask.shape, dtype=q.dtype).masked_fill_(~attn_mask, torch.finfo(q.dtype).min)
        bias = bias.expand(B, nh, *attn_mask.shape[-2:]).reshape(B * nh, -1, attn_mask.shape[-1])  # (B*nh, 1|T, T)
        scores = torch.baddbmm(bias, q3, k3.transpose(1, 2), alpha=hd**-0.5)  # (B*nh, T, T)
    probs = dropout(scores.softmax(-1), dropout_p, True)
    return torch.bmm(probs, v3).view(B, nh, T, hd)


ATTENTION_KINDS = ("mask", "varlen")


def row_segments(attention_mask: Tensor) -> Tensor:
    """The rows of a padded batch as variable-length sequences, for rows whose real tokens come first (as the data
    builder and the GLUE batches lay them out): cu_seqlens (2B + 1,) int32 over the B*T tokens taken as one packed
    sequence: row b's real tokens [bT, bT + n_b) are one sequence and its padding [bT + n_b, (b + 1)T) another (empty
    for a full row). Static shape, no host sync. Padding attends only to padding, so no row is ever fully masked and
    real tokens see exactly what the boolean mask lets them see; the losses weigh padding 0, so the loss and every
    gradient are the masked path's."""
    B, T = attention_mask.shape
    starts = torch.arange(B, device=attention_mask.device) * T  # (B,)
    ends = torch.stack([starts + attention_mask.sum(1), starts + T], 1).flatten()  # (2B,)
    return F.pad(ends, (1, 0)).to(torch.int32)


def varlen_blocker(capability: tuple[int, int], head_dims: list[int]) -> str:
    """Why FlashAttention's variable-length kernel cannot run on a GPU of this compute capability with these head
    sizes ("" when it can): it needs an Ampere or newer GPU and head sizes that are multiples of 8 up to 256."""
    if not card_policy(capability).flash:
        return ("FlashAttention needs an Ampere or newer GPU (compute capability 8.0+), "
                f"this one is {capability[0]}.{capability[1]}")
    bad = sorted({d for d in head_dims if d % 8 or d > 256})
    return f"FlashAttention needs head sizes that are multiples of 8 up to 256, not {bad}" if bad else ""


def varlen_attention(q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor, seq_len: int, dropout_p: float) -> Tensor:
    """softmax(q k^T / sqrt(hd)) -> dropout -> @ v within each sequence of `cu_seqlens` (`row_segments`), for q, k, v
    (B*T, nh, hd) packed rows of `seq_len` tokens: (B*T, nh, hd).

    CUDA in bf16/fp16: FlashAttention's variable-length kernel (aten._flash_attention_forward with cu_seqlens, the
    kernel of torch.nn.attention.varlen, called directly because varlen_attn fixes its dropout at 0 and the paper's
    attention dropout is 0.1; its backward is torch's own). Elsewhere (the CPU, fp32): the same sequences as a
    boolean mask per row (B, 1, T, T) through `_attention`: the reference, no faster than the padding mask."""
    if q.is_cuda and q.dtype in (torch.float16, torch.bfloat16):
        return torch.ops.aten._flash_attention_forward(q, k, v, cu_seqlens, cu_seqlens, seq_len, seq_len, dropout_p,
                                                       False, False)[0]
    BT, nh, hd = q.shape
    B = BT // seq_len
    token = torch.arange(BT, device=q.device, dtype=cu_seqlens.dtype)
    seq = torch.searchsorted(cu_seqlens[1:], token, right=True).view(B, 1, seq_len)  # (B, 1, T) sequence of each token
    q4, k4, v4 = (t.view(B, seq_len, nh, hd).transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hd)
    out = _attention(q4, k4, v4, seq.unsqueeze(-1) == seq.unsqueeze(-2), dropout_p)  # mask (B, 1, T, T)
    return out.transpose(1, 2).reshape(BT, nh, hd)


def attention_kernel(cfg: ModelConfig, batch: int, seq_len: int, device: torch.device, dtype: torch.dtype,
                     training: bool = True, compiled: bool = False, attention: str = "mask") -> dict:
    """Which attention kernel the discriminator's (and the generator's) blocks run for a (batch, seq_len) batch, for
    logs, summary.json and benchmarks: `_attention` with the encoder's boolean padding mask (B, 1, 1, T) and, when
    training, the attention dropout; and ("without_padding") for a batch without padding, which passes no mask
    (electra.Masked.full). Asks torch's own dispatcher (`runtime.sdpa_kernel`) with tensors of the real shapes and
    `dtype` (the autocast dtype under mixed precision).

    FlashAttention takes no attention mask, so with `attention` "mask" it runs only for batches without padding: with
    the mask the choice is between the memory-efficient, cuDNN and math kernels (benchmarks/NOTES.md, "attention").
    With "varlen" (train.attention) padded batches go by their rows' lengths (`varlen_attention`)."""
    def one(c: ModelConfig, masked: bool) -> dict:
        p = c.attention_dropout if training else 0.0
        hd = c.hidden_size // c.num_heads
        if masked and attention == "varlen":
            why = "FlashAttention's varlen kernel needs an Ampere+ GPU (8.0+) and bf16/fp16"
            if device.type == "cuda" and dtype in (torch.float16, torch.bfloat16):
                why = varlen_blocker(card_of(device).capability, [hd])
            if not why:
                return {"kernel": "flash (variable length: the rows' lengths)", "flash_eligible": True,
                        "why_not_flash": None}
            return {"kernel": "tinyelectra's variable-length reference (the rows' sequences as a (B, 1, T, T) mask)",
                    "flash_eligible": False, "why_not_flash": why}
        if device.type == "cpu" and p > 0.0 and not compiled:
            return {"kernel": "tinyelectra's CPU attention (one baddbmm for scale + mask, softmax, dropout, bmm): "
                              "SDPA would take its unfused math path with dropout", "flash_eligible": False,
                    "why_not_flash": "attention dropout on the CPU"}
        q = torch.zeros(batch, c.num_heads, seq_len, hd, device=device, dtype=dtype)
        mask = torch.ones(batch, 1, 1, seq_len, device=device, dtype=torch.bool) if masked else None
        return sdpa_kernel(q, q, q, mask, p)

    gen_cfg = cfg.generator()
    disc, gen = one(cfg, True), one(gen_cfg, True)
    how = "bool (B, 1, 1, T), True = attend" if attention == "mask" else "the rows' lengths (cu_seqlens, 2B + 1)"
    out = {"discriminator": disc, "generator": gen, "mask": how,
           "without_padding": {"discriminator": one(cfg, False), "generator": one(gen_cfg, False), "mask": "none"},
           "dropout": cfg.attention_dropout if training else 0.0, "dtype": str(dtype).replace("torch.", "")}
    same = disc["kernel"] == gen["kernel"]
    where = " on the CPU" if device.type == "cpu" else ""
    out["summary"] = f"attention{where}: {disc['kernel']}" + ("" if same else f" (generator: {gen['kernel']})")
    unpadded = out["without_padding"]["discriminator"]["kernel"]
    if unpadded != disc["kernel"]:
        out["summary"] += f"; batches without padding (no mask): {unpadded}"
    return out


def init_weights(module: nn.Module) -> None:
    """BERT/ELECTRA initialisation: normal(0, 0.02) weights, zero biases, unit LayerNorm."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)


def _prefixed(model: nn.Module, prefixes: tuple[str, ...]) -> dict[str, Tensor]:
    return {k: v for k, v in model.state_dict().items() if k.startswith(prefixes)}


def count_parameters(module: nn.Module) -> int:
    """Distinct trainable parameters (a tied tensor counts once)."""
    return sum(p.numel() for p in {id(p): p for p in module.parameters()}.values())
