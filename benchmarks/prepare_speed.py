"""How fast `tinyelectra prepare` turns English Wikipedia into pre-training examples, end to end.

1. End to end: runs the real command, `tinyelectra prepare --corpus ENWIKI --out OUT` (400 WikiExtractor shards,
   ~411 MB of text; tokenizer training included, default settings: vocab 30522, seq 128, uncased) in a fresh
   process and times it. OUT is removed first when it holds a tinyelectra dataset (an identical request would be
   a cache hit) and is left in place afterwards. Reports documents, tokens, examples, seconds, MB/s of raw text,
   the CPU seconds of the run and its workers, and the machine's load average (other jobs share the 2 cores).
2. Tokenization, tinyelectra against the usual way in the same process: `Tokenizer.encode_batch` (one thread,
   cached pieces) against `tokenizers.Tokenizer.encode_batch` (Rust, all cores) on the same lines with the same
   tokenizer, alternating A/B, each round from a cold cache: wall-clock medians, the paired ratio, and the CPU
   seconds each spends per MB (the fair comparison: prepare runs one single-threaded tokenizer per core).

Writes benchmarks/results/prepare_enwiki.json.

    python -m benchmarks.prepare_speed [--corpus ../shared/data/enwiki] [--out /work/data/enwiki-30522]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import alternate, paired_ratio, summarize, write_result

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CORPUS = Path(os.environ.get("TINYELECTRA_SHARED_DATA", ROOT.parent / "shared" / "data")) / "enwiki"


def end_to_end(corpus: Path, out: Path, extra: list[str]) -> dict:
    if (out / "manifest.json").is_file():
        shutil.rmtree(out)  # ours: a fresh build, not a cache hit
    elif out.exists() and any(out.iterdir()):
        sys.exit(f"{out} exists and is not a tinyelectra dataset; choose another --out")
    cmd = [str(Path(sys.executable).parent / "tinyelectra"), "prepare", "--corpus", str(corpus), "--out", str(out),
           *extra]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True)
    seconds = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    m = json.loads((out / "manifest.json").read_text())
    cpu_seconds = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {
        "command": " ".join(["tinyelectra", *cmd[1:]]),
        "precision": "n/a (integer token ids, uint16 rows)",
        "documents": sum(m["documents"].values()),
        "tokens": sum(m["tokens"].values()),
        "examples": m["examples"],
        "text_bytes": m["text_bytes"],
        "input_files": sum(s["files"] for s in m["sources"]),
        "seconds": round(seconds, 2),
        "mb_per_second": round(m["text_bytes"] / 1e6 / seconds, 3),
        "target_mb_per_second": 5.0,
        "stage_seconds": m["seconds"],
        "cpu_seconds_all_processes": round(cpu_seconds, 1),
        "cpu_seconds_per_mb": round(cpu_seconds / (m["text_bytes"] / 1e6), 4),
        # not a measurement: what the CPU work would allow if both cores were ours alone (perfect overlap)
        "upper_bound_mb_per_second_on_2_idle_cores": round(m["text_bytes"] / 1e6 / (cpu_seconds / 2), 2),
        "workers": m["workers"],
        "tokenizer_training_sample_chars": m["tokenizer"]["training_sample_chars"],
        "load_average_1min_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        "cores_seen": len(os.sched_getaffinity(0)),
    }


def tokenization(corpus: Path, tokenizer_dir: Path, n_files: int, rounds: int) -> dict:
    from tinyelectra.tokenizer import Tokenizer

    lines = []
    for f in sorted(corpus.glob("*.gz"))[-n_files:]:  # the last files: not in the tokenizer's training sample
        with gzip.open(f, "rt", encoding="utf-8") as fh:
            lines += [s for s in (line.strip() for line in fh) if s and not s.startswith("<doc") and s != "</doc>"]
    mb = sum(len(s.encode("utf-8")) for s in lines) / 1e6
    batch = 2700  # about the lines of one 1 MiB chunk, as prepare sends them
    state = {}

    def ours() -> None:
        tok = Tokenizer.load(tokenizer_dir)  # cold piece cache every round
        for i in range(0, len(lines), batch):
            tok.encode_batch(lines[i : i + batch])

    def plain_tokenizers() -> None:
        hf = state.setdefault("hf", Tokenizer.load(tokenizer_dir)._hf)
        for i in range(0, len(lines), batch):
            hf.encode_batch(lines[i : i + batch], add_special_tokens=False)

    import torch

    cpu: dict[str, list[float]] = {"tinyelectra": [], "tokenizers": []}

    def cpu_timed(name, fn):
        def run() -> None:
            c0 = time.process_time()  # all threads of this process: counts tokenizers' Rust threads too
            fn()
            cpu[name].append(time.process_time() - c0)
        return run

    times = alternate({"tinyelectra": cpu_timed("tinyelectra", ours),
                       "tokenizers": cpu_timed("tokenizers", plain_tokenizers)},
                      warmup=0, repeats=rounds, device=torch.device("cpu"))
    return {
        "cpu_seconds_per_mb": {k: round(statistics.median(v) / mb, 4) for k, v in cpu.items()},
        "cpu_efficiency_tinyelectra_over_tokenizers": round(
            statistics.median(cpu["tokenizers"]) / statistics.median(cpu["tinyelectra"]), 2),
        "text_mb": round(mb, 2),
        "lines": len(lines),
        "tinyelectra_encode_batch_1_thread": {**summarize(times["tinyelectra"]),
                                              "mb_per_second": round(
                                                  mb / summarize(times["tinyelectra"])["median_s"], 2)},
        "tokenizers_encode_batch_all_cores": {**summarize(times["tokenizers"]),
                                              "mb_per_second": round(
                                                  mb / summarize(times["tokenizers"])["median_s"], 2)},
        "speedup_tinyelectra_over_tokenizers": paired_ratio(times["tokenizers"], times["tinyelectra"]),
        "note": "same tokenizer, same lines (files not in the tokenizer's training sample), identical ids "
                "(tests/test_tokenizer.py); tinyelectra uses one thread here, tokenizers all cores",
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    ap.add_argument("--out", type=Path, default=Path("/work/data/enwiki-30522"))
    ap.add_argument("--tokenization-files", type=int, default=20, help="enwiki files for the tokenization comparison")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--result-name", default="prepare_enwiki")
    args, extra = ap.parse_known_args()  # anything else goes to `tinyelectra prepare`
    if not args.corpus.is_dir():
        sys.exit(f"corpus not found: {args.corpus} (set TINYELECTRA_SHARED_DATA or --corpus)")
    e2e = end_to_end(args.corpus.resolve(), args.out, extra)
    print(json.dumps(e2e, indent=2))
    tok = tokenization(args.corpus, args.out / "tokenizer", args.tokenization_files, args.rounds)
    print(json.dumps(tok, indent=2))
    path = write_result(args.result_name, {"end_to_end": e2e, "tokenization": tok})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
