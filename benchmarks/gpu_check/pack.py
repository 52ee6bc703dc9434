"""The data the GPU run needs that git does not hold, packed to travel beside the working tree, and unpacked there.

    python -m benchmarks.gpu_check.pack build [DIR] [--shared ../shared/data] [--shards 400]  # -> DIR (or .lease/)
    python -m benchmarks.gpu_check.pack build DIR --smoke                     # a toy pack for --cpu-smoke
    python -m benchmarks.gpu_check.pack unpack DIR WORK    # -> WORK/pretrain (prepared data), WORK/glue (tasks)
    python -m benchmarks.gpu_check.pack measure [--shards 20]  # tokens per MiB: this packing against alternatives

A pack is three files:
- pretrain.tar.xz: `tinyelectra prepare` of the first --shards enwiki files at the electra-small recipe's
  vocabulary (a 30,522-entry WordPiece trained by prepare) and row length (128 tokens): manifest, tokenizer, uint16
  rows. xz (preset 9) stores them in about 1.04 bytes per token (the H100 lease's 360 shards: 50.3M tokens in
  52.3 MB); no other packing measured holds measurably more (`measure`, results/pack_formats.json: dropping the
  padding, LZMA2 tuned for 2-byte symbols, ids renumbered by frequency within +-0.6%; byte planes and 15-bit
  packing 20-24% fewer tokens per MiB; the text itself, xz, 41% fewer), so the pack holds as many shards as the
  carry allows: all 400 of ../shared/data/enwiki (56M tokens, the whole corpus), about 57 MiB with GLUE;
- glue.tar.xz: the whole train.tsv and dev.tsv of the tasks the GPU run fine-tunes on (TASKS; 1.3 MiB of xz: the
  full training sets, as the paper's protocol fine-tunes on them);
- pack.json: what the pack holds (tokens, rows, tasks and their rows, each archive's bytes and sha256, the
  tokenizer's fingerprint, the command and commit that built it).
It must fit beside the checkout in the 64 MiB a GPU command carries: `build` measures the checkout (the files git
tracks or would track: what the device tool sends) and the pack, and refuses (an error, and the previous pack left
as it was) when together they leave less than TRAVEL_MARGIN_BYTES, or the pack alone is over LIMIT_BYTES. `--smoke`
builds the toy pack of the CPU smoke run: the first enwiki shard at a 2,048-entry vocabulary and 32-token rows (10% of
its documents held out), and the first 40 training and 20 dev rows of each task.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks import ROOT
from benchmarks.gpu_check import suite  # no torch: unpacking is the GPU run's first stage, on a cold machine

from tinyelectra.errors import UserError
from tinyelectra.files import sha256_of

TASKS = ("cola", "sst2", "stsb", "mrpc", "rte")  # by value: CoLA shows pre-training first; RTE and MRPC last
LIMIT_BYTES = 60 * 2**20  # the carry's 64 MiB less the smallest checkout and the margin: the travel check decides
TRAVEL_BYTES = 64 * 2**20  # what one GPU command carries: the working tree and the carried paths together
TRAVEL_MARGIN_BYTES = 2 * 2**20  # left free for the results a session adds to the checkout before the lease
DEFAULT_SHARDS = 400  # all of ../shared/data/enwiki
FORMAT = "tinyelectra-gpu-pack"
SMOKE = {"shards": 1, "vocab_size": 2048, "seq_len": 32, "validation_fraction": 0.1, "train_lines": 40, "dev_lines": 20}


def write_tar_xz(path: Path, files: list[tuple[Path, str]]) -> None:
    """A reproducible .tar.xz (sorted names, no dates or owners) of (file, name in the archive) pairs."""
    with tarfile.open(path, "w:xz", preset=9) as tar:
        for file, name in sorted(files, key=lambda f: f[1]):
            info = tar.gettarinfo(str(file), arcname=name)
            info.mtime, info.uid, info.gid, info.uname, info.gname, info.mode = 0, 0, 0, "", "", 0o644
            with open(file, "rb") as f:
                tar.addfile(info, f)


def _first_lines(src: Path, dst: Path, lines: int, header: bool) -> int:
    """Copy the header (if any) and the first `lines` rows of a GLUE file; returns the rows copied."""
    with open(src, encoding="utf-8") as f:
        kept = [line for _, line in zip(range(lines + int(header)), f)]
    dst.write_text("".join(kept), encoding="utf-8")
    return len(kept) - int(header)


def checkout_bytes() -> int | None:
    """The bytes of the files the device tool sends with the working tree: tracked, and untracked but not ignored
    (git ls-files); None where git cannot tell (no .git)."""
    try:
        listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True,
                                check=True).stdout.decode("utf-8", "replace").split("\0")
    except (OSError, subprocess.CalledProcessError):
        return None
    return sum((ROOT / f).stat().st_size for f in listed if f and (ROOT / f).is_file())


def build(out_dir: Path, shared: Path, shards: int, smoke: bool) -> dict:
    """Prepare, compress and describe the pack in a staging folder, then put it in place of `out_dir`."""
    enwiki, glue = shared / "enwiki", shared / "glue"
    shard_files = sorted(enwiki.glob("*.gz")) if enwiki.is_dir() else []
    if not shard_files or not glue.is_dir():
        raise UserError(f"--shared {shared}: expected enwiki/*.gz and glue/ (the project's data folder, "
                        "../shared/data)")
    from benchmarks.common import git_commit  # noqa: PLC0415

    from tinyelectra.config import load_recipe  # noqa: PLC0415
    from tinyelectra.glue_data import get_task  # noqa: PLC0415

    if smoke:
        shards = SMOKE["shards"]
    if not 1 <= shards <= len(shard_files):
        raise UserError(f"--shards {shards}: {enwiki} holds {len(shard_files)} shards")
    if out_dir.exists() and not (out_dir / "pack.json").is_file() and any(out_dir.iterdir()):
        raise UserError(f"{out_dir} holds files that are not a pack; choose another folder")
    small = load_recipe("electra-small")
    vocab, seq_len = (SMOKE["vocab_size"], SMOKE["seq_len"]) if smoke else (small.model.vocab_size, small.train.seq_len)
    stage = out_dir.with_name(f"{out_dir.name}.tmp-{os.getpid()}")  # git ignores *.tmp-*
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir(parents=True)
    work = stage / "work"
    try:
        t0 = time.perf_counter()
        prepare = [sys.executable, "-m", "tinyelectra", "prepare", "--corpus", *map(str, shard_files[:shards]),
                   "--out", str(work / "pretrain"), "--vocab-size", str(vocab), "--seq-len", str(seq_len),
                   *(["--validation-fraction", str(SMOKE["validation_fraction"])] if smoke else [])]
        subprocess.run(prepare, check=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
        data = work / "pretrain"
        write_tar_xz(stage / "pretrain.tar.xz", [(p, f"pretrain/{p.relative_to(data)}") for p in data.rglob("*")
                                                 if p.is_file()])
        tasks, glue_files = {}, []
        for name in TASKS:
            spec = get_task(name)
            rows = {}
            for split in ("train", "dev"):
                src = glue / spec.dir_name / spec.files[split]
                if not src.is_file():
                    raise UserError(f"--shared {shared}: {src} is missing")
                dst = work / "glue" / spec.dir_name / spec.files[split]
                dst.parent.mkdir(parents=True, exist_ok=True)
                header = spec.headerless_columns is None
                if smoke:
                    rows[split] = _first_lines(src, dst, SMOKE[f"{split}_lines"], header)
                else:
                    shutil.copyfile(src, dst)
                    rows[split] = len(dst.read_text(encoding="utf-8").splitlines()) - int(header)
                glue_files.append((dst, f"glue/{spec.dir_name}/{spec.files[split]}"))
            tasks[name] = {"dir": spec.dir_name, "train_rows": rows["train"], "dev_rows": rows["dev"]}
        write_tar_xz(stage / "glue.tar.xz", glue_files)
        manifest = json.loads((data / "manifest.json").read_text())
        files = {n: {"bytes": (stage / n).stat().st_size, "sha256": sha256_of(stage / n)}
                 for n in ("pretrain.tar.xz", "glue.tar.xz")}
        doc = {
            "format": FORMAT, "format_version": 1, "kind": "smoke" if smoke else "gpu",
            "pretrain": {"shards": [p.name for p in shard_files[:shards]], "tokens": manifest["tokens"],
                         "examples": manifest["examples"], "seq_len": manifest["seq_len"],
                         "vocab_size": manifest["tokenizer"]["vocab_size"],
                         "tokenizer_fingerprint": manifest["tokenizer"]["fingerprint"]},
            "glue": {"tasks": tasks, "splits": "train and dev (no test sets)"},
            "files": files, "total_bytes": sum(f["bytes"] for f in files.values()), "limit_bytes": LIMIT_BYTES,
            "command": " ".join(["bash benchmarks/gpu_suite.sh --pack", str(out_dir), "--shared", str(shared),
                                 *(["--smoke"] if smoke else ["--shards", str(shards)])]),
            "git_commit": git_commit(), "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "seconds": round(time.perf_counter() - t0, 1),
        }
        checkout = checkout_bytes()
        doc["checkout_bytes"] = checkout
        if doc["total_bytes"] > LIMIT_BYTES:
            raise UserError(f"the pack would be {doc['total_bytes'] / 2**20:.1f} MiB, over its "
                            f"{LIMIT_BYTES / 2**20:.0f} MiB (the repository and the pack travel in 64 MiB): use fewer "
                            f"--shards than {shards}")
        if checkout is not None and checkout + doc["total_bytes"] > TRAVEL_BYTES - TRAVEL_MARGIN_BYTES:
            raise UserError(f"the pack ({doc['total_bytes'] / 2**20:.1f} MiB) and the checkout ({checkout / 2**20:.1f} "
                            f"MiB) would leave less than {TRAVEL_MARGIN_BYTES / 2**20:.0f} MiB of the "
                            f"{TRAVEL_BYTES / 2**20:.0f} MiB a GPU command carries: use fewer --shards than {shards}")
        shutil.rmtree(work)
        (stage / "pack.json").write_text(json.dumps(doc, indent=2) + "\n")
        if out_dir.exists():
            shutil.rmtree(out_dir)
        stage.rename(out_dir)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    describe(doc, out_dir)
    return doc


def describe(doc: dict, where: Path) -> None:
    """What a pack holds, in a few lines (and what the GPU run will make of it)."""
    p = doc["pretrain"]
    train_tokens = p["tokens"]["train"]
    sizes = ", ".join(f"{n} {f['bytes'] / 2**20:.1f} MiB" for n, f in doc["files"].items())
    checkout = doc.get("checkout_bytes")
    travel = (f"; with the checkout's {checkout / 2**20:.1f} MiB: {(checkout + doc['total_bytes']) / 2**20:.1f} MiB of "
              f"the {TRAVEL_BYTES / 2**20:.0f} MiB a GPU command carries" if checkout else "")
    print(f"pack {where}: {doc['total_bytes'] / 2**20:.1f} MiB of {doc['limit_bytes'] / 2**20:.0f} MiB "
          f"({sizes}){travel}")
    print(f"  pre-training: {train_tokens:,} tokens in {p['examples']['train']:,} rows of {p['seq_len']} "
          f"({len(p['shards'])} enwiki shards; {p['tokens']['validation']:,} held-out tokens), a "
          f"{p['vocab_size']:,}-entry WordPiece (fingerprint {p['tokenizer_fingerprint'][:12]})")
    if doc["kind"] == "gpu":
        seconds = suite.gpu_plan("run")["pretrain_train_s"]
        low, high = (rate * seconds for rate in suite.EXPECTED_TOKENS_PER_S)
        paper = suite.PAPER_POINT_STEPS * 128 * 128
        print(f"  the GPU run trains at least {seconds} s (more when earlier stages finish early): at "
              f"{suite.EXPECTED_TOKENS_PER_S[0] / 1e6:.1f}M-{suite.EXPECTED_TOKENS_PER_S[1] / 1e6:.1f}M tokens/s, "
              f"{low / 1e6:.0f}M-{high / 1e6:.0f}M tokens = {low / train_tokens:.1f}-{high / train_tokens:.1f} passes "
              f"over them (the paper's 6.25% point, {paper / 1e9:.2f}B tokens, would be {paper / train_tokens:.0f} "
              "passes)")
    tasks = doc["glue"]["tasks"]
    print("  GLUE: " + ", ".join(f"{t} ({v['train_rows']:,} train / {v['dev_rows']:,} dev rows)"
                                 for t, v in tasks.items()))


def unpack(lease: Path, work: Path) -> dict:
    """Check the pack's archives against pack.json and extract them: WORK/pretrain and WORK/glue."""
    info = lease / "pack.json"
    if not info.is_file():
        raise UserError(f"{lease}: no pack.json (build the pack first: bash benchmarks/gpu_suite.sh --pack {lease})")
    doc = json.loads(info.read_text())
    if doc.get("format") != FORMAT:
        raise UserError(f"{info}: not a tinyelectra GPU pack")
    for name, f in doc["files"].items():
        if not (lease / name).is_file() or sha256_of(lease / name) != f["sha256"]:
            raise UserError(f"{lease / name}: missing or not the file pack.json describes (sha256); build the pack "
                            "again")
    work.mkdir(parents=True, exist_ok=True)
    for name in doc["files"]:
        with tarfile.open(lease / name) as tar:
            tar.extractall(work, filter="data")
    (work / "pack.json").write_text(json.dumps(doc, indent=2) + "\n")
    describe(doc, lease)
    print(f"unpacked into {work}: pretrain/ (prepared data), glue/ ({', '.join(doc['glue']['tasks'])})")
    return doc


