"""Preparing pre-training data: `prepare` (text -> tokenizer -> shards) and the official example builder.

The path:  corpus.py reads documents (lists of sentence lines)  ->  fixed-size chunks of documents are tokenized and
built into examples in worker processes (each chunk's random choices seeded from (seed, chunk index), so the output
is byte-identical for any --workers)  ->  rows are written as .npy shards in `OUT/.staging.tmp-<pid>`, then moved
into OUT, manifest.json last (a folder without it is never taken as a dataset), all under OUT's lock and on its
record (runfolder.py): an earlier dataset there is replaced file by file, whatever else OUT holds stays. Reading it
back (`PretrainData`, `BatchLoader`) is data.py's.

Example builder: google-research/electra build_pretraining_dataset.py, ported decision by decision:
lines accumulate until their length reaches the target (never across documents); 10% of examples have one segment;
after each example the next target is random in [5, T] with probability 0.05; [CLS] A [SEP] (B [SEP]) padded to T.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import platform
import random
import re
import shutil
import signal
import time
from collections import deque
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import accumulate, chain, count
from pathlib import Path
from typing import Iterator

import numpy as np

from tinyelectra import __version__
from tinyelectra.config import difference_text, differences
from tinyelectra.console import make_console
from tinyelectra.corpus import CorpusReader, Document, resolve_inputs
from tinyelectra.data import FORMAT_VERSION, SPLITS, files_present, heldout_warning
from tinyelectra.errors import UserError
from tinyelectra.files import check_writable, fsync_dir, os_error_line, sha256_of, write_json
from tinyelectra.runfolder import (RECORD_NAME, Written, covered, delete_temporaries, foreign, holding,
                                   tidy_record)
from tinyelectra.tokenizer import (CASINGS, CHARACTER_COVERAGE, MAX_VOCAB_SIZE, MIN_VOCAB_SIZE, PROFILE_FILE,
                                   SPECIAL_ROLES, TOKENIZER_TYPES, Tokenizer, choose_casing, text_profile)

BUILDER_VERSION = "electra-official-1"  # bump when the builder's output for the same input changes
# bump when a SentencePiece model trained from the same text and settings changes; part of the request, so a dataset
# prepared before is not reused (2: runs of spaces kept; before, SentencePiece's default collapsed them)
SENTENCEPIECE_TRAINING_VERSION = 2
MIN_SEQ_LEN, MAX_SEQ_LEN = 8, 512
CHUNK_CHARS = 1 << 20  # documents are grouped into chunks of about this many characters (fixed: decides the seeds)
ROWS_PER_SHARD = 1 << 19  # 128 MiB of uint16 rows at T = 128
TOKENIZER_SAMPLE_MB = 32.0  # default: train the WordPiece on the first 32 MB of text (speed; see prepare --help)
SINGLE_SEGMENT_TARGET = 100_000  # the official code's "unlimited" first-segment target
LOW_FILL_RATIO = 0.5  # prepare warns when less than this share of the training examples' token slots holds text
PROFILE_SAMPLE_MB = 4.0  # with a given tokenizer: MB of text read to describe it (scripts, casing warnings)
STAGING = ".staging"  # the dataset is written into OUT/.staging.tmp-<pid>, then moved into place (_put_in_place)


# ---------------------------------------------------------------------------------------------------- builder
@dataclass
class BuilderStats:
    examples: int = 0
    single_segment_draws: int = 0  # the 10% draw: first segment unlimited
    random_target_draws: int = 0  # the 5% draw: next target length random in [5, T]


def build_examples(
    documents: Iterator[list[list[int]]], seq_len: int, rng: random.Random, stats: BuilderStats, pack: bool = False,
) -> Iterator[tuple[int, list[int], list[int]]]:
    """The official ExampleBuilder. `documents` yields each document's lines (token ids); yields
    (document number of the example's first line, segment A ids, segment B ids) with A and B already cut to fit
    [CLS] A [SEP] B [SEP] in T. With `pack`, a document's end does not end the example: short documents share
    examples (`prepare --pack-documents`, for text whose documents are much shorter than T)."""
    T = target = seq_len
    lines: list[list[int]] = []  # the lines accumulated so far
    accumulated = first_doc = 0  # tokens in `lines`, document of its first line
    for doc_number, document in enumerate(documents):
        for ids in document:
            if not lines:
                first_doc = doc_number
            lines.append(ids)
            accumulated += len(ids)
            if accumulated >= target:
                yield first_doc, *_make_example(lines, target, T, rng, stats)
                target = _next_target(T, rng, stats)
                lines, accumulated = [], 0
        if pack:
            continue
        # Document end: the accumulated lines become an example. (Lines with zero tokens alone make none, and unlike
        # the official code they are not carried into the next document: examples never cross documents.)
        if accumulated > 0:
            yield first_doc, *_make_example(lines, target, T, rng, stats)
            target = _next_target(T, rng, stats)
        lines, accumulated = [], 0
    if accumulated > 0:  # packing: the end of the stream
        yield first_doc, *_make_example(lines, target, T, rng, stats)


def _make_example(lines, target: int, T: int, rng: random.Random, stats: BuilderStats):
    stats.examples += 1
    if rng.random() < 0.1:  # small chance of a single segment, as in classification tasks
        first_target = SINGLE_SEGMENT_TARGET
        stats.single_segment_draws += 1
    else:
        first_target = (target - 3) // 2  # -3: [CLS] and two [SEP] are not in the text yet
    a: list[int] = []
    b: list[int] = []
    for ids in lines:
        # A line joins segment A if A is empty, if it keeps A under its target, or (B still empty, A under target)
        # half of the time; otherwise B. (A later short line can still join A after B has started: official.)
        if not a or len(a) + len(ids) < first_target or (not b and len(a) < first_target and rng.random() < 0.5):
            a += ids
        else:
            b += ids
    a = a[: T - 2]
    return a, b[: max(0, T - len(a) - 3)]


def _next_target(T: int, rng: random.Random, stats: BuilderStats) -> int:
    if rng.random() < 0.05:  # small chance of a random-length example instead of a full-length one
        stats.random_target_draws += 1
        return rng.randint(5, T)
    return T


def example_row(a: list[int], b: list[int], cls_id: int, sep_id: int) -> tuple[list[int], int]:
    """[CLS] A [SEP] (B [SEP]) as a list of ids (unpadded) and the A/B boundary (= length when single-segment)."""
    row = [cls_id, *a, sep_id] + ([*b, sep_id] if b else [])
    return row, len(a) + 2  # segment 1 starts after [CLS] A [SEP]; with no B this is also the length


# ---------------------------------------------------------------------------------------------------- chunk workers
_WORKER: dict = {}


def _init_worker(tokenizer: Tokenizer, settings: dict, single_threaded: bool) -> None:
    if single_threaded:  # a spawned worker process
        # One tokenizer thread per worker process: the processes already fill the cores.
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        # Ctrl-C is the main process's to handle (it removes the temporary directory); no traceback per worker.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    _WORKER.clear()
    _WORKER.update(settings, tokenizer=tokenizer)


def _process_chunk(chunk_index: int, docs: list[Document]) -> dict:
    """Tokenize one chunk of documents and build its examples. Pure function of (chunk, seed, settings)."""
    tok: Tokenizer = _WORKER["tokenizer"]
    T: int = _WORKER["seq_len"]
    seed: int = _WORKER["seed"]
    lines = [line for d in docs for line in d]
    ids = tok.encode_batch(lines)

    # Which documents are held out: its own random stream, so the builder's draws do not depend on it.
    val_rng = random.Random(f"validation:{seed}:{chunk_index}")
    doc_split = [1 if val_rng.random() < _WORKER["validation_fraction"] else 0 for _ in docs]

    ends = list(accumulate(len(d) for d in docs))
    per_document = [ids[a:b] for a, b in zip([0, *ends], ends)]  # each document's line ids
    stats = BuilderStats()
    rows: list[list[tuple[list[int], int]]] = [[], []]  # per split: (row, A/B boundary)
    pack = _WORKER.get("pack_documents", False)
    # Packed examples span documents, so each split's documents are packed apart (a held-out row never shares text
    # with a training document), each with its own random stream: the other split's documents are left empty.
    for s in (0, 1) if pack else (None,):
        rng = random.Random(f"builder:{seed}:{chunk_index}" + (f":packed:{s}" if pack else ""))
        mine = (d if s in (None, split) else [] for d, split in zip(per_document, doc_split))
        for doc_number, a, b in build_examples(mine, T, rng, stats, pack):
            rows[doc_split[doc_number]].append(example_row(a, b, tok.cls_id, tok.sep_id))

    dtype = np.dtype(_WORKER["dtype"])
    out = {"lines": len(lines), "line_tokens": sum(map(len, ids)), "documents": [doc_split.count(s) for s in (0, 1)],
           "single_segment_draws": stats.single_segment_draws, "random_target_draws": stats.random_target_draws,
           "examples": [len(r) for r in rows], "filled": [sum(len(row) for row, _ in r) for r in rows],
           "single_segment_rows": [sum(boundary == len(row) for row, boundary in r) for r in rows]}
    for s, split in enumerate(SPLITS):
        n = len(rows[s])
        meta = np.array([(boundary, len(row)) for row, boundary in rows[s]], dtype=np.uint16).reshape(n, 2)
        arr = np.full((n, T), tok.pad_id, dtype=dtype)  # (n, T)
        # one conversion for the whole chunk, scattered row-major into the real (non-pad) positions
        arr[np.arange(T)[None, :] < meta[:, 1:]] = np.fromiter(chain.from_iterable(r for r, _ in rows[s]), dtype=dtype)
        out[split] = (arr, meta)
    return out


# ---------------------------------------------------------------------------------------------------- shards
def _write_npy(path: Path, array: np.ndarray) -> None:
    """Every byte of a dataset goes through here (tests simulate a full disk by replacing it)."""
    with open(path, "wb") as f:
        np.save(f, array, allow_pickle=False)


class _ShardWriter:
    """Buffers one split's rows and writes them as numbered .npy shards of `rows_per_shard` rows."""

    def __init__(self, directory: Path, split: str, rows_per_shard: int) -> None:
        self.directory, self.split, self.rows_per_shard = directory, split, rows_per_shard
        self.pending: list[tuple[np.ndarray, np.ndarray]] = []  # buffered (rows, their meta) per chunk
        self.shards: list[dict] = []
        self.buffered = self.bytes_written = 0

    def add(self, ids: np.ndarray, meta: np.ndarray) -> None:
        if len(ids):
            self.pending.append((ids, meta))
            self.buffered += len(ids)
        while self.buffered >= self.rows_per_shard:
            self._flush(self.rows_per_shard)

    def close(self) -> None:
        if self.buffered:
            self._flush(self.buffered)

    def _flush(self, n: int) -> None:
        ids, meta = map(np.concatenate, zip(*self.pending))
        name = f"{self.split}-{len(self.shards):05d}"
        _write_npy(self.directory / f"{name}.ids.npy", ids[:n])
        _write_npy(self.directory / f"{name}.meta.npy", meta[:n])
        self.bytes_written += ids[:n].nbytes + meta[:n].nbytes
        # each file's sha256 (as sha256sum gives it), read back while still cached: a run records what it trained on
        self.shards.append({"ids": f"{name}.ids.npy", "meta": f"{name}.meta.npy", "rows": n,
                            "ids_sha256": sha256_of(self.directory / f"{name}.ids.npy"),
                            "meta_sha256": sha256_of(self.directory / f"{name}.meta.npy")})
        self.pending = [(ids[n:], meta[n:])] if n < len(ids) else []
        self.buffered -= n


# ---------------------------------------------------------------------------------------------------- prepare
def prepare(
    sources: list[str], out_dir, tokenizer_path: str | None = None, vocab_size: int = 30522, seq_len: int = 128,
    casing: str = "auto", workers: int = 0, force: bool = False, seed: int = 0, command: str = "",
    validation_fraction: float = 0.01, tokenizer_sample_mb: float = TOKENIZER_SAMPLE_MB, quiet: bool = False,
    chunk_chars: int = CHUNK_CHARS, rows_per_shard: int = ROWS_PER_SHARD, tokenizer_type: str = "wordpiece",
    sentencepiece_model: str = "unigram", byte_fallback: bool = True, character_coverage: float = CHARACTER_COVERAGE,
    pack_documents: bool = False,
) -> dict:
    """Text -> tokenizer -> packed examples in `out_dir`. Returns the manifest; reuses an identical existing dataset.
    The options are `tinyelectra prepare`'s (casing: tokenizer.choose_casing); the manifest records each choice and
    its reason, and the fill ratio."""
    started = time.perf_counter()
    console = make_console(quiet=quiet, highlight=False)
    say = lambda msg: console.print(f"prepare: {msg}", markup=False)  # noqa: E731
    for bad, message in (  # the first that applies is the error
        (not MIN_SEQ_LEN <= seq_len <= MAX_SEQ_LEN,
         f"--seq-len {seq_len}: must be between {MIN_SEQ_LEN} and {MAX_SEQ_LEN}"),
        (not 0.0 <= validation_fraction < 0.5, f"--validation-fraction {validation_fraction}: must be in [0, 0.5)"),
        (workers < 0, f"--workers {workers}: must be >= 0 (0 = one per CPU core)"),
        (tokenizer_sample_mb < 0, f"--tokenizer-sample-mb {tokenizer_sample_mb}: must be >= 0 (0 = all the text)"),
        (seed < 0, f"--seed {seed}: must be >= 0"),
        (casing not in CASINGS, f"--casing {casing!r}: choose {', '.join(CASINGS)}"),
        (tokenizer_type not in TOKENIZER_TYPES,
         f"--tokenizer-type {tokenizer_type!r}: choose {' or '.join(TOKENIZER_TYPES)}"),
        (tokenizer_type == "sentencepiece" and casing == "uncased" and not tokenizer_path,
         "--casing uncased: a SentencePiece model trained here keeps the text as written (cased); "
         "use --casing auto or cased, or --tokenizer-type wordpiece"),
        (not 0.0 < character_coverage <= 1.0, f"--character-coverage {character_coverage}: must be in (0, 1]"),
    ):
        if bad:
            raise UserError(message)
    out_dir = Path(out_dir).expanduser()
    inputs = resolve_inputs(list(sources))
    given_lowercase = {"auto": None, "uncased": True, "cased": False}[casing]  # for a bare vocab.txt only
    tokenizer = Tokenizer.load(tokenizer_path, lowercase=given_lowercase) if tokenizer_path else None
    if tokenizer is None and not MIN_VOCAB_SIZE <= vocab_size <= MAX_VOCAB_SIZE:
        raise UserError(f"--vocab-size {vocab_size}: must be between {MIN_VOCAB_SIZE} and {MAX_VOCAB_SIZE}")
    if tokenizer is not None:
        tokenizer_request: dict = {"file_fingerprint": tokenizer.fingerprint()}
    elif tokenizer_type == "sentencepiece":
        tokenizer_request = {"type": "sentencepiece", "version": SENTENCEPIECE_TRAINING_VERSION,
                             "train_vocab_size": vocab_size, "model": sentencepiece_model,
                             "byte_fallback": byte_fallback, "character_coverage": character_coverage,
                             "sample_mb": tokenizer_sample_mb}
    else:
        tokenizer_request = {"train_vocab_size": vocab_size, "casing": casing, "character_coverage": character_coverage,
                             "sample_mb": tokenizer_sample_mb}
    request = {
        "format_version": FORMAT_VERSION, "builder": BUILDER_VERSION,
        "inputs": [i.identity() for i in inputs], "tokenizer": tokenizer_request,
        "seq_len": seq_len, "seed": seed, "validation_fraction": validation_fraction,
        "chunk_chars": chunk_chars, "rows_per_shard": rows_per_shard,
        **({"pack_documents": True} if pack_documents else {}),  # absent when off: older requests still match
    }
    with holding(out_dir, "--out", reserves=("*",)):  # one writer, from before its first byte to its end
        written = Written(out_dir, "prepare")
        cached = _check_out_dir(out_dir, request, force)
        if cached is not None:
            say(f"{out_dir} already holds this dataset (same sources and settings): reusing it")
            return cached

        check_writable(out_dir, "--out")  # before any work
        delete_temporaries(out_dir, "prepare")  # what a killed prepare left
        tmp = out_dir / f"{STAGING}.tmp-{os.getpid()}"  # written inside --out, then moved into place
        writers: dict[str, _ShardWriter] = {}
        try:
            written.add(out_dir / STAGING, kind="dir")  # on record before its first byte: a temporary of it
            tmp.mkdir()
            reader = CorpusReader(inputs)
            warn = lambda msg: say(f"warning: {msg}")  # noqa: E731

            # 1. tokenizer: a sample of the text decides the casing (and trains the tokenizer)
            t0 = time.perf_counter()
            sample_mb = tokenizer_sample_mb if tokenizer is None else min(
                tokenizer_sample_mb or PROFILE_SAMPLE_MB, PROFILE_SAMPLE_MB)
            sample = _sample_lines(reader, sample_mb)
            sample_chars = sum(map(len, sample))
            if not any(line.strip() for line in sample):  # before a tokenizer is trained on nothing
                gone = reader.stats.skipped
                skipped = f"; {len(gone)} skipped, the first {gone[0]['path']}: {gone[0]['reason']}" if gone else ""
                raise UserError(f"--corpus: no text to prepare ({len(inputs)} input(s), no characters other than white "
                                f"space{skipped}); is it empty?")
            profile = text_profile(sample)
            what = f"the first {tokenizer_sample_mb:g} MB" if tokenizer_sample_mb > 0 else "all"
            if tokenizer is not None:
                lowercase = tokenizer.lowercase
                reason = f"from the given tokenizer ({'uncased' if lowercase else 'cased'})"
                warning = choose_casing("uncased", profile)[2] if lowercase else None
            elif tokenizer_type == "sentencepiece":
                lowercase, warning = False, None
                reason = "SentencePiece keeps the text as written (cased, normalization identity)"
                say(f"training a {vocab_size}-entry SentencePiece {sentencepiece_model} model on {what} of the text "
                    f"(character coverage {character_coverage:g}, byte fallback {'on' if byte_fallback else 'off'})")
                tokenizer = Tokenizer.train_sentencepiece(sample, vocab_size, sentencepiece_model, character_coverage,
                                                          byte_fallback,
                                                          threads=workers or len(os.sched_getaffinity(0)))
            else:
                lowercase, reason, warning = choose_casing(casing, profile)
                say(f"training a {vocab_size}-entry WordPiece on {what} of the text, "
                    f"{'uncased' if lowercase else 'cased'} ({reason})")
                tokenizer = Tokenizer.train(sample, vocab_size, lowercase, character_coverage)
                alphabet = tokenizer.alphabet
                if (alphabet["coverage"] < character_coverage
                        and alphabet["characters"] == alphabet["limit_from_vocab_size"]):
                    warn(f"the {vocab_size}-entry vocabulary has room for {alphabet['characters']:,} of the text's "
                         f"{alphabet['distinct_characters']:,} characters (covering {100 * alphabet['coverage']:.2f}% "
                         "of their occurrences; the rest become [UNK]); a larger --vocab-size covers more")
            if warning:
                warn(warning)
            del sample
            tokenizer_seconds = time.perf_counter() - t0
            tokenizer.save(tmp / "tokenizer")
            casing_record = {"lowercase": lowercase, "requested": casing if tokenizer_path is None else None,
                             "reason": reason}
            write_json(tmp / "tokenizer" / PROFILE_FILE, {"casing": casing_record, "languages": profile["languages"],
                                                            "scripts": profile["scripts"]})
            dtype = "uint16" if tokenizer.vocab_size <= 2**16 else "uint32"

            # 2. examples
            t1 = time.perf_counter()
            writers = {s: _ShardWriter(tmp, s, rows_per_shard) for s in SPLITS}
            totals = {"documents": [0, 0], "lines": 0, "line_tokens": 0, "examples": [0, 0],
                      "single_segment_rows": [0, 0],
                      "single_segment_draws": 0, "random_target_draws": 0, "filled": [0, 0]}  # filled: real tokens
            settings = {"seq_len": seq_len, "seed": seed, "validation_fraction": validation_fraction, "dtype": dtype,
                        "pack_documents": pack_documents}
            known_total = sum(i.size_bytes for i in inputs) if all(i.kind == "file" for i in inputs) else None
            n_workers = workers or len(os.sched_getaffinity(0))
            if workers == 0 and (all(i.kind == "builtin" for i in inputs) or (known_total or 1e18) < 4 * chunk_chars):
                n_workers = 1  # a small corpus: starting worker processes would cost more than the work
            with _progress(console, known_total) as progress:
                for result in _run_chunks(_chunks(reader.documents(warn), chunk_chars), tokenizer, settings, n_workers):
                    for split in SPLITS:
                        writers[split].add(*result[split])
                    for key, total in totals.items():
                        add = result[key]
                        totals[key] = [a + b for a, b in zip(total, add)] if isinstance(total, list) else total + add
                    progress(reader.stats.input_bytes_done, reader.stats.text_bytes)
                for w in writers.values():
                    w.close()
                progress(reader.stats.input_bytes_done, reader.stats.text_bytes)
            build_seconds = time.perf_counter() - t1
            if totals["examples"][0] == 0:
                skipped = f"; {len(reader.stats.skipped)} input(s) skipped" if reader.stats.skipped else ""
                raise UserError(f"--corpus: the text yielded no training examples ({sum(totals['documents'])} documents"
                                f"{skipped}); is it empty?")

            seconds = time.perf_counter() - started
            fill = [filled / max(examples * seq_len, 1)
                    for filled, examples in zip(totals["filled"], totals["examples"])]
            # text tokens: the real ones less [CLS] and one [SEP] per example, and a second [SEP] per two-segment
            # example
            tokens = [f - 3 * e + s for f, e, s in zip(totals["filled"], totals["examples"],
                                                       totals["single_segment_rows"])]
            manifest = {
                "format_version": FORMAT_VERSION, "created_by": f"tinyelectra {__version__}", "request": request,
                "command": command, "sources": _summarize_sources(inputs), "skipped_inputs": reader.stats.skipped,
                "invalid_utf8_replaced": reader.stats.replaced_invalid_bytes,
                # longer than corpus.MAX_DOCUMENT_CHARS: continued as new ones
                "documents_cut": reader.stats.documents_cut,
                "text_bytes": reader.stats.text_bytes, "documents": dict(zip(SPLITS, totals["documents"])),
                "lines": totals["lines"], "examples": dict(zip(SPLITS, totals["examples"])),
                "tokens": dict(zip(SPLITS, tokens)),  # text tokens stored in examples (no specials, no padding)
                # all tokens of all lines: the official builder cuts each example's segments to fit T, so a corpus of
                # long lines (paragraphs) keeps only part of its tokens
                "line_tokens": totals["line_tokens"],
                "single_segment_rows": dict(zip(SPLITS, totals["single_segment_rows"])),
                # real tokens ([CLS], [SEP] and text) per token slot of the examples; the rest is padding
                "fill_ratio": dict(zip(SPLITS, (round(f, 4) for f in fill))),
                "pack_documents": pack_documents,
                "builder_draws": {"single_segment": totals["single_segment_draws"],
                                  "random_target": totals["random_target_draws"]},
                "seq_len": seq_len, "dtype": dtype, "seed": seed, "validation_fraction": validation_fraction,
                "tokenizer": {
                    "kind": tokenizer.kind, "fingerprint": tokenizer.fingerprint(), "vocab_size": tokenizer.vocab_size,
                    "lowercase": tokenizer.lowercase, "path": "tokenizer", "source": tokenizer_path or "trained",
                    "special_ids": {r: getattr(tokenizer, f"{r}_id") for r in SPECIAL_ROLES},
                    "training_sample_chars": sample_chars if tokenizer_path is None else 0,
                    "vocab_padding": tokenizer.vocab_padding, "casing": casing_record, "text": profile,
                    **({"alphabet": tokenizer.alphabet} if tokenizer.alphabet else {}),
                    **({"sentencepiece": {"model": sentencepiece_model, "byte_fallback": byte_fallback,
                                          "character_coverage": character_coverage}}
                       if tokenizer_path is None and tokenizer_type == "sentencepiece" else {}),
                },
                "splits": {s: {"rows": sum(x["rows"] for x in w.shards), "shards": w.shards}
                           for s, w in writers.items()},
                "seconds": {"tokenizer": round(tokenizer_seconds, 3), "examples": round(build_seconds, 3),
                            "total": round(seconds, 3)},
                "text_mb_per_second": round(reader.stats.text_bytes / 1e6 / seconds, 3), "workers": n_workers,
                "python": platform.python_version(),
            }
            write_json(tmp / "manifest.json", manifest)  # last: a directory without it is never taken as complete
            _put_in_place(tmp, out_dir, written, say)
        except OSError as e:
            shutil.rmtree(tmp, ignore_errors=True)
            if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
                written = sum(w.bytes_written for w in writers.values()) / 1e6
                raise UserError(f"{(e.strerror or 'write failed').lower()} while writing {out_dir} ({written:.0f} MB "
                                "of shards were written, now removed); free some space or choose another "
                                "--out") from None
            raise UserError(f"--out {out_dir}: {os_error_line(e)} (nothing was left behind)") from None
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        finally:
            # its record entry, gone with it (no record when nothing was written)
            tidy_record(out_dir, out_dir / STAGING)
        ex, kept = manifest["examples"], sum(tokens)
        say(
            f"{sum(manifest['documents'].values()):,} documents, {kept:,} tokens "
            f"({100 * kept / max(manifest['line_tokens'], 1):.0f}% of the text's; the builder cuts long lines) -> "
            f"{ex['train']:,} train + {ex['validation']:,} validation examples of {seq_len}, "
            f"{100 * fill[0]:.0f}% of their token slots filled, in {seconds:.1f} s "
            f"({manifest['text_mb_per_second']:.2f} MB/s of text) -> {out_dir}"
        )
        if heldout := heldout_warning(ex["validation"], validation_fraction):
            say(f"warning: {heldout}")
        if fill[0] < LOW_FILL_RATIO:
            per_doc = kept / max(sum(totals["documents"]), 1)
            advice = ("add --pack-documents so that short documents share examples" if not pack_documents else
                      "the text itself is short; a smaller --seq-len fits it better")
            say(f"warning: only {100 * fill[0]:.0f}% of the token slots hold text, {100 * (1 - fill[0]):.0f}% are "
                f"padding: documents average {per_doc:.0f} tokens for examples of {seq_len} (a blank line ends a "
                f"document); {advice}")
        return manifest


def _sample_lines(reader: CorpusReader, sample_mb: float) -> list[str]:
    """The lines of the first `sample_mb` MB of text (0 = all of it), whole documents."""
    first = next(_chunks(reader.documents(), sample_mb * 1e6 if sample_mb > 0 else float("inf")), [])
    return [line for doc in first for line in doc]  # (warnings come once, in the full pass)


def _chunks(documents: Iterator[Document], chars: float) -> Iterator[list[Document]]:
    """Consecutive documents, grouped until their text reaches `chars` characters."""
    docs: list[Document] = []
    n = 0
    for d in documents:
        docs.append(d)
        n += sum(map(len, d))
        if n >= chars:
            yield docs
            docs, n = [], 0
    if docs:
        yield docs


def _run_chunks(chunks: Iterator[list[Document]], tokenizer: Tokenizer, settings: dict, workers: int):
    """Yield each chunk's result, in order, from `workers` processes."""
    if workers <= 1:
        _init_worker(tokenizer, settings, single_threaded=False)
        yield from map(_process_chunk, count(), chunks)
        return
    import multiprocessing

    # spawn: no forked copies of the tokenizer's thread pool (tokenizers warns and turns parallelism off after fork).
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"), initializer=_init_worker,
                             initargs=(tokenizer, settings, True)) as pool:
        pending: deque = deque()
        for index, docs in enumerate(chunks):
            pending.append(pool.submit(_process_chunk, index, docs))
            if len(pending) >= 2 * workers:  # bounded: never read the whole corpus ahead of the workers
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


