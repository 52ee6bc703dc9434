"""Tokenizers for pre-training: train a BERT-style WordPiece or a SentencePiece model, or load a vocab.txt,
tokenizer.json or SentencePiece model; choose a normalisation that fits the text; write files transformers reads.

One `Tokenizer` wraps a Hugging Face `tokenizers.Tokenizer` (WordPiece, or whatever a tokenizer.json holds) or a
`sentencepiece.SentencePieceProcessor` (as-is: its own normalization, no lower-casing) behind one surface: the five
special ids, `encode_batch`, `decode`, `save`, `fingerprint`.

WordPiece ids follow BERT's vocabulary for every size: [PAD]=0, [unused0..98]=1..99, [UNK]=100, [CLS]=101,
[SEP]=102, [MASK]=103, so checkpoints trained on different vocab sizes agree on the special ids. A SentencePiece
model trained here has BERT's five pieces first: [PAD]=0, [UNK]=1, [CLS]=2, [SEP]=3, [MASK]=4.

Casing (`choose_casing`): BERT's uncased normaliser lower-cases *and* strips accents after NFD, which removes kana
voicing marks (ガ -> カ), decomposes Hangul syllables into jamo and turns Portuguese "pôr" into "por". "auto" keeps
the paper's uncased WordPiece only for mostly Latin text almost free of such characters (English), and chooses
cased otherwise; the choice and its reason go into the manifest.
What does not live here: reading corpora and building examples (corpus.py, prepare.py).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import struct
import unicodedata
from collections import Counter
from itertools import chain, count, islice
from pathlib import Path
from typing import Any, Iterable

from tinyelectra.errors import UserError

# BERT's first 104 ids, in order. Extra entries needed to reach an exact vocab size continue as [unused99], ...
RESERVED_TOKENS: list[str] = ["[PAD]"] + [f"[unused{i}]" for i in range(99)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
SPECIAL_ROLES = ("pad", "unk", "cls", "sep", "mask")
BERT_SPELLING = {r: f"[{r.upper()}]" for r in SPECIAL_ROLES}  # [PAD], [UNK], ...
SENTENCEPIECE_SPELLING = {r: f"<{r}>" for r in SPECIAL_ROLES}  # <pad>, <unk>, ...
PIECE_CACHE_ENTRIES = 1 << 20  # per process; ~200 MB at most
MIN_VOCAB_SIZE = 200  # 104 reserved ids + room for an alphabet
MAX_VOCAB_SIZE = 2**31 - 1
TOKENIZER_TYPES = ("wordpiece", "sentencepiece")
SENTENCEPIECE_MODELS = ("unigram", "bpe")
CASINGS = ("auto", "uncased", "cased")
# Share of character occurrences the WordPiece alphabet (or SentencePiece model) covers: the rarest 0.01% go to [UNK]
# (or byte pieces). The alphabet keeps at least MIN_ALPHABET characters when the text has them (BERT's limit: English
# alphabets unchanged), at most a third of the entries after the reserved ids (each costs two: "c" and "##c").
CHARACTER_COVERAGE = 0.9999
MIN_ALPHABET = 1000
# casing "auto" chooses uncased (the paper's) only when at least this share of letters is Latin script ...
UNCASED_MIN_LATIN_SHARE = 0.5
# ... and uncased normalisation would change at most this share of letters beyond lower-casing (measured: English
# Wikipedia 0.05%; Portuguese 3.9%, French 3.1%, Spanish 2.1%, German 1.5%; Korean, Japanese far more).
UNCASED_MAX_CHANGED_SHARE = 0.005
PROFILE_FILE = "tinyelectra.json"  # beside the tokenizer files: casing, its reason, the text's scripts and languages

# BertNormalizer's clean_text on ASCII, as a str.translate table: control characters are dropped, and tab, newline
# and carriage return become a space (tokenizers' bert.rs: filter is_control, then map is_whitespace -> ' ').
_ASCII_CLEAN_TABLE = {**dict.fromkeys([*range(32), 127]), **dict.fromkeys(map(ord, "\t\n\r"), " ")}
# BertPreTokenizer on clean ASCII: every printable non-alphanumeric character is BERT punctuation (a word of its own).
_ASCII_WORD = re.compile(r"[A-Za-z0-9]+|[^A-Za-z0-9 ]")


def _normalize_ascii(text: str, lowercase: bool) -> str:
    """BertNormalizer on ASCII text, in Python (the Rust one gives the same string)."""
    text = text.translate(_ASCII_CLEAN_TABLE)
    return text.lower() if lowercase else text


def _bert_normalizer(lowercase: bool):
    """strip_accents follows lowercase, as in BERT: cased keeps both case and accents."""
    from tokenizers import normalizers

    return normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=lowercase,
                                      lowercase=lowercase)


def _wordpiece_tokenizer(vocab: dict[str, int], lowercase: bool):
    from tokenizers import Tokenizer as HFTokenizer, decoders, models, pre_tokenizers

    hf = HFTokenizer(models.WordPiece(vocab, unk_token="[UNK]", continuing_subword_prefix="##",
                                      max_input_chars_per_word=100))
    hf.normalizer = _bert_normalizer(lowercase)
    hf.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    hf.decoder = decoders.WordPiece(prefix="##")
    _add_bert_template(hf, vocab, list(BERT_SPELLING.values()))
    return hf


def _add_bert_template(hf, vocab: dict[str, int], specials: list[str]) -> None:
    """[CLS] A [SEP] B [SEP] with token types 0/1 (for transformers; tinyelectra encodes without special tokens),
    and `specials` (SPECIAL_ROLES order) that `vocab` holds as special added tokens: "[MASK]" in a text is the mask."""
    from tokenizers import AddedToken, processors

    cls, sep = specials[SPECIAL_ROLES.index("cls")], specials[SPECIAL_ROLES.index("sep")]
    if cls in vocab and sep in vocab:
        hf.post_processor = processors.TemplateProcessing(
            single=f"{cls} $A {sep}", pair=f"{cls} $A {sep} $B:1 {sep}:1",
            special_tokens=[(cls, vocab[cls]), (sep, vocab[sep])],
        )
    hf.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials if t in vocab])


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

    def __init__(self, hf=None, sp_model_bytes: bytes | None = None, source: str = "") -> None:
        self._hf = hf
        self._sp = None
        self._sp_bytes = sp_model_bytes
        # space-separated piece -> ids (BERT pipelines only); tuples: chain() walks them faster than lists
        self._pieces: dict[str, tuple[int, ...]] | None = None
        self._words: dict[str, tuple[int, ...]] = {}  # normalized ASCII word -> ids (see _encode_new_pieces)
        self._added_starts = ""  # first characters of added tokens: an ASCII piece holding one goes to Rust whole
        self.source = source
        self.vocab_padding = 0  # [unusedN] entries appended after training so the vocabulary has the requested size
        self.alphabet: dict | None = None  # how a trained WordPiece chose its characters (for the manifest)
        if sp_model_bytes is not None:
            import sentencepiece as spm

            self._sp = spm.SentencePieceProcessor()
            try:
                self._sp.LoadFromSerializedProto(sp_model_bytes)
            except Exception as e:  # sentencepiece raises RuntimeError/OSError on a malformed proto
                raise UserError(f"{source}: not a SentencePiece model ({e})") from None
            self.kind, self.lowercase = "sentencepiece", False
            self.vocab_size = self._sp.get_piece_size()
            lookup = self._sp_lookup
        else:
            spec = json.loads(hf.to_str())
            self.kind = str(spec["model"]["type"]).lower()
            self.vocab_size = hf.get_vocab_size(with_added_tokens=True)
            norm = spec.get("normalizer") or {}
            self.lowercase = _lowercases(norm)
            lookup = hf.get_vocab(with_added_tokens=True).get
            hf.no_truncation()
            hf.no_padding()
            # Piece cache (see _encode_cached): valid when every step before the model splits at spaces.
            added = spec.get("added_tokens") or []
            self._added_starts = "".join(sorted({t["content"][0] for t in added if t.get("content")}))
            pre = (spec.get("pre_tokenizer") or {}).get("type")
            if (self.kind == "wordpiece" and norm.get("type") == "BertNormalizer" and norm.get("clean_text", True)
                    and pre == "BertPreTokenizer" and not any(" " in t.get("content", "") for t in added)):
                self._pieces = {}
        for role in SPECIAL_ROLES:
            setattr(self, f"{role}_id", self._find_special(role, lookup))

    # ------------------------------------------------------------------ construction
    def _sp_lookup(self, piece: str) -> int | None:
        i = self._sp.piece_to_id(piece)  # unk_id for an unknown piece: check the round trip
        return i if self._sp.id_to_piece(i) == piece else None

    def _find_special(self, role: str, lookup) -> int:
        spellings = [BERT_SPELLING[role], SENTENCEPIECE_SPELLING[role]]
        found = [i for i in map(lookup, spellings) if i is not None]
        if found:
            return int(found[0])
        how = ("; `tinyelectra prepare --tokenizer-type sentencepiece` trains one that has them (or train yours with "
               "pad_id=0 pad_piece=[PAD] unk_id=1 unk_piece=[UNK] control_symbols=[CLS],[SEP],[MASK])"
               if self._sp is not None else "")
        raise UserError(
            f"tokenizer {self.source or '(trained)'} has no {spellings[0]} token (also looked for {spellings[1]}); "
            f"ELECTRA needs all five special tokens [PAD], [UNK], [CLS], [SEP], [MASK]{how}"
        )

    @classmethod
    def load(cls, path, lowercase: bool | None = None) -> "Tokenizer":
        """Load a directory written by save(), a vocab.txt, a tokenizer.json or a SentencePiece .model. `lowercase`
        only matters for a bare vocab.txt (no record of its casing); None: uncased unless it has upper-case letters."""
        p = Path(path)
        if not p.exists():
            raise UserError(f"--tokenizer {p}: no such file or directory")
        if p.is_dir():
            # tokenizer.model first: in a directory written by save() it is the SentencePiece model itself, and
            # tokenizer.json beside it its transformers copy (exact; tests/test_multilingual.py checks it)
            names = ("tokenizer.model", "tokenizer.json", "spiece.model", "sentencepiece.model", "vocab.txt")
            for q in [p / name for name in names] + sorted(p.glob("*.model")):
                if q.is_file():
                    return cls.load(q, lowercase)
            raise UserError(f"--tokenizer {p}: directory has no tokenizer.json, vocab.txt or SentencePiece .model")
        if p.suffix == ".model":
            return cls(sp_model_bytes=p.read_bytes(), source=str(p))
        if p.suffix == ".json":
            from tokenizers import Tokenizer as HFTokenizer

            try:
                hf = HFTokenizer.from_file(str(p))
            except Exception as e:  # tokenizers raises a bare Exception on malformed JSON
                raise UserError(f"--tokenizer {p}: not a tokenizers JSON file "
                                f"({str(e).splitlines()[0][:200]})") from None
            return cls(hf=hf, source=str(p))
        if p.suffix == ".txt":
            vocab = _read_vocab_txt(p)
            if lowercase is None:
                lowercase = not any(t != t.lower() for t in vocab if not (t.startswith("[") and t.endswith("]")))
            return cls(hf=_wordpiece_tokenizer(vocab, lowercase), source=str(p))
        raise UserError(f"--tokenizer {p}: expected a vocab.txt, a tokenizer.json or a SentencePiece .model")

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int, lowercase: bool,
              character_coverage: float = CHARACTER_COVERAGE) -> "Tokenizer":
        """Train an uncased (or cased) WordPiece with BERT's reserved ids on an iterable of lines; its alphabet covers
        `character_coverage` of the character occurrences (see CHARACTER_COVERAGE), as `.alphabet` records."""
        from tokenizers import Tokenizer as HFTokenizer, models, pre_tokenizers, trainers

        if not MIN_VOCAB_SIZE <= vocab_size <= MAX_VOCAB_SIZE:
            raise UserError(f"--vocab-size {vocab_size}: must be between {MIN_VOCAB_SIZE} and {MAX_VOCAB_SIZE}")
        normalizer = _bert_normalizer(lowercase)
        # Train on pre-normalized text (normalizer off during training): ASCII lines through str.translate, the rest
        # through the same Rust normalizer, so the word counts are exactly those of the full pipeline.
        lines = [_normalize_ascii(t, lowercase) if t.isascii() else normalizer.normalize_str(t) for t in texts]
        # Determinism: the trainer numbers "##c" tokens in hash-map order and breaks ties between equally frequent
        # merges by id, so two runs can learn different vocabularies (huggingface/tokenizers#1794). We fix the alphabet
        # (most frequent characters, ties by code point) and register every "##c" up front as a trainer special token.
        if not 0.0 < character_coverage <= 1.0:
            raise UserError(f"--character-coverage {character_coverage}: must be in (0, 1]")
        alphabet, alphabet_facts = _alphabet(lines, character_coverage,
                                             max(1, (vocab_size - len(RESERVED_TOKENS)) // 3))
        hf = HFTokenizer(models.WordPiece(unk_token="[UNK]", continuing_subword_prefix="##"))
        hf.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        trainer = trainers.WordPieceTrainer(
            vocab_size=vocab_size, min_frequency=2, special_tokens=RESERVED_TOKENS + ["##" + c for c in alphabet],
            initial_alphabet=alphabet, limit_alphabet=len(alphabet), continuing_subword_prefix="##",
            show_progress=False,
        )
        hf.train_from_iterator(lines, trainer, length=len(lines))
        del lines
        learned = hf.get_vocab()
        ordered = sorted(learned, key=learned.__getitem__)
        if ordered[: len(RESERVED_TOKENS)] != RESERVED_TOKENS:  # the trainer puts special tokens first, in order
            raise RuntimeError("WordPiece trainer did not place BERT's reserved tokens at ids 0..103")
        if len(ordered) > vocab_size:
            raise UserError(f"--vocab-size {vocab_size} is too small for this corpus's alphabet (needs at least "
                            f"{len(ordered)} entries); choose a larger --vocab-size")
        padding = vocab_size - len(ordered)  # filled with BERT's spare entries, continued past [unused98]
        ordered += islice((t for t in map("[unused{}]".format, count(99)) if t not in learned), padding)
        tok = cls(hf=_wordpiece_tokenizer({t: i for i, t in enumerate(ordered)}, lowercase), source="trained WordPiece")
        tok.vocab_padding, tok.alphabet = padding, alphabet_facts
        return tok

    @classmethod
    def train_sentencepiece(cls, texts: Iterable[str], vocab_size: int, model_type: str = "unigram",
                            character_coverage: float = CHARACTER_COVERAGE, byte_fallback: bool = True,
                            threads: int = 1) -> "Tokenizer":
        """Train a SentencePiece model (unigram or BPE) with BERT's five special pieces first (no <s>/</s>) and the
        text kept as written (normalization "identity": NFKC would fold full-width punctuation; runs of spaces kept,
        where SentencePiece's default collapses them): decode gives the input back. Characters outside
        `character_coverage` become byte pieces with `byte_fallback`, else [UNK]."""
        import sentencepiece as spm

        if model_type not in SENTENCEPIECE_MODELS:
            raise UserError(f"--sentencepiece-model {model_type!r}: choose {' or '.join(SENTENCEPIECE_MODELS)}")
        if not MIN_VOCAB_SIZE <= vocab_size <= MAX_VOCAB_SIZE:
            raise UserError(f"--vocab-size {vocab_size}: must be between {MIN_VOCAB_SIZE} and {MAX_VOCAB_SIZE}")
        if not 0.0 < character_coverage <= 1.0:
            raise UserError(f"--character-coverage {character_coverage}: must be in (0, 1]")
        lines = [t for t in texts if t.strip()]
        model = io.BytesIO()
        try:
            spm.SentencePieceTrainer.train(
                sentence_iterator=iter(lines), model_writer=model, vocab_size=vocab_size, model_type=model_type,
                character_coverage=character_coverage, byte_fallback=byte_fallback,
                pad_id=0, unk_id=1, bos_id=-1, eos_id=-1, pad_piece="[PAD]", unk_piece="[UNK]",
                control_symbols=["[CLS]", "[SEP]", "[MASK]"], normalization_rule_name="identity",
                remove_extra_whitespaces=False,
                max_sentence_length=1 << 16, num_threads=max(1, threads), minloglevel=2,
            )
        except RuntimeError as e:  # sentencepiece reports bad input as RuntimeError("INTERNAL: ...")
            most = re.search(r"value <= (\d+)", str(e))
            if most:
                raise UserError(f"--vocab-size {vocab_size} is too large for this text: SentencePiece can make at most "
                                f"{most.group(1)} pieces of it; choose a smaller --vocab-size or give more "
                                "text") from None
            raise UserError("SentencePiece training failed: "
                            f"{str(e).strip().splitlines()[0][:300]}") from None
        return cls(sp_model_bytes=model.getvalue(), source=f"trained SentencePiece ({model_type})")

    # ------------------------------------------------------------------ encoding
    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text, without special tokens."""
        if self._sp is not None:
            return self._sp.encode(list(texts), out_type=int)
        if self._pieces is not None:
            return self._encode_cached(texts)
        return [e.ids for e in self._hf.encode_batch_fast(list(texts), add_special_tokens=False)]

    def _encode_cached(self, texts: list[str]) -> list[list[int]]:
        """BERT pipelines tokenize "x y" as tokens("x") + tokens("y") (per-character normalizer, a space being an NFD
        starter; split at every space; WordPiece per word), so each distinct space-separated piece is tokenized once
        (Zipf: few of them): 1.79x less CPU per MB of enwiki than encode_batch on every line (0.19 vs 0.34 CPU s/MB;
        benchmarks/results/prepare_enwiki.json; same ids: tests/test_tokenizer.py)."""
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
        """Ids of pieces not in the cache. A pure-ASCII piece is split into BERT's words in Python (_ASCII_WORD), so
        only words never seen before reach the Rust tokenizer; other pieces (None in `split`: non-ASCII, or holding an
        added token's first character, as in "[MASK]") go to Rust whole."""
        words, starts = self._words, self._added_starts
        split = [_ASCII_WORD.findall(_normalize_ascii(p, self.lowercase))
                 if p.isascii() and not any(c in p for c in starts) else None for p in pieces]
        other = [p for p, ws in zip(pieces, split) if ws is None]
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
        return self._sp.decode(ids) if self._sp is not None else self._hf.decode(ids, skip_special_tokens=False)

    def id_to_token(self, i: int) -> str:
        return self._sp.id_to_piece(int(i)) if self._sp is not None else self._hf.id_to_token(int(i))

    # ------------------------------------------------------------------ files
    def save(self, directory, model_max_length: int | None = None) -> None:
        """Write files that `Tokenizer.load(directory)` and `AutoTokenizer.from_pretrained` (transformers 4.44 ... 5.x)
        both read (transformers' own, around `hf_tokenizer()`; then vocab.txt or the SentencePiece model beside them).
        `model_max_length`: the model's positions (an export), or None (unknown: transformers' "no limit")."""
        from transformers import PreTrainedTokenizerFast
        from transformers.utils import logging as hf_logging

        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        level = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()
        try:
            fast = PreTrainedTokenizerFast(
                tokenizer_object=self.hf_tokenizer(), clean_up_tokenization_spaces=False,  # decode returns the text
                model_input_names=["input_ids", "token_type_ids", "attention_mask"],  # 5.x omits token types otherwise
                **{f"{r}_token": t for r, t in zip(SPECIAL_ROLES, self._special_tokens())},
                **({} if model_max_length is None else {"model_max_length": int(model_max_length)}),
            )
            fast.save_pretrained(str(d))
        except Exception as e:  # tokenizers' own writer reports a failed write ("File too large (os error 27)") as a
            code = re.search(r"os error (\d+)", str(e))  # bare Exception: give it back its errno, as an OSError
            if code is None or isinstance(e, OSError):
                raise
            raise OSError(int(code.group(1)), os.strerror(int(code.group(1))), str(d)) from None
        finally:
            hf_logging.set_verbosity(level)
        # transformers 5.x names its class "TokenizersBackend", unknown to 4.x; "PreTrainedTokenizerFast" is the
        # class in 4.x and an alias of it in 5.x, and reads the same tokenizer.json.
        config_path = d / "tokenizer_config.json"
        config = {**json.loads(config_path.read_text(encoding="utf-8")), "tokenizer_class": "PreTrainedTokenizerFast"}
        config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        if self._sp is not None:
            (d / "tokenizer.model").write_bytes(self._sp_bytes)
        elif self.kind == "wordpiece":
            vocab = self._hf.get_vocab(with_added_tokens=True)
            tokens = sorted(vocab, key=vocab.__getitem__)
            (d / "vocab.txt").write_text("".join(t + "\n" for t in tokens), encoding="utf-8")

    def hf_tokenizer(self):
        """A `tokenizers.Tokenizer` that encodes exactly as this one (a copy: a SentencePiece model is converted),
        with the [CLS] A [SEP] B [SEP] post-processor and the five special tokens as special added tokens."""
        from tokenizers import Tokenizer as HFTokenizer

        if self._sp is not None:
            return _sentencepiece_to_tokenizers(self._sp_bytes, self._special_tokens())
        hf = HFTokenizer.from_str(self._hf.to_str())
        _add_bert_template(hf, hf.get_vocab(with_added_tokens=True), self._special_tokens())
        return hf

    def _special_tokens(self) -> list[str]:
        return [self.id_to_token(getattr(self, f"{r}_id")) for r in SPECIAL_ROLES]

    def fingerprint(self) -> str:
        """sha256 over what decides the ids: the vocabulary in id order and the normalization settings."""
        if self._sp is not None:  # the model proto holds the pieces and the normalizer spec
            return hashlib.sha256(b"sentencepiece\0" + self._sp_bytes).hexdigest()
        spec = json.loads(self._hf.to_str())
        vocab = self._hf.get_vocab(with_added_tokens=True)
        model = {k: v for k, v in spec["model"].items() if k not in ("vocab", "merges")}
        return hashlib.sha256(json.dumps({
            "kind": self.kind, "model": model, "merges": spec["model"].get("merges"),
            "normalizer": spec.get("normalizer"), "pre_tokenizer": spec.get("pre_tokenizer"),
            "vocab": sorted(vocab, key=vocab.__getitem__),
        }, sort_keys=True, ensure_ascii=False).encode("utf-8")).hexdigest()

    def __getstate__(self) -> dict:
        # Worker processes receive the tokenizer by pickling: send the serialized form, not Rust objects.
        return {"hf": None if self._hf is None else self._hf.to_str(), "sp": self._sp_bytes, "source": self.source,
                "vocab_padding": self.vocab_padding}

    def __setstate__(self, state: dict) -> None:
        from tokenizers import Tokenizer as HFTokenizer

        hf = None if state["hf"] is None else HFTokenizer.from_str(state["hf"])
        self.__init__(hf=hf, sp_model_bytes=state["sp"], source=state["source"])
        self.vocab_padding = state["vocab_padding"]


# ---------------------------------------------------------------------------------------------------- casing
def _script(ch: str) -> str:
    """The script of a letter, from its Unicode name: Latin, Hangul, Hiragana, Katakana, Han, Cyrillic, ..."""
    name = unicodedata.name(ch, "")
    for script in ("HANGUL", "HIRAGANA", "KATAKANA"):
        if script in name:
            return script.title()
    if name.startswith("CJK"):
        return "Han"
    return name.split(" ")[0].title() if name else "Other"


def text_profile(lines: list[str]) -> dict[str, Any]:
    """What the text's letters are: their share per script, the share that BERT's uncased normaliser would change
    beyond lower-casing (accents stripped, kana voicing marks removed, Hangul syllables decomposed into jamo) with
    the most frequent examples, and the languages the scripts name (ko, ja, zh; en for ASCII-only letters)."""
    import numpy as np

    counts = _char_counts(lines)
    ascii_letters = 0
    scripts: Counter[str] = Counter()
    examples: list[tuple[int, str]] = []
    for c in np.flatnonzero(counts).tolist():
        ch, n = chr(c), int(counts[c])
        if not unicodedata.category(ch).startswith("L"):
            continue
        ascii_letters += n if c < 128 else 0
        scripts[_script(ch)] += n
        # what BERT's uncased normaliser leaves of it: lower-cased, NFD, combining marks (Mn) removed
        after = "".join(c for c in unicodedata.normalize("NFD", ch.lower()) if unicodedata.category(c) != "Mn")
        if after != ch.lower():
            examples.append((n, f"{ch}->{'+'.join(after)}"))  # Hangul: 한->ᄒ+ᅡ+ᆫ (jamo)
    letters, changed = sum(scripts.values()), sum(n for n, _ in examples)
    share = {k: round(v / letters, 4) for k, v in scripts.most_common()}
    # Languages the scripts name, each when its script holds at least 5% of the letters: Hangul (ko), kana (ja), Han
    # beyond what Japanese text carries (it has more kana than kanji: zh), ASCII letters only (en).
    kana = share.get("Hiragana", 0) + share.get("Katakana", 0)
    guess = {"ko": share.get("Hangul", 0), "ja": kana, "zh": share.get("Han", 0) - kana}
    languages = sorted((code for code, v in guess.items() if v >= 0.05), key=lambda code: -guess[code])
    if letters and ascii_letters / letters > 0.99:
        languages.append("en")
    return {
        "letters": letters, "scripts": share, "changed_by_uncased": changed,
        "changed_share": round(changed / letters, 6) if letters else 0.0,
        "changed_examples": [e for _, e in sorted(examples, key=lambda x: -x[0])[:5]], "languages": languages,
    }


def choose_casing(requested: str, profile: dict[str, Any]) -> tuple[bool, str, str | None]:
    """(lowercase, reason, warning or None) for `--casing auto|uncased|cased` on text with this `text_profile`."""
    if requested not in CASINGS:
        raise UserError(f"--casing {requested!r}: choose {', '.join(CASINGS)}")
    latin = profile["scripts"].get("Latin", 0.0) if profile["letters"] else 1.0
    share = profile["changed_share"]
    damage = (f"{100 * share:.1f}% of the letters (e.g. {', '.join(profile['changed_examples'][:3])})"
              if profile["changed_by_uncased"] else "no letters")
    top = ", ".join(f"{k} {100 * v:.0f}%" for k, v in list(profile["scripts"].items())[:3])
    if requested == "cased":
        return False, "cased, as asked (--casing cased)", None
    if requested == "uncased":
        warning = (f"--casing uncased: BERT's uncased normaliser changes {damage} beyond lower-casing (accents, kana "
                   f"voicing marks, Hangul syllables); --casing cased (or auto) keeps them")
        return True, "uncased, as asked (--casing uncased)", warning if share > UNCASED_MAX_CHANGED_SHARE else None
    if latin < UNCASED_MIN_LATIN_SHARE:
        return False, (f"auto: cased, because the letters are mostly not Latin ({top}): lower-casing gains nothing "
                       f"there, and the uncased normaliser would change {damage}"), None
    if share > UNCASED_MAX_CHANGED_SHARE:
        return False, (f"auto: cased, because the uncased normaliser would strip accents from {damage}; more than "
                       f"{100 * UNCASED_MAX_CHANGED_SHARE:g}% (English Wikipedia: 0.05%)"), None
    return True, (f"auto: uncased (the paper's), because the letters are Latin ({top}) and the uncased normaliser "
                  f"changes only {damage}"), None


def _char_counts(lines: list[str]):
    """Occurrences of every code point in `lines`: a (0x110000,) int64 array."""
    import numpy as np

    counts = np.zeros(0x110000, dtype=np.int64)
    for start in range(0, len(lines), 8192):  # bounded memory: ~8k lines at a time as UTF-32 code points
        points = np.frombuffer("".join(lines[start : start + 8192]).encode("utf-32-le"), dtype=np.uint32)
        counts += np.bincount(points, minlength=0x110000)
    return counts


def _alphabet(lines: list[str], coverage: float, most: int) -> tuple[list[str], dict]:
    """The most frequent non-space characters of normalized text (ties by code point) covering `coverage` of their
    occurrences, at least MIN_ALPHABET of them (when present) and at most `most`; and the facts of the choice."""
    import numpy as np

    counts = _char_counts(lines)
    counts[ord(" ")] = 0  # the only whitespace left after BertNormalizer; the pre-tokenizer drops it
    present = np.flatnonzero(counts)
    order = present[np.lexsort((present, -counts[present]))]  # by count desc, then code point
    covered = np.cumsum(counts[order]) / max(int(counts.sum()), 1)  # (distinct,)
    needed = int(np.searchsorted(covered, coverage - 1e-12)) + 1
    size = max(1, min(max(needed, min(MIN_ALPHABET, len(order))), most, len(order)))
    facts = {"characters": size, "distinct_characters": int(len(order)), "coverage": round(float(covered[size - 1]), 6)
             if len(order) else 1.0, "character_coverage": coverage, "limit_from_vocab_size": most}
    return [chr(c) for c in order[:size]], facts


def _lowercases(normalizer: dict) -> bool:
    """Whether a tokenizers normalizer (as JSON) lower-cases its input."""
    kind = normalizer.get("type")
    if kind == "Sequence":
        return any(_lowercases(n) for n in normalizer.get("normalizers", []))
    return kind == "Lowercase" or (kind == "BertNormalizer" and bool(normalizer.get("lowercase", True)))


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


# ------------------------------------------------------------------------------------------ SentencePiece -> tokenizers
def _varint(b: bytes, i: int) -> tuple[int, int]:
    x = shift = 0
    while True:
        c = b[i]
        i += 1
        x |= (c & 0x7F) << shift
        shift += 7
        if c < 0x80:
            return x, i


def _proto_fields(b: bytes) -> Iterable[tuple[int, Any]]:
    """(field number, value) of a protobuf message: ints for varints, bytes for strings, messages and fixed sizes."""
    i = 0
    while i < len(b):
        key, i = _varint(b, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(b, i)
        elif wire in (1, 2, 5):  # 64-bit, length-delimited, 32-bit
            n, i = _varint(b, i) if wire == 2 else ({1: 8, 5: 4}[wire], i)
            value, i = b[i : i + n], i + n
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        yield number, value


# sentencepiece_model.proto: ModelProto.pieces = 1 (piece = 1, score = 2, type = 3), .trainer_spec = 2,
# .normalizer_spec = 3
SP_NORMAL, SP_UNKNOWN, SP_CONTROL, SP_USER_DEFINED, SP_UNUSED, SP_BYTE = 1, 2, 3, 4, 5, 6
_SETTINGS = {  # name: (ModelProto field: 2 trainer_spec or 3 normalizer_spec, the field in it, the proto's default)
    "model_type": (2, 3, 1), "split_by_whitespace": (2, 22, 1), "treat_whitespace_as_suffix": (2, 24, 0),
    "byte_fallback": (2, 35, 0), "precompiled_charsmap": (3, 2, b""), "add_dummy_prefix": (3, 3, 1),
    "remove_extra_whitespaces": (3, 4, 1),
}


def read_sentencepiece(model: bytes) -> tuple[list[tuple[str, float, int]], dict[str, Any]]:
    """The pieces (text, score, type) of a SentencePiece model and the settings that decide its encoding, read from
    the protobuf directly (no `protobuf` package needed). Absent fields take the proto's defaults."""
    pieces: list[tuple[str, float, int]] = []
    specs: dict[int, dict[int, Any]] = {2: {}, 3: {}}
    for number, value in _proto_fields(model):
        if number == 1:
            f = dict(_proto_fields(value))
            score = struct.unpack("<f", f[2])[0] if 2 in f else 0.0
            pieces.append((f.get(1, b"").decode("utf-8"), score, f.get(3, SP_NORMAL)))
        elif number in specs:
            specs[number].update(_proto_fields(value))
    return pieces, {name: specs[spec].get(n, default) for name, (spec, n, default) in _SETTINGS.items()}


def _sentencepiece_to_tokenizers(model: bytes, specials: list[str]):
    """A `tokenizers.Tokenizer` that encodes and decodes as the SentencePiece `model` (unigram or BPE; its
    normalisation rules, dummy prefix, whitespace handling, byte fallback), as transformers' own converters do."""
    from tokenizers import AddedToken, Regex, Tokenizer as HFTokenizer, decoders, models, normalizers, pre_tokenizers

    pieces, cfg = read_sentencepiece(model)
    if cfg["treat_whitespace_as_suffix"]:
        raise UserError("SentencePiece models trained with treat_whitespace_as_suffix cannot be written for "
                        "transformers")
    vocab = {p: i for i, (p, _, _) in enumerate(pieces)}
    unk = next((i for i, (_, _, kind) in enumerate(pieces) if kind == SP_UNKNOWN), 0)
    byte_fallback = bool(cfg["byte_fallback"])
    if cfg["model_type"] == 1:  # unigram: the same Viterbi over the same scores
        hf = HFTokenizer(models.Unigram([(p, score) for p, score, _ in pieces], unk_id=unk,
                                        byte_fallback=byte_fallback))
    elif cfg["model_type"] == 2:  # BPE: SentencePiece merges the pair whose merged piece scores highest (= lowest id)
        merges = sorted(  # every split of a normal piece into two pieces; ties: by id, then left piece's id
            (-score, i, vocab[piece[:k]], piece[:k], piece[k:])
            for i, (piece, score, kind) in enumerate(pieces) if kind == SP_NORMAL
            for k in range(1, len(piece)) if piece[:k] in vocab and piece[k:] in vocab
        )
        hf = HFTokenizer(models.BPE(vocab, [(left, right) for *_, left, right in merges], unk_token=pieces[unk][0],
                                    fuse_unk=True, byte_fallback=byte_fallback))
    else:
        raise UserError(f"SentencePiece model type {cfg['model_type']} (word or char) cannot be written for "
                        "transformers")
    steps = [normalizers.Precompiled(cfg["precompiled_charsmap"])] if cfg["precompiled_charsmap"] else []
    prefix = bool(cfg["add_dummy_prefix"])
    if cfg["remove_extra_whitespaces"]:
        steps += [normalizers.Strip(), normalizers.Replace(Regex(" {2,}"), " ")]
    elif prefix:  # Metaspace adds no prefix to a text that starts with a space; SentencePiece does: give it one
        steps += [normalizers.Replace(Regex(r"\A "), "\u2581 ")]
    if steps:
        hf.normalizer = normalizers.Sequence(steps)
    hf.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always" if prefix else "never",
                                                split=bool(cfg["split_by_whitespace"]))
    hf.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
                                   + ([decoders.Strip(" ", 1, 0)] if prefix else []))
    hf.add_tokens([AddedToken(p, normalized=False) for p, _, kind in pieces if kind == SP_USER_DEFINED])
    _add_bert_template(hf, vocab, specials)
    return hf
