"""Tokenizers for pre-training: train a BERT-style WordPiece, or load a vocab.txt, tokenizer.json or SentencePiece model.

One `Tokenizer` class wraps either a Hugging Face `tokenizers.Tokenizer` (WordPiece, or whatever a tokenizer.json
holds) or a `sentencepiece.SentencePieceProcessor` (used as-is: its own normalization, no lower-casing), and gives
the rest of tinyelectra one surface: the five special ids, `encode_batch`, `decode`, `save`, `fingerprint`.

WordPiece ids follow BERT's vocabulary for every size: [PAD]=0, [unused0..98]=1..99, [UNK]=100, [CLS]=101,
[SEP]=102, [MASK]=103, so checkpoints trained on different vocab sizes agree on the special ids.
What does not live here: reading corpora and building examples (data.py, corpus.py).
"""

from __future__ import annotations

import hashlib
import json
import re
from itertools import chain
from pathlib import Path
from typing import Iterable

from tinyelectra.errors import UserError

# BERT's first 104 ids, in order. Extra entries needed to reach an exact vocab size continue as [unused99], ...
RESERVED_TOKENS: list[str] = ["[PAD]"] + [f"[unused{i}]" for i in range(99)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
SPECIAL_ROLES = ("pad", "unk", "cls", "sep", "mask")
BERT_SPELLING = {"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]"}
SENTENCEPIECE_SPELLING = {"pad": "<pad>", "unk": "<unk>", "cls": "<cls>", "sep": "<sep>", "mask": "<mask>"}
PIECE_CACHE_ENTRIES = 1 << 20  # per process; ~200 MB at most
MIN_VOCAB_SIZE = 200  # 104 reserved ids + room for an alphabet
MAX_VOCAB_SIZE = 2**31 - 1

# BertNormalizer's clean_text on ASCII, as a str.translate table: control characters are dropped, and tab, newline
# and carriage return become a space (tokenizers' bert.rs: filter is_control, then map is_whitespace -> ' ').
_ASCII_CLEAN_TABLE = {i: None for i in [*range(32), 127]}
_ASCII_CLEAN_TABLE.update({ord("\t"): " ", ord("\n"): " ", ord("\r"): " "})
# BertPreTokenizer on clean ASCII: every printable non-alphanumeric character is BERT punctuation (a word of its own).
_ASCII_WORD = re.compile(r"[A-Za-z0-9]+|[^A-Za-z0-9 ]")


def _bert_normalizer(lowercase: bool):
    from tokenizers import normalizers

    # strip_accents follows lowercase, as in BERT: --no-lowercase keeps both case and accents.
    return normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=lowercase, lowercase=lowercase)


def _wordpiece_tokenizer(vocab: dict[str, int], lowercase: bool):
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, processors

    hf = HFTokenizer(models.WordPiece(vocab, unk_token="[UNK]", continuing_subword_prefix="##", max_input_chars_per_word=100))
    hf.normalizer = _bert_normalizer(lowercase)
    hf.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    hf.decoder = decoders.WordPiece(prefix="##")
    if "[CLS]" in vocab and "[SEP]" in vocab:
        # Only used by transformers' AutoTokenizer on the saved files; tinyelectra encodes without special tokens.
        hf.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
            special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
        )
    return hf