# ---------------------------------------------------------------------------------------------------------------
# How many tokens a MiB of pack holds: the current packing against alternatives (benchmarks/results/pack_formats.json)
# ---------------------------------------------------------------------------------------------------------------


def _alternatives(data: Path, text_files: list[Path]) -> dict[str, Callable[[], bytes]]:
    """name -> a function returning the bytes that way of packing ships for the prepared folder `data` (or the text
    it came from, `text_files`); each holds the tokenizer and manifest too. The first is the current packing."""
    import bz2  # noqa: PLC0415
    import gzip  # noqa: PLC0415
    import io  # noqa: PLC0415
    import lzma  # noqa: PLC0415

    import numpy as np  # noqa: PLC0415

    manifest = json.loads((data / "manifest.json").read_text())
    shards = [(np.load(data / sh["ids"]), np.load(data / sh["meta"]))
              for split in manifest["splits"].values() for sh in split["shards"]]
    side = ([p.read_bytes() for p in sorted((data / "tokenizer").rglob("*")) if p.is_file()]
            + [(data / "manifest.json").read_bytes()])
    metas = [meta.tobytes() for _, meta in shards]
    # each row's tokens without its padding, concatenated (the rows are rebuilt from them and the meta's lengths)
    real = np.concatenate([rows[np.arange(rows.shape[1])[None, :] < meta[:, 1:]]
                           for rows, meta in shards]).astype(np.uint16)
    order = np.argsort(-np.bincount(real, minlength=65536), kind="stable").astype(np.uint16)  # by frequency
    rank = np.empty(65536, dtype=np.uint16)
    rank[order] = np.arange(65536, dtype=np.uint16)
    ranked = rank[real]

    def tarred(mode: str, **options) -> bytes:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode=mode, **options) as tar:
            for f in sorted(p for p in data.rglob("*") if p.is_file()):
                tar.add(str(f), arcname=str(f.relative_to(data)))
        return buf.getvalue()

    def xz(blobs: list[bytes], **lzma2) -> bytes:  # lzma2: LZMA2 options beyond preset 9 (lp, pb, lc: 2-byte symbols)
        filters = [{"id": lzma.FILTER_LZMA2, "preset": 9, **lzma2}]
        return lzma.compress(b"".join(blobs), format=lzma.FORMAT_XZ, filters=filters)

    def bits15() -> bytes:  # the 15 low bits of each id (the vocabulary is below 32,768), packed
        bits = np.unpackbits(real.astype(">u2").view(np.uint8).reshape(-1, 2), axis=1)[:, 1:]
        return xz([np.packbits(bits.reshape(-1)).tobytes(), *metas, *side])

    def one_or_two_bytes() -> bytes:  # frequency-ranked ids below 128 in one byte, the others in two (high bit set)
        wide = ranked.astype(np.int64)
        small = wide < 128
        pairs = np.stack([wide, 0x80 | (wide >> 8), wide & 0xFF], axis=1)
        keep = np.where(small[:, None], [True, False, False], [False, True, True])
        return xz([pairs[keep].astype(np.uint8).tobytes(), order.tobytes(), *metas, *side])

    def text() -> bytes:
        return b"".join(gzip.decompress(p.read_bytes()) for p in text_files) + b"".join(side)

    return {
        "current: the prepared folder (padded uint16 rows, .npy), tar.xz preset 9": lambda: tarred("w:xz", preset=9),
        "the prepared folder, tar.xz preset 9 extreme": lambda: tarred("w:xz", preset=9 | lzma.PRESET_EXTREME),
        "the prepared folder, tar.bz2 9": lambda: tarred("w:bz2", compresslevel=9),
        "the prepared folder, tar.gz 9": lambda: tarred("w:gz", compresslevel=9),
        "the prepared folder, xz with LZMA2 lp=1 pb=1 lc=0 (2-byte symbols)": lambda: xz(
            [p.read_bytes() for p in sorted(data.rglob("*")) if p.is_file()], lp=1, pb=1, lc=0),
        "real tokens only (padding dropped, rows rebuilt on unpack), uint16, xz 9":
            lambda: xz([real.tobytes(), *metas, *side]),
        "real tokens only, LZMA2 lp=1 pb=1 lc=0": lambda: xz([real.tobytes(), *metas, *side], lp=1, pb=1, lc=0),
        "real tokens only, uint16 as two byte planes (high bytes, then low), xz 9": lambda: xz(
            [real.view(np.uint8)[1::2].tobytes(), real.view(np.uint8)[0::2].tobytes(), *metas, *side]),
        "real tokens only, 15-bit packed, xz 9": bits15,
        "real tokens only, renumbered by frequency (permutation shipped), LZMA2 lp=1 pb=1 lc=0": lambda: xz(
            [ranked.tobytes(), order.tobytes(), *metas, *side], lp=1, pb=1, lc=0),
        "real tokens only, renumbered by frequency, one byte below 128 else two, xz 9": one_or_two_bytes,
        "the text, as the shards come (gzip): prepared again on the GPU machine": lambda: b"".join(
            [p.read_bytes() for p in text_files] + [gzip.compress(b"".join(side), 9)]),
        "the text, xz 9: prepared again on the GPU machine": lambda: xz([text()]),
        "the text, bz2 9: prepared again on the GPU machine": lambda: bz2.compress(text(), 9),
    }


