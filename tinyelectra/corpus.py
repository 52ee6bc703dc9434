"""Corpus readers: turn `--corpus` sources into documents, each a list of sentence lines.

A document never continues across a boundary: a blank line in plain text, `<doc ...>` / `</doc>` in WikiExtractor
output (whose first line, the title, is dropped), one record of a .jsonl / .parquet file or of a Hugging Face
dataset (its `text` field; the lines inside it are the sentence units), and the end of every file.
Lines are stripped; empty lines never become sentence units.

Inputs that look binary or are not UTF-8 in their first 64 KiB are skipped, listed with the reason and counted;
stray invalid bytes later in a text file are replaced by U+FFFD (which the BERT normalizer then drops) and counted.
What does not live here: tokenization and example building (prepare.py).
"""

from __future__ import annotations

import ast
import bz2
import codecs
import glob
import gzip
import json
import lzma
import os
import stat
import sys
import sysconfig
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import Iterator

from tinyelectra.errors import UserError

SNIFF_BYTES = 64 * 1024
# A document longer than this (characters) is cut at a line boundary and continues as a new document: it bounds
# memory and keeps work spread over the workers when a file has no blank lines at all. Counted in the manifest.
MAX_DOCUMENT_CHARS = 1 << 22
COMPRESSION = {".gz": gzip.GzipFile, ".bz2": bz2.BZ2File, ".xz": lzma.LZMAFile}
BUILTIN_EXCLUDED_PARTS = {"test", "tests", "idlelib", "turtledemo", "tkinter", "lib2to3", "site-packages"}

Document = list[str]


@dataclass(frozen=True)
class Input:
    """One resolved input: a file, a Hugging Face dataset or the built-in corpus."""

    spec: str  # what the user wrote in --corpus
    kind: str  # "file" | "hf" | "builtin"
    path: str = ""  # absolute path for files; "NAME[:CONFIG]" for hf
    size_bytes: int = 0  # on disk (compressed size for .gz/.bz2/.xz); 0 when unknown
    mtime_ns: int = 0
    local_files: tuple[tuple[str, int, int], ...] = ()  # hf:DIR on this machine: (path in DIR, size, mtime_ns) each

    def identity(self) -> dict:
        """What decides whether two prepare requests read the same text (the cache key): a file's path, size and
        modification time; a hub dataset's name; a local `hf:DIR`'s name and the same of each file in it."""
        if self.kind == "builtin":
            return {"kind": "builtin", "python": ".".join(map(str, sys.version_info[:3]))}
        identity = {"kind": self.kind, "path": self.path, "size_bytes": self.size_bytes, "mtime_ns": self.mtime_ns}
        return identity | ({"local_files": [list(f) for f in self.local_files]} if self.local_files else {})


def resolve_inputs(specs: list[str]) -> list[Input]:
    """Expand files, folders (recursively, sorted) and globs; a path that does not exist is a UserError."""
    if not specs:
        raise UserError("--corpus: give at least one source")
    inputs: list[Input] = []
    for spec in specs:
        if spec == "builtin":
            inputs.append(Input(spec, "builtin", "builtin"))
            continue
        if spec.startswith("hf:"):
            name = spec[3:]
            if not name or name.startswith(":"):
                raise UserError(f"--corpus {spec}: expected hf:NAME or hf:NAME:CONFIG")
            local = Path(name.partition(":")[0]).expanduser()  # hf:DIR: `datasets` reads a folder on this machine
            files = [(str(q.relative_to(local)), q.stat()) for q in (_files_in(local) if local.is_dir() else [])]
            inputs.append(Input(spec, "hf", name,
                                local_files=tuple((f, st.st_size, st.st_mtime_ns) for f, st in files)))
            continue
        p = Path(spec).expanduser()
        if p.is_file():
            paths = [p]
        elif p.is_dir():
            paths = _files_in(p)
            if not paths:
                raise UserError(f"--corpus {spec}: the folder holds no files")
        elif glob.has_magic(spec):
            paths = sorted(Path(q) for q in glob.glob(os.path.expanduser(spec), recursive=True) if Path(q).is_file())
            if not paths:
                raise UserError(f"--corpus {spec}: no file matches this pattern")
        elif p.exists():  # a FIFO, socket or device: prepare reads its inputs twice and needs their sizes
            raise UserError(f"--corpus {spec}: {_file_kind(p)}, not a regular file or folder; save the text to a file "
                            "first (prepare reads it twice: once for the tokenizer, once for the examples)")
        else:
            raise UserError(f"--corpus {spec}: no such file or directory")
        for q in paths:
            st = q.stat()
            inputs.append(Input(spec, "file", str(q.resolve()), st.st_size, st.st_mtime_ns))
    return inputs