class Tokenizer:
    """A trained or loaded tokenizer with BERT's five special tokens. Encodes text without adding special tokens."""

    kind: str  # "wordpiece" | "sentencepiece" (or "bpe"/"unigram"/"wordlevel" for another tokenizer.json model)
    vocab_size: int
    lowercase: bool
    pad_id: int
    unk_id: int
    cls_id: int
    sep_id: int
    mask_id: int
    vocab_padding: int  # [unusedN] entries appended after training so the vocabulary has exactly the requested size

    def __init__(self, hf=None, sp_model_bytes: bytes | None = None, source: str = "") -> None:
        self._hf = hf
        self._sp = None
        self._sp_bytes = sp_model_bytes
        # space-separated piece -> ids (BERT pipelines only); tuples: chain() walks them faster than lists
        self._pieces: dict[str, tuple[int, ...]] | None = None
        self._words: dict[str, tuple[int, ...]] = {}  # normalized ASCII word -> ids (see _encode_new_pieces)
        self.source = source
        self.vocab_padding = 0
        if sp_model_bytes is not None:
            import sentencepiece as spm

            self._sp = spm.SentencePieceProcessor()
            try:
                self._sp.LoadFromSerializedProto(sp_model_bytes)
            except Exception as e:  # sentencepiece raises RuntimeError/OSError on a malformed proto
                raise UserError(f"{source}: not a SentencePiece model ({e})") from None
            self.kind = "sentencepiece"
            self.lowercase = False
            self.vocab_size = self._sp.get_piece_size()
            lookup = self._sp_lookup
        else:
            spec = json.loads(hf.to_str())
            self.kind = str(spec["model"]["type"]).lower()
            self.vocab_size = hf.get_vocab_size(with_added_tokens=True)
            norm = spec.get("normalizer") or {}
            self.lowercase = _lowercases(norm)
            vocab = hf.get_vocab(with_added_tokens=True)
            lookup = vocab.get
            hf.no_truncation()
            hf.no_padding()
            # Piece cache (see _encode_cached): valid when every step before the model splits at spaces.
            added = spec.get("added_tokens") or []
            pre = (spec.get("pre_tokenizer") or {}).get("type")
            if (self.kind == "wordpiece" and norm.get("type") == "BertNormalizer" and norm.get("clean_text", True)
                    and pre == "BertPreTokenizer" and not any(" " in t.get("content", "") for t in added)):
                self._pieces = {}
        for role in SPECIAL_ROLES:
            setattr(self, f"{role}_id", self._find_special(role, lookup, source))

    # ------------------------------------------------------------------ construction
    def _sp_lookup(self, piece: str) -> int | None:
        i = self._sp.piece_to_id(piece)
        # piece_to_id answers unk_id for an unknown piece: check the round trip.
        return i if self._sp.id_to_piece(i) == piece else None

    def _find_special(self, role: str, lookup, source: str) -> int:
        spellings = [BERT_SPELLING[role], SENTENCEPIECE_SPELLING[role]]
        for s in spellings:
            i = lookup(s)
            if i is not None:
                return int(i)
        raise UserError(
            f"tokenizer {source or '(trained)'} has no {spellings[0]} token (also looked for {spellings[1]}); "
            f"ELECTRA needs all five special tokens [PAD], [UNK], [CLS], [SEP], [MASK]"
        )

    @classmethod
    def load(cls, path, lowercase: bool | None = None) -> "Tokenizer":
        """Load a directory written by save(), a vocab.txt, a tokenizer.json or a SentencePiece .model.

        `lowercase` only matters for a bare vocab.txt (which does not record its casing); default True (uncased).
        """
        p = Path(path)
        if not p.exists():
            raise UserError(f"--tokenizer {p}: no such file or directory")
        if p.is_dir():
            for name in ("tokenizer.json", "tokenizer.model", "spiece.model", "sentencepiece.model", "vocab.txt"):
                if (p / name).is_file():
                    return cls.load(p / name, lowercase)
            models = sorted(p.glob("*.model"))
            if models:
                return cls.load(models[0], lowercase)
            raise UserError(f"--tokenizer {p}: directory has no tokenizer.json, vocab.txt or SentencePiece .model")
        if p.suffix == ".model":
            return cls(sp_model_bytes=p.read_bytes(), source=str(p))
        if p.suffix == ".json":
            from tokenizers import Tokenizer as HFTokenizer

            try:
                hf = HFTokenizer.from_file(str(p))
            except Exception as e:  # tokenizers raises a bare Exception on malformed JSON
                raise UserError(f"--tokenizer {p}: not a tokenizers JSON file ({str(e).splitlines()[0][:200]})") from None
            return cls(hf=hf, source=str(p))
        if p.suffix == ".txt":
            return cls(hf=_wordpiece_tokenizer(_read_vocab_txt(p), True if lowercase is None else lowercase), source=str(p))
        raise UserError(f"--tokenizer {p}: expected a vocab.txt, a tokenizer.json or a SentencePiece .model")

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int, lowercase: bool, limit_alphabet: int = 1000) -> "Tokenizer":
        """Train an uncased (or cased) WordPiece with BERT's reserved ids on an iterable of lines."""
        from tokenizers import Tokenizer as HFTokenizer
        from tokenizers import models, pre_tokenizers, trainers

        if not MIN_VOCAB_SIZE <= vocab_size <= MAX_VOCAB_SIZE:
            raise UserError(f"--vocab-size {vocab_size}: must be between {MIN_VOCAB_SIZE} and {MAX_VOCAB_SIZE}")
        normalizer = _bert_normalizer(lowercase)
        # Train on pre-normalized text (normalizer off during training): ASCII lines through str.translate, the rest
        # through the same Rust normalizer, so the word counts are exactly those of the full pipeline.
        lines = []
        for t in texts:
            if t.isascii():
                t = t.translate(_ASCII_CLEAN_TABLE)
                lines.append(t.lower() if lowercase else t)
            else:
                lines.append(normalizer.normalize_str(t))
        # Determinism: tokenizers' trainer gives "##c" continuation tokens ids in hash-map order, and breaks ties
        # between equally frequent merges by id, so two runs can learn different vocabularies
        # (huggingface/tokenizers#1794). We fix the alphabet ourselves (most frequent characters, ties by code point)
        # and register every "##c" up front (as trainer special tokens), so no id depends on hash order.
        alphabet = _alphabet(lines, max(1, min(limit_alphabet, (vocab_size - len(RESERVED_TOKENS)) // 3)))
        hf = HFTokenizer(models.WordPiece(unk_token="[UNK]", continuing_subword_prefix="##"))
        hf.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        trainer = trainers.WordPieceTrainer(
            vocab_size=vocab_size, min_frequency=2, special_tokens=RESERVED_TOKENS + ["##" + c for c in alphabet],
            initial_alphabet=alphabet, limit_alphabet=len(alphabet), continuing_subword_prefix="##", show_progress=False,
        )
        hf.train_from_iterator(lines, trainer, length=len(lines))
        del lines
        learned = hf.get_vocab()
        ordered = sorted(learned, key=learned.__getitem__)
        if ordered[: len(RESERVED_TOKENS)] != RESERVED_TOKENS:  # the trainer puts special tokens first, in order
            raise RuntimeError("WordPiece trainer did not place BERT's reserved tokens at ids 0..103")
        if len(ordered) > vocab_size:
            raise UserError(
                f"--vocab-size {vocab_size} is too small for this corpus's alphabet "
                f"(needs at least {len(ordered)} entries); choose a larger --vocab-size"
            )
        padding = vocab_size - len(ordered)
        taken = set(ordered)
        n = 99
        while len(ordered) < vocab_size:
            name = f"[unused{n}]"
            n += 1
            if name not in taken:
                ordered.append(name)
        tok = cls(hf=_wordpiece_tokenizer({t: i for i, t in enumerate(ordered)}, lowercase), source="trained WordPiece")
        tok.vocab_padding = padding
        return tok

    # ------------------------------------------------------------------ encoding
    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text, without special tokens."""
        if self._sp is not None:
            return self._sp.encode(list(texts), out_type=int)
        if self._pieces is not None:
            return self._encode_cached(texts)
        return [e.ids for e in self._hf.encode_batch_fast(list(texts), add_special_tokens=False)]

    def _encode_cached(self, texts: list[str]) -> list[list[int]]:
        """BERT pipelines tokenize "x y" as tokens("x") + tokens("y"): the normalizer works per character (a space
        is an NFD starter, so nothing reorders across it), the pre-tokenizer splits at every space, and WordPiece works
        per word. So each space-separated piece is tokenized once and looked up afterwards: Zipf's law makes this
        ~4x faster than tokenizing every line in Rust. Identical ids are checked in tests/test_tokenizer.py.
        """
        cache = self._pieces
        split = [t.split(" ") for t in texts]
        new = list(set(chain.from_iterable(split)).difference(cache))  # order varies by run; each piece's ids do not
        room = PIECE_CACHE_ENTRIES - len(cache)
        if new:
            cache.update(zip(new, self._encode_new_pieces(new)))
        get = cache.__getitem__
        out = [list(chain.from_iterable(map(get, pieces))) for pieces in split]
        if room < len(new):  # bounded memory: forget this batch's surplus (the frequent pieces came earlier)
            for p in new[max(room, 0):]:
                del cache[p]
        return out

    def _encode_new_pieces(self, pieces: list[str]) -> list[tuple[int, ...]]:
        """Ids of pieces not in the cache. A pure-ASCII piece is split into BERT's words in Python (on ASCII, the
        BertNormalizer is str.translate + lower() and BertPreTokenizer splits alphanumeric runs from single
        punctuation characters), so only words never seen before reach the Rust tokenizer; other pieces go whole.
        """
        words = self._words
        lower = self.lowercase
        split: list[list[str] | None] = []
        other: list[str] = []
        for p in pieces:
            if p.isascii():
                p = p.translate(_ASCII_CLEAN_TABLE)
                split.append(_ASCII_WORD.findall(p.lower() if lower else p))
            else:
                split.append(None)
                other.append(p)
        new = list(set(chain.from_iterable(ws for ws in split if ws is not None)).difference(words))
        if len(words) + len(new) > PIECE_CACHE_ENTRIES:
            words.clear()  # rare: bounded memory
        words.update(zip(new, self._encode_pieces(new)))
        other_ids = iter(self._encode_pieces(other))
        get = words.__getitem__
        return [next(other_ids) if ws is None else tuple(chain.from_iterable(map(get, ws))) for ws in split]

    def _encode_pieces(self, pieces: list[str]) -> list[tuple[int, ...]]:
        """Tokenize many pieces in one call: join them with spaces, then split the ids by their character offsets."""
        import numpy as np

        joined = " ".join(pieces)
        enc = self._hf.encode(joined, add_special_tokens=False)
        lengths = np.fromiter((len(p) + 1 for p in pieces), dtype=np.int64, count=len(pieces))
        starts = np.cumsum(lengths) - lengths  # (P,) where each piece starts in `joined`
        token_starts = np.fromiter((o[0] for o in enc.offsets), dtype=np.int64, count=len(enc.ids))
        owner = np.searchsorted(starts, token_starts, side="right") - 1  # (N,) piece of each token
        ends = np.cumsum(np.bincount(owner, minlength=len(pieces)))
        ids = enc.ids
        return [tuple(ids[a:b]) for a, b in zip(chain((0,), ends.tolist()), ends.tolist())]

    def decode(self, ids) -> str:
        ids = [int(i) for i in ids]
        if self._sp is not None:
            return self._sp.decode(ids)
        return self._hf.decode(ids, skip_special_tokens=False)

    def id_to_token(self, i: int) -> str:
        return self._sp.id_to_piece(int(i)) if self._sp is not None else self._hf.id_to_token(int(i))

    # ------------------------------------------------------------------ files
    def save(self, directory) -> None:
        """Write files that `Tokenizer.load(directory)` and transformers' `AutoTokenizer.from_pretrained` both read."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        specials = {f"{r}_token": self.id_to_token(getattr(self, f"{r}_id")) for r in SPECIAL_ROLES}
        config: dict = {**specials, "model_max_length": 512}
        if self._sp is not None:
            (d / "tokenizer.model").write_bytes(self._sp_bytes)
            config.update(tokenizer_class="SentencePieceBackend", vocab_file="tokenizer.model", legacy=True)
        else:
            # written by Python, not by tokenizers' own save: a full disk is then an OSError naming the file
            (d / "tokenizer.json").write_text(self._hf.to_str(pretty=True), encoding="utf-8")
            if self.kind == "wordpiece":
                vocab = self._hf.get_vocab(with_added_tokens=True)
                tokens = sorted(vocab, key=vocab.__getitem__)
                (d / "vocab.txt").write_text("".join(t + "\n" for t in tokens), encoding="utf-8")
                norm = json.loads(self._hf.to_str()).get("normalizer") or {}
                config.update(
                    tokenizer_class="BertTokenizer", do_lower_case=self.lowercase,
                    strip_accents=norm.get("strip_accents"), tokenize_chinese_chars=norm.get("handle_chinese_chars", True),
                )
            else:
                config.update(tokenizer_class="PreTrainedTokenizerFast")
        (d / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        (d / "special_tokens_map.json").write_text(json.dumps(specials, indent=2) + "\n", encoding="utf-8")

    def fingerprint(self) -> str:
        """sha256 over what decides the ids: the vocabulary in id order and the normalization settings."""
        h = hashlib.sha256()
        if self._sp is not None:
            h.update(b"sentencepiece\0")
            h.update(self._sp_bytes)  # the model proto holds the pieces and the normalizer spec
        else:
            spec = json.loads(self._hf.to_str())
            vocab = self._hf.get_vocab(with_added_tokens=True)
            model = {k: v for k, v in spec["model"].items() if k not in ("vocab", "merges")}
            h.update(json.dumps({
                "kind": self.kind, "model": model, "merges": spec["model"].get("merges"),
                "normalizer": spec.get("normalizer"), "pre_tokenizer": spec.get("pre_tokenizer"),
                "vocab": sorted(vocab, key=vocab.__getitem__),
            }, sort_keys=True, ensure_ascii=False).encode("utf-8"))
        return h.hexdigest()

    def __getstate__(self) -> dict:
        # Worker processes receive the tokenizer by pickling: send the serialized form, not Rust objects.
        return {"hf": None if self._hf is None else self._hf.to_str(), "sp": self._sp_bytes, "source": self.source,
                "vocab_padding": self.vocab_padding}

    def __setstate__(self, state: dict) -> None:
        hf = None
        if state["hf"] is not None:
            from tokenizers import Tokenizer as HFTokenizer

            hf = HFTokenizer.from_str(state["hf"])
        self.__init__(hf=hf, sp_model_bytes=state["sp"], source=state["source"])
        self.vocab_padding = state["vocab_padding"]


def _alphabet(lines: list[str], size: int) -> list[str]:
    """The `size` most frequent non-space characters of normalized text, ties broken by code point."""
    import numpy as np

    counts = np.zeros(0x110000, dtype=np.int64)
    for start in range(0, len(lines), 8192):  # bounded memory: ~8k lines at a time as UTF-32 code points
        points = np.frombuffer("".join(lines[start : start + 8192]).encode("utf-32-le"), dtype=np.uint32)
        counts += np.bincount(points, minlength=0x110000)
    counts[ord(" ")] = 0  # the only whitespace left after BertNormalizer; the pre-tokenizer drops it
    present = np.flatnonzero(counts)
    order = present[np.lexsort((present, -counts[present]))][:size]  # by count desc, then code point
    return [chr(c) for c in order]


def _lowercases(normalizer: dict) -> bool:
    """Whether a tokenizers normalizer (as JSON) lower-cases its input."""
    kind = normalizer.get("type")
    if kind == "BertNormalizer":
        return bool(normalizer.get("lowercase", True))
    if kind == "Lowercase":
        return True
    if kind == "Sequence":
        return any(_lowercases(n) for n in normalizer.get("normalizers", []))
    return False


def _read_vocab_txt(path: Path) -> dict[str, int]:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise UserError(f"--tokenizer {path}: not UTF-8 text") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the trailing newline
    vocab: dict[str, int] = {}
    for i, token in enumerate(lines):
        token = token.rstrip("\r")
        if token in vocab:
            raise UserError(f"--tokenizer {path}: line {i + 1} repeats the token {token!r} of line {vocab[token] + 1}")
        vocab[token] = i
    if not vocab:
        raise UserError(f"--tokenizer {path}: empty vocabulary")
    return vocab