def _decompress(blob: bytes) -> None:
    """Read a compressed blob back whole (tar members included): the unpack stage's cost."""
    import bz2  # noqa: PLC0415
    import gzip  # noqa: PLC0415
    import lzma  # noqa: PLC0415

    for magic, read in ((b"\xfd7zXZ", lzma.decompress), (b"BZh", bz2.decompress), (b"\x1f\x8b", gzip.decompress)):
        if blob.startswith(magic):
            read(blob)
            return


def measure(shared: Path, shards: int, work: Path) -> dict:
    """Tokens per MiB of each way of packing the first `shards` enwiki shards, prepared as the GPU pack prepares them
    (the electra-small vocabulary, rows of 128): bytes, tokens (the text tokens the rows hold: prepare's count) per
    MiB, the ratio to the current packing (same run), seconds to compress and to read back (one thread)."""
    from benchmarks.common import write_result  # noqa: PLC0415

    from tinyelectra.config import load_recipe  # noqa: PLC0415

    files = sorted((shared / "enwiki").glob("*.gz"))[:shards]
    small = load_recipe("electra-small")
    data = work / f"pretrain-{shards}"
    subprocess.run([sys.executable, "-m", "tinyelectra", "prepare", "--corpus", *map(str, files), "--out", str(data),
                    "--vocab-size", str(small.model.vocab_size), "--seq-len", str(small.train.seq_len)],
                   check=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    manifest = json.loads((data / "manifest.json").read_text())
    tokens = sum(manifest["tokens"].values())
    out: dict[str, dict] = {}
    for name, make in _alternatives(data, files).items():
        t0 = time.perf_counter()
        blob = make()
        t1 = time.perf_counter()
        _decompress(blob)
        t2 = time.perf_counter()
        out[name] = {"bytes": len(blob), "tokens_per_mib": tokens / (len(blob) / 2**20),
                     "bytes_per_token": len(blob) / tokens,
                     "compress_seconds": round(t1 - t0, 2), "read_back_seconds": round(t2 - t1, 2)}
        print(f"{name}: {len(blob) / 2**20:.2f} MiB, {out[name]['tokens_per_mib'] / 1e6:.3f}M tokens/MiB", flush=True)
    current = next(iter(out.values()))["tokens_per_mib"]
    for v in out.values():
        v["tokens_per_mib_vs_current"] = round(v["tokens_per_mib"] / current, 4)
    payload = {"shards": [f.name for f in files], "tokens": manifest["tokens"], "examples": manifest["examples"],
               "text_bytes": manifest.get("text_bytes"), "threads": 1, "alternatives": out}
    write_result("pack_formats", payload, command=f"python -m benchmarks.gpu_check.pack measure --shards {shards}")
    return payload


def parser() -> suite.OneLineParser:
    ap = suite.OneLineParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True, parser_class=suite.OneLineParser)
    b = sub.add_parser("build", help="build a pack from the project's data folder")
    b.add_argument("dir", nargs="?", default=str(ROOT / ".lease"), help="where the pack goes (default .lease/)")
    b.add_argument("--shared", default=os.environ.get("TINYELECTRA_SHARED_DATA")
                   or str(ROOT.parent / "shared" / "data"),
                   help="the data folder (default $TINYELECTRA_SHARED_DATA, else ../shared/data)")
    b.add_argument("--shards", type=int, default=DEFAULT_SHARDS, help="enwiki shards to prepare (sorted by name)")
    b.add_argument("--smoke", action="store_true", help="the toy pack of the CPU smoke run")
    m = sub.add_parser("measure", help="tokens per MiB of the current packing against alternatives")
    m.add_argument("--shared", default=os.environ.get("TINYELECTRA_SHARED_DATA")
                   or str(ROOT.parent / "shared" / "data"))
    m.add_argument("--shards", type=int, default=20, help="enwiki shards to prepare and pack (sorted by name)")
    m.add_argument("--work", default="/tmp/tinyelectra-pack-measure", help="where the shards are prepared")
    u = sub.add_parser("unpack", help="check and extract a pack")
    u.add_argument("dir")
    u.add_argument("work")
    return ap


def main(argv: list[str] | None = None) -> dict:
    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    if args.command == "build":
        return build(Path(args.dir), Path(args.shared), args.shards, args.smoke)
    if args.command == "measure":
        return measure(Path(args.shared), args.shards, Path(args.work))
    return unpack(Path(args.dir), Path(args.work))


if __name__ == "__main__":
    try:
        main()
    except UserError as e:  # bad input: one line, exit code 2, as the command line does
        print(f"error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
