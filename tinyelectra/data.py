"""Loading prepared pre-training data: `PretrainData` (a directory `prepare` wrote: manifest, tokenizer, memory-mapped
.npy shards) and `BatchLoader` (shuffled, resumable (B, T) `Batch`es of one split). Writing that directory, the
official example builder included, is prepare.py's.

The directory's format, read here and written by prepare.py: manifest.json (`format_version`, `seq_len`, per split
its shards and row counts, the tokenizer's facts), `tokenizer/`, and per shard `*-ids.npy` (rows of T token ids)
beside `*-meta.npy` (each row's A/B boundary, the index where segment 1 starts, = length when single, and its
length), so token_type_ids and attention_mask are derived at load time.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from tinyelectra.errors import UserError
from tinyelectra.files import sha256_of
from tinyelectra.runfolder import user_of
from tinyelectra.tokenizer import Tokenizer

if TYPE_CHECKING:
    import torch

FORMAT_VERSION = 1
SPLITS = ("train", "validation")
MIN_HELDOUT_ROWS = 100  # fewer held-out rows and a checkpoint's learning numbers mean little (prepare and train warn)


def heldout_warning(rows: int, validation_fraction: float | None) -> str:
    """The warning for a dataset with no or few held-out (validation) rows, "" when it has enough."""
    if rows >= MIN_HELDOUT_ROWS:
        return ""
    share = f" (--validation-fraction {validation_fraction:g})" if validation_fraction is not None else ""
    what = "no held-out rows" if rows == 0 else f"only {rows} held-out rows"
    consequence = ("the checkpoints will not be evaluated (no learning numbers, no verdict)" if rows == 0 else
                   f"fewer than {MIN_HELDOUT_ROWS}, too few for the checkpoints' learning numbers to mean much")
    return (f"{what}{share}: {consequence}; more text, or a larger --validation-fraction when preparing, holds out "
            "more (a document is held out whole, so a corpus of few documents may get none)")


def files_present(out_dir: Path, manifest: dict) -> bool:
    """Every shard and the tokenizer directory that `manifest` lists exist under `out_dir`."""
    try:
        names = [f for s in manifest["splits"].values() for sh in s["shards"] for f in (sh["ids"], sh["meta"])]
    except (KeyError, TypeError):
        return False
    return all((out_dir / n).is_file() for n in names) and (out_dir / "tokenizer").is_dir()


def _sha256_and_max(path: Path, array: np.ndarray, block_bytes: int = 1 << 24) -> tuple[str, int]:
    """One read of a .npy file whose data `array` memory-maps: the sha256 of the whole file (as sha256sum gives it)
    and the largest value of the array (-1 when empty), block by block."""
    digest = hashlib.sha256()
    flat = array.reshape(-1)
    offset = getattr(array, "offset", None)
    if offset is None or not flat.flags.c_contiguous:  # not memory-mapped as a whole: the file, then the array
        return sha256_of(path), int(flat.max()) if flat.size else -1
    top, per_block = -1, max(1, block_bytes // max(flat.itemsize, 1))
    with open(path, "rb") as f:
        digest.update(f.read(offset))  # the header
        for start in range(0, flat.size, per_block):
            block = flat[start:start + per_block]
            digest.update(memoryview(block).cast("B"))
            top = max(top, int(block.max()))
        f.seek(offset + flat.nbytes)
        digest.update(f.read())  # nothing, for a file np.save wrote
    return digest.hexdigest(), top


# ---------------------------------------------------------------------------------------------------- loading
@dataclass
class Batch:
    input_ids: torch.Tensor  # (B, T) int64
    token_type_ids: torch.Tensor  # (B, T) int64: 0 for [CLS] A [SEP] and padding, 1 for B [SEP]
    attention_mask: torch.Tensor  # (B, T) bool: True = real token
    # (B,) bool numpy array, on the host wherever the tensors are: the rows without padding (None: not known). Lets the
    # trainer drop the attention mask of a batch without padding without reading the device (electra.Masked.full).
    full_rows: np.ndarray | None = None

    def to(self, device, non_blocking: bool = False) -> "Batch":
        return Batch(*(t.to(device, non_blocking=non_blocking)
                       for t in (self.input_ids, self.token_type_ids, self.attention_mask)), full_rows=self.full_rows)

    def pin_memory(self) -> "Batch":
        return Batch(*(t.pin_memory() for t in (self.input_ids, self.token_type_ids, self.attention_mask)),
                     full_rows=self.full_rows)

    def all_full(self, rows: slice = slice(None)) -> bool:
        """Whether the rows `rows` are known to hold no padding (host-side, no device read)."""
        return self.full_rows is not None and bool(self.full_rows[rows].all())


class PretrainData:
    """A directory written by `prepare`: the manifest, the tokenizer (loaded on first use), memory-mapped shards."""

    def __init__(self, data_dir) -> None:
        self.path = Path(data_dir)
        if holder := user_of(self.path):
            raise UserError(f"{self.path}: being written by {holder}; wait for it to finish")
        manifest_path = self.path / "manifest.json"
        if not manifest_path.is_file():
            raise UserError(f"{self.path}: not a prepared data directory (no manifest.json); "
                            f"run `tinyelectra prepare --corpus ... --out {self.path}` first")
        try:
            self.manifest: dict = json.loads(manifest_path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise UserError(f"{manifest_path}: not valid JSON; prepare the data again") from None
        version = self.manifest.get("format_version")
        if version != FORMAT_VERSION:
            raise UserError(f"{self.path}: data format version {version!r}, this tinyelectra reads version "
                            f"{FORMAT_VERSION}; prepare the data again")
        if not files_present(self.path, self.manifest):
            raise UserError(f"{self.path}: shard or tokenizer files listed in manifest.json are missing; prepare again")
        self.seq_len: int = int(self.manifest["seq_len"])
        self.vocab_size: int = int(self.manifest["tokenizer"]["vocab_size"])
        self._shards: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
        self._starts: dict[str, np.ndarray] = {}
        self._files: dict[str, dict] | None = None  # check_files's answer

    def fingerprint(self) -> dict:
        """What identifies this dataset for a run (runfolder.check_data): a sha256 over its vocabulary (the
        tokenizer's fingerprint), row length, id type and every shard's rows and sha256 (recorded by prepare); for
        data prepared before shards had their sha256 recorded, over the manifest's counts of the text instead
        (`content` says which)."""
        m = self.manifest
        shards = {s: [[sh.get("rows"), sh.get("ids_sha256"), sh.get("meta_sha256")] for sh in v["shards"]]
                  for s, v in m["splits"].items()}
        hashed = all(sh[1] for v in shards.values() for sh in v)
        parts = {"tokenizer": m["tokenizer"].get("fingerprint"), "vocab_size": self.vocab_size, "seq_len": self.seq_len,
                 "dtype": m.get("dtype"), "shards": shards}
        if not hashed:
            parts.update({k: m.get(k) for k in ("documents", "lines", "line_tokens", "tokens", "text_bytes")},
                         inputs=(m.get("request") or {}).get("inputs"))
        return {"fingerprint": hashlib.sha256(json.dumps(parts, sort_keys=True).encode("utf-8")).hexdigest(),
                "content": "the shards' sha256" if hashed else "the manifest's counts (shards without sha256)",
                "tokenizer": str(parts["tokenizer"])[:16], "vocab_size": self.vocab_size, "seq_len": self.seq_len,
                "rows": {s: int(v["rows"]) for s, v in m["splits"].items()}}

    @cached_property
    def tokenizer(self) -> Tokenizer:
        return Tokenizer.load(self.path / "tokenizer")

    def num_rows(self, split: str) -> int:
        self._check_split(split)
        return int(self.manifest["splits"][split]["rows"])

    def _check_split(self, split: str) -> None:
        if split not in self.manifest["splits"]:
            raise UserError(f"{self.path}: no split {split!r} (has: {', '.join(self.manifest['splits'])})")

    def _open(self, split: str) -> list[tuple[np.ndarray, np.ndarray]]:
        """The split's shards, memory-mapped; a damaged or truncated one is a UserError naming it."""
        if split not in self._shards:
            self._check_split(split)
            shards = []
            for s in self.manifest["splits"][split]["shards"]:
                ids, meta = self._load(s["ids"]), self._load(s["meta"])
                if ids.ndim != 2 or ids.shape[1] != self.seq_len or meta.shape != (len(ids), 2):
                    raise UserError(f"{self.path / s['ids']}: damaged (shapes {ids.shape} and {meta.shape} do not "
                                    f"fit {self.seq_len}-token rows); prepare the data again")
                shards.append((ids, meta))
            sizes = [len(ids) for ids, _ in shards]
            if sum(sizes) != self.num_rows(split):
                raise UserError(f"{self.path}: the {split} shards hold {sum(sizes)} rows, manifest.json says "
                                f"{self.num_rows(split)}; prepare the data again")
            self._shards[split] = shards
            self._starts[split] = np.cumsum([0, *sizes])
        return self._shards[split]

    def _load(self, name: str) -> np.ndarray:
        try:
            return np.load(self.path / name, mmap_mode="r", allow_pickle=False)
        except (ValueError, OSError, EOFError) as e:
            raise UserError(f"{self.path / name}: damaged "
                            f"({str(e).splitlines()[0][:120] if str(e) else type(e).__name__}); prepare the data "
                            "again") from None

    def check_files(self) -> dict[str, dict]:
        """Every shard file read whole, once per process, in one pass: its token ids against the vocabulary (a damaged
        file stops the set-up, not step 1) and its size and sha256 (a shard whose sha256 is not the one `prepare`
        recorded in manifest.json was damaged or replaced since: a UserError naming it). Returns {file name:
        {"bytes", "sha256"}}, what a run records of its data (runfolder.data_record) and --resume checks again."""
        if self._files is None:
            files = {}
            for split, info in self.manifest["splits"].items():
                for arrays, s in zip(self._open(split), info["shards"]):
                    for key, array in zip(("ids", "meta"), arrays):
                        path = self.path / s[key]
                        digest, top = _sha256_and_max(path, array)
                        if key == "ids" and top >= self.vocab_size:
                            row, position = divmod(int(np.argmax(array >= self.vocab_size)), self.seq_len)  # the first
                            raise UserError(f"{path}: token id {int(array[row, position])} (row {row}, position "
                                            f"{position}) is outside the vocabulary of {self.vocab_size} entries that "
                                            "manifest.json names; the shard is damaged or was written with another "
                                            "tokenizer: prepare the data again")
                        if (want := s.get(f"{key}_sha256")) and digest != want:
                            raise UserError(f"{path}: its sha256 ({digest[:12]}) is not the one recorded when the data "
                                            f"was prepared ({str(want)[:12]}): the file was damaged or replaced since; "
                                            "prepare the data again")
                        files[s[key]] = {"bytes": path.stat().st_size, "sha256": digest}
            self._files = files
        return self._files

    def rows(self, split: str, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Token rows (B, T) and their [boundary, length] (B, 2) for global row indices, in the order given."""
        shards = self._open(split)
        indices = np.asarray(indices, dtype=np.int64)
        if len(shards) == 1:
            ids, meta = shards[0]
            return ids[indices], meta[indices]
        starts = self._starts[split]
        which = np.searchsorted(starts, indices, side="right") - 1
        out_ids = np.empty((len(indices), self.seq_len), dtype=shards[0][0].dtype)
        out_meta = np.empty((len(indices), 2), dtype=np.uint16)
        for s in np.unique(which):
            sel = which == s
            local = indices[sel] - starts[s]
            out_ids[sel] = shards[s][0][local]
            out_meta[sel] = shards[s][1][local]
        return out_ids, out_meta

    def batch(self, split: str, indices) -> Batch:
        """The rows at `indices` as a CPU Batch (token_type_ids and attention_mask derived from boundary/length)."""
        import torch

        ids, meta = self.rows(split, indices)
        positions = np.arange(self.seq_len)[None, :]  # (1, T)
        boundary, length = meta[:, :1].astype(np.int64), meta[:, 1:].astype(np.int64)  # (B, 1) each
        attention = positions < length  # (B, T)
        token_types = (positions >= boundary) & attention  # (B, T)
        return Batch(
            input_ids=torch.from_numpy(ids.astype(np.int64)),
            token_type_ids=torch.from_numpy(token_types.astype(np.int64)),
            attention_mask=torch.from_numpy(attention),
            full_rows=length[:, 0] >= self.seq_len,
        )


class BatchLoader:
    """Infinite shuffled (B, T) batches of one split, resumable from a cursor.

    Epoch e visits the rows in `np.random.default_rng([seed, e]).permutation(N)`, B rows per batch (the last partial
    batch is dropped: static shapes). The order depends only on (seed, epoch): never on row_range, prefetch or
    where the run was resumed. `row_range=(start, stop)` keeps rows start:stop of every global batch (a DDP rank's
    slice). A background thread prepares the next `prefetch` batches (pinned on CUDA for non_blocking copies)."""

    def __init__(self, data: PretrainData, split: str, batch_size: int, seed: int, device="cpu",
                 row_range: tuple[int, int] | None = None, prefetch: int = 2) -> None:
        import torch

        self.data, self.split, self.batch_size, self.seed = data, split, int(batch_size), int(seed)
        self.num_rows = data.num_rows(split)
        if self.batch_size <= 0:
            raise UserError(f"batch size {batch_size}: must be > 0")
        if self.num_rows < self.batch_size:
            raise UserError(f"{data.path}: the {split} split has {self.num_rows} rows, fewer than one batch of "
                            f"{self.batch_size}; prepare more text or use a smaller batch")
        if self.seed < 0:
            raise UserError(f"seed {seed}: must be >= 0")
        self.row_range = (0, self.batch_size) if row_range is None else (int(row_range[0]), int(row_range[1]))
        if not 0 <= self.row_range[0] < self.row_range[1] <= self.batch_size:
            raise ValueError(f"row_range {row_range} must satisfy 0 <= start < stop <= batch_size {self.batch_size}")
        self.batches_per_epoch = self.num_rows // self.batch_size
        self.device = torch.device(device)
        self.prefetch = max(0, int(prefetch))
        self._epoch, self._batch_index = 0, 0  # cursor: the next batch __next__ returns
        self._order_cache: tuple[int, np.ndarray] | None = None
        self._thread: threading.Thread | None = None
        self._queue = None
        self._stop = threading.Event()

    def _order(self, epoch: int) -> np.ndarray:
        if self._order_cache is None or self._order_cache[0] != epoch:
            self._order_cache = (epoch, np.random.default_rng([self.seed, epoch]).permutation(self.num_rows))
        return self._order_cache[1]

    def _make(self, epoch: int, batch_index: int) -> Batch:
        start = batch_index * self.batch_size
        indices = self._order(epoch)[start + self.row_range[0] : start + self.row_range[1]]
        batch = self.data.batch(self.split, indices)
        return batch.pin_memory() if self.device.type == "cuda" else batch

    def _advance(self, epoch: int, batch_index: int) -> tuple[int, int]:
        return (epoch + 1, 0) if batch_index + 1 == self.batches_per_epoch else (epoch, batch_index + 1)

    def _producer(self, epoch: int, batch_index: int, q, stop: threading.Event) -> None:
        import queue

        try:
            while not stop.is_set():
                item = (epoch, batch_index, self._make(epoch, batch_index))
                while not stop.is_set():
                    with contextlib.suppress(queue.Full):
                        q.put(item, timeout=0.1)
                        break
                epoch, batch_index = self._advance(epoch, batch_index)
        except BaseException as e:  # hand the error to the consumer instead of dying silently
            q.put((None, None, e))

    def _start(self) -> None:
        import queue

        self._stop = threading.Event()
        self._queue = queue.Queue(maxsize=self.prefetch)
        self._thread = threading.Thread(target=self._producer,
                                        args=(self._epoch, self._batch_index, self._queue, self._stop),
                                        name="tinyelectra-batches", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop the background thread (it is also a daemon, so an exiting program never waits for it)."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=5)
            self._thread = None
            self._queue = None

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    def __iter__(self) -> "BatchLoader":
        return self

    def __next__(self) -> Batch:
        if self.prefetch == 0:
            batch = self._make(self._epoch, self._batch_index)
        else:
            if self._thread is None:
                self._start()
            epoch, batch_index, batch = self._queue.get()
            if epoch is None:
                self.close()
                raise batch
            assert (epoch, batch_index) == (self._epoch, self._batch_index), "prefetch queue out of step"
        self._epoch, self._batch_index = self._advance(self._epoch, self._batch_index)
        if self.device.type != "cpu":
            batch = batch.to(self.device, non_blocking=True)  # pinned source: the copy overlaps with compute
        return batch

    def state_dict(self) -> dict:
        """A JSON-able cursor: the batch the next __next__ returns."""
        return {"epoch": self._epoch, "batch_index": self._batch_index, "seed": self.seed,
                "batch_size": self.batch_size,
                "num_rows": self.num_rows}

    def load_state_dict(self, d: dict) -> None:
        """Continue from a cursor: the next batch is the one the uninterrupted run would have drawn."""
        for key in ("seed", "batch_size", "num_rows"):
            if key in d and d[key] != getattr(self, key):
                raise UserError(f"cannot resume the data order: the checkpoint's {key} is {d[key]}, this run's is "
                                f"{getattr(self, key)} (a different dataset or batch size)")
        epoch, batch_index = int(d["epoch"]), int(d["batch_index"])
        if not (epoch >= 0 and 0 <= batch_index < self.batches_per_epoch):
            raise UserError(f"data cursor {d} is out of range ({self.batches_per_epoch} batches per epoch)")
        self.close()
        self._epoch, self._batch_index = epoch, batch_index
