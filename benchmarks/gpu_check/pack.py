"""The data the GPU run needs that git does not hold, packed to travel beside the working tree, and unpacked there.

    python -m benchmarks.gpu_check.pack build [DIR] [--shared ../shared/data] [--shards 360]   # -> DIR (default .lease/)
    python -m benchmarks.gpu_check.pack build DIR --smoke                                      # a toy pack for --cpu-smoke
    python -m benchmarks.gpu_check.pack unpack DIR WORK                  # -> WORK/pretrain (prepared data), WORK/glue (tasks)

A pack is three files:
- pretrain.tar.xz: `tinyelectra prepare` of the first --shards enwiki files at the electra-small recipe's
  vocabulary (a 30,522-entry WordPiece trained by prepare) and row length (128 tokens): manifest, tokenizer, uint16
  rows. xz (preset 9) stores them in about 1.04 bytes per token (measured on the first 220 shards: 30.3M tokens in
  31.65 MB), so 360 shards, about 50M tokens, fit;
- glue.tar.xz: the whole train.tsv and dev.tsv of the tasks the GPU run fine-tunes on (TASKS; 1.3 MiB of xz: the
  full training sets, as the paper's protocol fine-tunes on them);
- pack.json: what the pack holds (tokens, rows, tasks and their rows, each archive's bytes and sha256, the
  tokenizer's fingerprint, the command and commit that built it).
It must fit beside the checkout in the 64 MiB a GPU command carries: `build` measures the checkout (the files git
tracks or would track: what the device tool sends) and the pack, and refuses (an error, and the previous pack left
as it was) when together they leave less than TRAVEL_MARGIN_BYTES, or the pack alone is over LIMIT_BYTES. `--smoke` builds the toy pack of the
CPU smoke run: the first enwiki shard at a 2,048-entry vocabulary and 32-token rows (10% of its documents held out),
and the first 40 training and 20 dev rows of each task.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from benchmarks import ROOT
from benchmarks.gpu_check import suite  # no torch: unpacking is the GPU run's first stage, on a cold machine

from tinyelectra.errors import UserError
from tinyelectra.files import sha256_of

TASKS = ("cola", "sst2", "stsb", "mrpc", "rte")  # by value: CoLA shows pre-training first; RTE and MRPC last
LIMIT_BYTES = 56 * 2**20
TRAVEL_BYTES = 64 * 2**20  # what one GPU command carries: the working tree and the carried paths together
TRAVEL_MARGIN_BYTES = 2 * 2**20  # left free for the results a session adds to the checkout before the lease
DEFAULT_SHARDS = 360
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
        raise UserError(f"--shared {shared}: expected enwiki/*.gz and glue/ (the project's data folder, ../shared/data)")
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
        write_tar_xz(stage / "pretrain.tar.xz", [(p, f"pretrain/{p.relative_to(data)}") for p in data.rglob("*") if p.is_file()])
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
        files = {n: {"bytes": (stage / n).stat().st_size, "sha256": sha256_of(stage / n)} for n in ("pretrain.tar.xz", "glue.tar.xz")}
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
            raise UserError(f"the pack would be {doc['total_bytes'] / 2**20:.1f} MiB, over its {LIMIT_BYTES / 2**20:.0f} MiB "
                            f"(the repository and the pack travel in 64 MiB): use fewer --shards than {shards}")
        if checkout is not None and checkout + doc["total_bytes"] > TRAVEL_BYTES - TRAVEL_MARGIN_BYTES:
            raise UserError(f"the pack ({doc['total_bytes'] / 2**20:.1f} MiB) and the checkout ({checkout / 2**20:.1f} MiB) "
                            f"would leave less than {TRAVEL_MARGIN_BYTES / 2**20:.0f} MiB of the {TRAVEL_BYTES / 2**20:.0f} MiB "
                            f"a GPU command carries: use fewer --shards than {shards}")
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
    travel = f"; with the checkout's {checkout / 2**20:.1f} MiB: {(checkout + doc['total_bytes']) / 2**20:.1f} MiB of the " \
             f"{TRAVEL_BYTES / 2**20:.0f} MiB a GPU command carries" if checkout else ""
    print(f"pack {where}: {doc['total_bytes'] / 2**20:.1f} MiB of {doc['limit_bytes'] / 2**20:.0f} MiB ({sizes}){travel}")
    print(f"  pre-training: {train_tokens:,} tokens in {p['examples']['train']:,} rows of {p['seq_len']} "
          f"({len(p['shards'])} enwiki shards; {p['tokens']['validation']:,} held-out tokens), a {p['vocab_size']:,}-entry "
          f"WordPiece (fingerprint {p['tokenizer_fingerprint'][:12]})")
    if doc["kind"] == "gpu":
        seconds = suite.gpu_plan("run")["pretrain_train_s"]
        low, high = (rate * seconds for rate in suite.EXPECTED_TOKENS_PER_S)
        paper = suite.PAPER_POINT_STEPS * 128 * 128
        print(f"  the GPU run trains at least {seconds} s (more when earlier stages finish early): at "
              f"{suite.EXPECTED_TOKENS_PER_S[0] / 1e6:.1f}M-{suite.EXPECTED_TOKENS_PER_S[1] / 1e6:.1f}M tokens/s, "
              f"{low / 1e6:.0f}M-{high / 1e6:.0f}M tokens = {low / train_tokens:.1f}-{high / train_tokens:.1f} passes over them "
              f"(the paper's 6.25% point, {paper / 1e9:.2f}B tokens, would be {paper / train_tokens:.0f} passes)")
    tasks = doc["glue"]["tasks"]
    print("  GLUE: " + ", ".join(f"{t} ({v['train_rows']:,} train / {v['dev_rows']:,} dev rows)" for t, v in tasks.items()))


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
            raise UserError(f"{lease / name}: missing or not the file pack.json describes (sha256); build the pack again")
    work.mkdir(parents=True, exist_ok=True)
    for name in doc["files"]:
        with tarfile.open(lease / name) as tar:
            tar.extractall(work, filter="data")
    (work / "pack.json").write_text(json.dumps(doc, indent=2) + "\n")
    describe(doc, lease)
    print(f"unpacked into {work}: pretrain/ (prepared data), glue/ ({', '.join(doc['glue']['tasks'])})")
    return doc


def parser() -> suite.OneLineParser:
    ap = suite.OneLineParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True, parser_class=suite.OneLineParser)
    b = sub.add_parser("build", help="build a pack from the project's data folder")
    b.add_argument("dir", nargs="?", default=str(ROOT / ".lease"), help="where the pack goes (default .lease/)")
    b.add_argument("--shared", default=os.environ.get("TINYELECTRA_SHARED_DATA") or str(ROOT.parent / "shared" / "data"),
                   help="the data folder (default $TINYELECTRA_SHARED_DATA, else ../shared/data)")
    b.add_argument("--shards", type=int, default=DEFAULT_SHARDS, help="enwiki shards to prepare (sorted by name)")
    b.add_argument("--smoke", action="store_true", help="the toy pack of the CPU smoke run")
    u = sub.add_parser("unpack", help="check and extract a pack")
    u.add_argument("dir")
    u.add_argument("work")
    return ap


def main(argv: list[str] | None = None) -> dict:
    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    if args.command == "build":
        return build(Path(args.dir), Path(args.shared), args.shards, args.smoke)
    return unpack(Path(args.dir), Path(args.work))


if __name__ == "__main__":
    try:
        main()
    except UserError as e:  # bad input: one line, exit code 2, as the command line does
        print(f"error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
