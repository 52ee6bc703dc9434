"""How often a batch has no padding at all: then the trainer passes no attention mask and FlashAttention becomes
eligible on a GPU (electra.Masked.full). From a prepared data directory: the share of full rows, of filled token
slots, and per batch size the share of shuffled batches (the trainer's BatchLoader order) without a padded row.

    python -m benchmarks.unpadded_batches DATA_DIR [--batches 8,16,32,64,128] [--name NAME]
      -> benchmarks/results/NAME.json
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from benchmarks.common import command_line, run_main, write_result


def unpadded_share(full_rows: np.ndarray, batch: int, epochs: int = 50, seed: int = 0) -> float:
    """The share of batches of `batch` rows, in `epochs` shuffled passes as BatchLoader draws them (partial batches
    dropped), whose rows are all full."""
    n = len(full_rows) // batch * batch
    hits = total = 0
    for epoch in range(epochs):
        order = np.random.default_rng([seed, epoch]).permutation(len(full_rows))[:n]
        per_batch = full_rows[order].reshape(-1, batch).all(1)
        hits, total = hits + int(per_batch.sum()), total + len(per_batch)
    return hits / total if total else float("nan")


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data")
    ap.add_argument("--batches", default="8,16,32,64,128")
    ap.add_argument("--name", default="unpadded_batches")
    ap.add_argument("--out-dir", default=None)
    args = ap.parse_args(argv)
    from tinyelectra.data import PretrainData  # noqa: PLC0415

    data = PretrainData(args.data)
    rows = data.num_rows("train")
    _, meta = data.rows("train", np.arange(rows))
    lengths = meta[:, 1].astype(np.int64)
    full = lengths >= data.seq_len
    payload = {"data": str(args.data), "prepared_with": data.manifest.get("command"), "seq_len": data.seq_len,
               "train_rows": rows,
               "full_rows": float(full.mean()), "filled_slots": float(lengths.sum() / (rows * data.seq_len)),
               "batches_without_padding": {b: unpadded_share(full, b) for b in map(int, args.batches.split(","))},
               "independent_rows_estimate": {b: float(full.mean() ** b) for b in map(int, args.batches.split(","))}}
    path = write_result(args.name, payload, out_dir=args.out_dir, command=command_line(__spec__.name, argv))
    print(f"{rows:,} rows, {payload['full_rows']:.1%} full; batches without padding: "
          + ", ".join(f"{b}: {s:.2%}" for b, s in payload["batches_without_padding"].items()) + f" -> {path}")
    return payload


if __name__ == "__main__":
    run_main(main)