def _file_kind(p: Path) -> str:
    mode = p.stat().st_mode
    return ("a named pipe (FIFO)" if stat.S_ISFIFO(mode) else "a character device" if stat.S_ISCHR(mode) else
            "a block device" if stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode) else "a special file")


def _files_in(folder: Path) -> list[Path]:
    """The files under `folder`, recursively, sorted; hidden ones (a part starting with ".") left out."""
    return sorted(q for q in folder.rglob("*") if q.is_file()
                  and not any(s.startswith(".") for s in q.relative_to(folder).parts))


@dataclass
class ReadStats:
    """What reading found, for the manifest."""

    skipped: list[dict] = field(default_factory=list)  # {"path", "reason"}
    replaced_invalid_bytes: int = 0  # invalid UTF-8 sequences replaced by U+FFFD after the sniffed head
    documents_cut: int = 0  # documents longer than MAX_DOCUMENT_CHARS, continued as new documents
    text_bytes: int = 0  # decompressed bytes of text read
    input_bytes_done: int = 0  # on-disk bytes consumed (drives the progress bar)


_REPLACED = [0]
_CUT = [0]  # documents cut at MAX_DOCUMENT_CHARS


def _count_and_replace(err: UnicodeDecodeError):
    _REPLACED[0] += 1
    return "\ufffd", err.end


codecs.register_error("tinyelectra-count", _count_and_replace)


class CorpusReader:
    """Iterates documents over all inputs, in order. Re-iterable: each call to documents() starts again."""

    def __init__(self, inputs: list[Input]) -> None:
        self.inputs = inputs
        self.stats = ReadStats()

    def documents(self, warn=None) -> Iterator[Document]:
        """Yield documents; `warn(message)` is called once per skipped input. Updates self.stats as it goes."""
        self.stats = ReadStats()
        for inp in self.inputs:
            cut_before = _CUT[0]
            if inp.kind == "builtin":
                yield from self._counted(builtin_documents())
            elif inp.kind == "hf":
                yield from self._counted(hf_documents(inp.path))
            else:
                yield from self._file_documents(inp, warn)
                self.stats.input_bytes_done += inp.size_bytes
            self.stats.documents_cut += _CUT[0] - cut_before

    def _counted(self, docs: Iterator[Document]) -> Iterator[Document]:
        for d in docs:
            self.stats.text_bytes += sum(len(line.encode("utf-8")) + 1 for line in d)
            yield d

    def _skip(self, inp: Input, reason: str, warn) -> None:
        self.stats.skipped.append({"path": inp.path, "reason": reason})
        if warn is not None:
            warn(f"skipping {inp.path}: {reason}")

    def _file_documents(self, inp: Input, warn) -> Iterator[Document]:
        path = Path(inp.path)
        suffix = path.suffix.lower()
        inner = Path(path.stem).suffix.lower() if suffix in COMPRESSION else suffix
        if inner == ".parquet":
            yield from self._counted(parquet_documents(path))
            return
        damage: list[tuple[int, BaseException]] = []  # where the file's text ended early, and why
        try:
            with (COMPRESSION[suffix](path) if suffix in COMPRESSION else open(path, "rb")) as f:
                head = _read_upto(f, SNIFF_BYTES, damage)
        except (OSError, EOFError, lzma.LZMAError) as e:
            damage.append((0, e))
            head = b""
        if not head and damage:
            self._skip(inp, f"cannot be read or decompressed ({damage[0][1]})", warn)
            return
        damage.clear()
        if b"\x00" in head:
            self._skip(inp, "looks binary (NUL bytes in the first 64 KiB)", warn)
            return
        try:
            head.decode("utf-8")
        except UnicodeDecodeError as e:
            if e.start < len(head) - 3:  # not just a multi-byte character cut by the sniff window
                self._skip(inp, f"not UTF-8 text (byte 0x{head[e.start]:02x} at offset {e.start})", warn)
                return
        done_before = self.stats.input_bytes_done
        replaced_before = _REPLACED[0]
        with open(path, "rb") as raw:
            stream = ((gzip.GzipFile(fileobj=raw) if suffix == ".gz" else COMPRESSION[suffix](raw))
                      if suffix in COMPRESSION else raw)
            lines = _block_lines(stream, raw, self.stats, done_before, damage)
            if inner in (".jsonl", ".json"):
                yield from jsonl_documents(lines, inp.path)
            elif head.lstrip().startswith(b"<doc"):
                yield from wiki_documents(lines)
            else:
                yield from text_documents(lines)
            if damage:  # the documents before the damage were read (and kept); the line it cut is dropped
                self._skip(inp, f"damaged after {damage[0][0]:,} bytes of text ({damage[0][1]}): the text before "
                                "the damage is kept, the line it cut and the rest of the file are skipped", warn)
            self.stats.text_bytes += stream.tell()
        self.stats.replaced_invalid_bytes += _REPLACED[0] - replaced_before
        self.stats.input_bytes_done = done_before


