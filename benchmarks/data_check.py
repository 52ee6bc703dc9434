"""What checking a prepared dataset's bytes costs a run's set-up (issue 35: data identity from the bytes).

The set-up reads every shard file whole, once: before, for the token-id check alone (a max over each memory-mapped
shard: `old`); now also for each file's sha256, compared with the one `prepare` recorded and kept in the run's record
(`data.PretrainData.check_files`: `new`). Both on shards `tinyelectra prepare` made from English Wikipedia
(../shared/data/enwiki, the first --files files), alternating old and new in one process, a fresh PretrainData each
call, one thread, the page cache warm (the files are read before timing: what a machine whose memory holds the data
meets; a cold disk adds its own read time to both sides equally, not measured here). The figure for a 100 GB corpus
is this measured rate carried over, not a measurement of 100 GB.

    python -m benchmarks.data_check [--files 100] [--rounds 7] [--work DIR]

Writes benchmarks/results/data_check.json.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from benchmarks import ROOT
from benchmarks.common import alternate, paired_ratio, summarize, write_result

DEFAULT_CORPUS = Path(os.environ.get("TINYELECTRA_SHARED_DATA", ROOT.parent / "shared" / "data")) / "enwiki"


def old_check(path: Path) -> None:
    """The set-up's read of 0f79abe: every shard memory-mapped, its largest token id against the vocabulary."""
    from tinyelectra.data import PretrainData  # noqa: PLC0415

    data = PretrainData(path)
    for split in data.manifest["splits"]:
        for ids, _ in data._open(split):
            assert int(ids.max()) < data.vocab_size


def new_check(path: Path) -> None:
    from tinyelectra.data import PretrainData  # noqa: PLC0415

    PretrainData(path).check_files()


def main() -> None:
    import torch

    from tinyelectra.prepare import prepare  # noqa: PLC0415

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    ap.add_argument("--files", type=int, default=100, help="the first N enwiki files (default 100)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--work", type=Path, default=None,
                    help="where the dataset is prepared (default: a temporary folder)")
    args = ap.parse_args()
    files = sorted(args.corpus.glob("*.gz"))[: args.files]
    if not files:
        sys.exit(f"{args.corpus}: no enwiki files (*.gz); it is ../shared/data/enwiki beside the checkout")
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as scratch:
        data = (args.work or Path(scratch)) / f"enwiki-{len(files)}"
        manifest = prepare([str(f) for f in files], data, vocab_size=8192, seq_len=128, workers=1, quiet=True)
        sizes = [(data / name).stat().st_size for s in manifest["splits"].values() for sh in s["shards"]
                 for name in (sh["ids"], sh["meta"])]
        total = sum(sizes)
        times = alternate({"old": lambda: old_check(data), "new": lambda: new_check(data)}, warmup=1,
                          repeats=args.rounds, device=torch.device("cpu"))
    rate = {k: total / summarize(v)["median_s"] / 1e9 for k, v in times.items()}
    payload = {
        "corpus_files": [f.name for f in files], "precision": "n/a (bytes read, hashed and compared)", "threads": 1,
        "shard_files": len(sizes), "shard_bytes": total, "rows": {k: v["rows"] for k, v in manifest["splits"].items()},
        "seconds": {k: summarize(v) for k, v in times.items()},
        "gb_per_second": rate,
        "new_over_old": paired_ratio(times["new"], times["old"]),
        "seconds_per_100_gb": {k: 100 / r for k, r in rate.items()},
        "load_average": os.getloadavg(),
        "note": "warm page cache; a cold disk adds its read time (the same for both sides); 100 GB is the measured "
                "rate carried over",
    }
    path = write_result("data_check", payload)
    print(f"{total / 1e6:.1f} MB in {len(sizes)} shard files: old {rate['old']:.2f} GB/s, new {rate['new']:.2f} GB/s "
          f"(x{payload['new_over_old']['median_of_round_ratios']:.2f} the time); 100 GB: old "
          f"{payload['seconds_per_100_gb']['old']:.0f} s, new {payload['seconds_per_100_gb']['new']:.0f} s -> {path}")


if __name__ == "__main__":
    from benchmarks.common import run_main

    run_main(main)