@contextmanager
def _progress(console, total_bytes: int | None):
    """A rich progress bar on stderr: on-disk bytes done (bar, ETA) and text MB/s; yields update(done, text bytes)."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    start, next_line_at = time.perf_counter(), 15.0
    columns = [TextColumn("prepare: examples", markup=False), BarColumn()]
    if total_bytes is not None:  # unknown for hf: and builtin sources
        columns += [TextColumn("{task.percentage:>3.0f}%  ETA"), TimeRemainingColumn()]
    bar = Progress(*columns, TextColumn("{task.fields[rate]}"), TimeElapsedColumn(), console=console)
    task = bar.add_task("examples", total=total_bytes, rate="")

    def update(done_bytes: int, text_bytes: int) -> None:
        nonlocal next_line_at
        elapsed = max(time.perf_counter() - start, 1e-9)
        rate = f"{text_bytes / 1e6:,.0f} MB, {text_bytes / 1e6 / elapsed:.1f} MB/s"
        bar.update(task, completed=done_bytes, rate=rate)
        if not console.is_terminal and elapsed >= next_line_at:  # logs get a plain line every 15 s
            next_line_at = elapsed + 15
            where = f", {100 * done_bytes / total_bytes:.0f}% of the input" if total_bytes else ""
            console.print(f"prepare: {rate}{where}, {elapsed:.0f} s", markup=False)

    with bar:
        yield update


def _dataset_files(out_dir: Path) -> set[Path]:
    """The files of the dataset in `out_dir` as they are now: what its record says prepare wrote; for a dataset
    prepared before records existed, manifest.json, the shards it lists and the files in tokenizer/."""
    if (out_dir / RECORD_NAME).is_file():
        return covered(out_dir, ("prepare",))[0]
    try:
        manifest = json.loads((out_dir / "manifest.json").read_text(encoding="utf-8"))
        names = [f for s in manifest["splits"].values() for sh in s["shards"] for f in (sh["ids"], sh["meta"])]
    except (OSError, ValueError, UnicodeDecodeError, KeyError, TypeError, AttributeError):
        return set()
    tokenizer = out_dir / "tokenizer"
    listed = [out_dir / "manifest.json", *(out_dir / n for n in names if "/" not in n and n not in (".", ".."))]
    return {p for p in listed if p.is_file() and not p.is_symlink()} | \
        ({p for p in tokenizer.rglob("*") if p.is_file() and not p.is_symlink()}
         if tokenizer.is_dir() and not tokenizer.is_symlink() else set())


def _check_out_dir(out_dir: Path, request: dict, force: bool) -> dict | None:
    """The cached manifest if `out_dir` holds exactly this request; None to build; UserError if we must not touch it
    (it holds another dataset and no --force, or files of one's own where the dataset goes)."""
    if not out_dir.exists():
        return None
    if not out_dir.is_dir():
        raise UserError(f"--out {out_dir}: exists and is not a directory")
    ours = _dataset_files(out_dir)
    others = [p for p in foreign(out_dir, out_dir, ("prepare",)) if p not in ours]
    manifest_path = out_dir / "manifest.json"
    if manifest_path not in ours:
        if others:
            raise UserError(f"--out {out_dir}: a non-empty directory that is not a tinyelectra dataset; "
                            f"choose a new or empty directory")
        return None  # new, or what a killed prepare left
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        manifest = {}
    if manifest.get("request") == request and files_present(out_dir, manifest):  # ours, complete: reused
        return manifest
    if manifest.get("request") != request and not force:
        saved = manifest.get("request")
        why = difference_text(differences(saved, request)[0]) if isinstance(saved, dict) else "no request recorded"
        raise UserError(f"--out {out_dir} already holds a different dataset (other sources or settings, or prepared by "
                        f"an earlier tinyelectra: {why}); add --force to replace it, or choose another --out")
    for p in others:  # a file of one's own where the new dataset's go: never replaced
        name = p.relative_to(out_dir).as_posix()
        if name in ("manifest.json", "tokenizer") or re.fullmatch(r"(train|validation)-\d{5}\.(ids|meta)\.npy", name):
            raise UserError(f"--out {out_dir}: {p.relative_to(out_dir)} is not what tinyelectra wrote there, and the "
                            "new dataset would replace it; move it away, or choose another --out")
    return None


def _put_in_place(tmp: Path, out_dir: Path, written: Written, say) -> None:
    """The finished dataset in `tmp` (inside `out_dir`) becomes `out_dir`'s: the dataset there before is deleted
    (manifest.json first, so that the folder is never taken for a dataset part-way; only its own files: what else
    the folder holds stays, and is named), then the new files are recorded and moved in, manifest.json last."""
    ours = _dataset_files(out_dir)  # its files (and the staged ones in `tmp`)
    old = sorted(p for p in ours if tmp not in p.parents)
    if old:
        (out_dir / "manifest.json").unlink(missing_ok=True)
        for p in old:
            p.unlink(missing_ok=True)
        for d in sorted({q for p in old for q in p.parents if out_dir in q.parents}, key=lambda q: len(q.parts),
                        reverse=True):
            with contextlib.suppress(OSError):
                d.rmdir()  # tokenizer/, when that was all it held
        tidy_record(out_dir)
        kept = [p.relative_to(out_dir).as_posix() for p in foreign(out_dir, out_dir, ("prepare",))
                if tmp not in p.parents]
        say(f"replaced the dataset in {out_dir}: deleted its {len(old)} files (manifest.json, the shards, tokenizer/)"
            + (f"; kept everything else: {', '.join(kept[:8])}{f' and {len(kept) - 8} more' if len(kept) > 8 else ''}"
               if kept else ""))
    # a file of one's own where one of the dataset's goes (tokenizer/vocab.txt): never replaced (`ours` is still
    # the dataset's files that exist: those deleted above are gone, and nothing else changed)
    for p in sorted(tmp.rglob("*")):
        if not p.is_dir() and (target := out_dir / p.relative_to(tmp)).exists() and target not in ours:
            raise UserError(f"--out {out_dir}: {target.relative_to(out_dir)} is not what tinyelectra wrote there, and "
                            "the new dataset would replace it; move it away, or choose another --out")
    written.add_tree(tmp, out_dir)
    _move_into(tmp, out_dir)
    tmp.rmdir()
    fsync_dir(out_dir)


def _move_into(source: Path, target: Path) -> None:
    """Every entry of `source` renamed into `target`, manifest.json last; a folder that exists there already
    (tokenizer/ holding files of one's own) is filled file by file, keeping what it holds."""
    for p in sorted(source.iterdir(), key=lambda p: p.name == "manifest.json"):
        there = target / p.name
        if p.is_dir() and there.is_dir() and not there.is_symlink():
            _move_into(p, there)
            p.rmdir()
        else:
            os.replace(p, there)
    fsync_dir(target)


def _summarize_sources(inputs) -> list[dict]:
    by_spec: dict[str, dict] = {}
    for i in inputs:
        s = by_spec.setdefault(i.spec, {"spec": i.spec, "kind": i.kind, "files": 0, "bytes_on_disk": 0})
        if i.kind == "file":
            s["files"] += 1
            s["bytes_on_disk"] += i.size_bytes
    return list(by_spec.values())