def _read_upto(stream, size: int, damage: list) -> bytes:
    """Up to `size` bytes of `stream`, through read1: a damaged compressed file (a truncated .gz) gives every byte
    before the damage (`read(size)` would lose the whole block), and the error is appended to `damage` as (bytes of
    the stream read before it, error) instead of raised."""
    parts, n = [], 0
    while n < size:
        try:
            part = stream.read1(size - n)
        except (OSError, EOFError, lzma.LZMAError) as e:
            damage.append((stream.tell() if hasattr(stream, "tell") else n, e))
            break
        if not part:
            break
        parts.append(part)
        n += len(part)
    return b"".join(parts)


def _block_lines(stream, raw, stats: ReadStats, done_before: int, damage: list,
                 block_bytes: int = 4 << 20) -> Iterator[str]:
    """The lines of a binary stream, decoded as UTF-8 in 4 MiB blocks (several times faster than a text wrapper's
    line iterator); lines end at "\n" only, as in the official builder's reader. Updates the progress position.
    A read error (a damaged compressed file) ends the lines at the last whole one before it, noted in `damage`."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="tinyelectra-count")
    rest = ""
    while True:
        block = _read_upto(stream, block_bytes, damage)
        stats.input_bytes_done = done_before + raw.tell()
        text = rest + decoder.decode(block, final=not block or bool(damage))
        lines = text.split("\n")
        rest = lines.pop()
        yield from lines
        if damage:
            return  # the line the damage cut (`rest`) is not kept
        if not block:
            break
    if rest:
        yield rest


class _Doc:
    """The document being read: its lines, handed out in pieces of at most about MAX_DOCUMENT_CHARS."""

    def __init__(self) -> None:
        self.lines: Document = []
        self.chars = 0

    def add(self, line: str) -> list[Document]:
        """Append a line; once the document reaches MAX_DOCUMENT_CHARS, hand it out (see take)."""
        self.lines.append(line)
        self.chars += len(line)
        if self.chars < MAX_DOCUMENT_CHARS:
            return []
        _CUT[0] += 1
        return self.take()

    def take(self) -> list[Document]:
        """The document so far ([] when it has no lines), and start a new one."""
        doc, self.lines, self.chars = self.lines, [], 0
        return [doc] if doc else []


def text_documents(lines) -> Iterator[Document]:
    """Plain text: blank lines separate documents."""
    doc = _Doc()
    for line in lines:
        line = line.strip()
        yield from doc.add(line) if line else doc.take()
    yield from doc.take()


def wiki_documents(lines) -> Iterator[Document]:
    """WikiExtractor output: `<doc ...>`, the title line (dropped), paragraphs, `</doc>`. Text outside is plain text."""
    doc = _Doc()
    inside = False
    outside: list[str] = []
    drop_title = False
    for line in lines:
        line = line.strip()
        if line.startswith("<doc") and line.endswith(">") and (len(line) == 5 or line[4].isspace()):
            yield from text_documents(outside)
            outside = []
            yield from doc.take()  # a <doc> without its </doc>
            inside, drop_title = True, True
        elif line == "</doc>":
            yield from doc.take()
            inside = False
        elif inside:
            if line and drop_title:
                drop_title = False
            elif line:
                yield from doc.add(line)
        else:
            outside.append(line)  # plain text between articles: blank lines separate its documents
            if not line:
                yield from text_documents(outside)
                outside = []
    yield from doc.take()
    yield from text_documents(outside)


def _record_documents(text, where: str) -> Iterator[Document]:
    """One record's text as one document (blank lines do not split it; cut after MAX_DOCUMENT_CHARS)."""
    if not isinstance(text, str):
        raise UserError(f"{where}: the 'text' field is {type(text).__name__}, not a string")
    return text_documents(line for line in text.split("\n") if line.strip())


def jsonl_documents(lines, path: str) -> Iterator[Document]:
    """One JSON object per line; its `text` field is one document."""
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise UserError(f"{path}:{n}: not valid JSON ({e.msg})") from None
        if not isinstance(record, dict) or "text" not in record:
            keys = ", ".join(record) if isinstance(record, dict) else type(record).__name__
            raise UserError(f"{path}:{n}: record has no 'text' field (has: {keys})")
        yield from _record_documents(record["text"], f"{path}:{n}")


def parquet_documents(path: Path) -> Iterator[Document]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise UserError(f"{path}: reading .parquet needs pyarrow (pip install pyarrow)") from None
    try:
        f = pq.ParquetFile(path)
    except Exception as e:  # pyarrow raises ArrowInvalid and friends
        raise UserError(f"{path}: not a readable parquet file ({str(e).splitlines()[0][:200]})") from None
    names = f.schema_arrow.names
    if "text" not in names:
        raise UserError(f"{path}: parquet file has no 'text' column (columns: {', '.join(names)})")
    for batch in f.iter_batches(columns=["text"], batch_size=1024):
        for text in batch.column(0).to_pylist():
            if text is not None:
                yield from _record_documents(text, str(path))


def hf_documents(name_config: str) -> Iterator[Document]:
    """`hf:NAME[:CONFIG]`: the train split of a Hugging Face dataset, streamed; one record = one document."""
    name, _, config = name_config.partition(":")
    try:
        import datasets
    except ImportError:
        raise UserError(f"--corpus hf:{name_config} needs the `datasets` package: "
                        "pip install 'tinyelectra[data]'") from None
    import logging

    for logger in ("datasets", "huggingface_hub", "fsspec"):
        logging.getLogger(logger).setLevel(logging.ERROR)  # keep the hub's retry chatter off stderr
    try:
        ds = datasets.load_dataset(name, config or None, split="train", streaming=True)
        records = iter(ds)
        first = next(records, None)
    except Exception as e:  # ConnectionError offline, DatasetNotFoundError, ValueError for a bad config, ...
        msg = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
        raise UserError(f"--corpus hf:{name_config}: could not load it from the Hugging Face hub ({msg})") from None
    if first is None:
        return
    if "text" not in first:
        raise UserError(f"--corpus hf:{name_config}: records have no 'text' field (fields: {', '.join(first)})")
    for record in chain([first], records):
        yield from _record_documents(record["text"], f"hf:{name_config}")


def builtin_documents() -> Iterator[Document]:
    """A smoke-test corpus every Python has: the pydoc reference topics and the standard library's docstrings.

    Each pydoc topic is a document, and so is each standard-library module (all its docstrings, read statically with
    `ast`, so nothing is imported or run); paragraphs become sentence lines. Depends on the Python version."""
    if not _BUILTIN_CACHE:
        _BUILTIN_CACHE.extend(_read_builtin_documents())
    return iter(_BUILTIN_CACHE)


_BUILTIN_CACHE: list[Document] = []  # read once per process (parsing the standard library takes seconds)


def _read_builtin_documents() -> Iterator[Document]:
    from pydoc_data.topics import topics

    yield from filter(None, (_paragraphs(topics[name]) for name in sorted(topics)))
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for name in sorted(sys.stdlib_module_names):
        files = []
        if (stdlib / f"{name}.py").is_file():
            files.append(stdlib / f"{name}.py")
        elif (stdlib / name).is_dir():
            files += sorted(q for q in (stdlib / name).rglob("*.py")
                            if not BUILTIN_EXCLUDED_PARTS & set(q.relative_to(stdlib).parts))
        for path in files:
            try:
                tree = ast.parse(path.read_bytes())
            except (SyntaxError, ValueError, OSError):
                continue
            kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
            docstrings = (ast.get_docstring(n) or "" for n in ast.walk(tree) if isinstance(n, kinds))
            doc = [line for text in docstrings for line in _paragraphs(text)]
            if doc:
                yield doc


def _paragraphs(text: str) -> Document:
    """Hard-wrapped text -> one line per paragraph (blank-line separated)."""
    paragraphs = (" ".join(s.strip() for s in para.split("\n") if s.strip()) for para in text.split("\n\n"))
    return [line for line in paragraphs if line]
