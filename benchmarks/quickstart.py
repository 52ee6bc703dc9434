"""The README's quick start as a new user runs it: the wall time from launching the command to its end (Python and
torch start-up and the built-in corpus's preparation included) on a slowed CPU and on the machine as it is, and what
the run learned (its last checkpoint's verdict on held-out rows).

The command is read from the README's first bash block (the part after `.venv/bin/tinyelectra`), with only `--out`
moved into the work folder. Cases (`--cases`, comma-separated, each run once and kept: a finished case is reused
unless `--again`, so an interrupted invocation continues where it stopped):

- `fast-cold`: the command as typed, on the machine as it is, with a fresh TINYELECTRA_CACHE (the corpus is prepared
  first, as on a user's first run);
- `fast-warm`: the same with the corpus already prepared (the cache `fast-cold` filled);
- `slow-cold`, `slow-warm`: pinned to one core (`taskset -c 0`) with a CPU-bound Python process pinned beside it on
  that core for the whole case: about half of one core, the issue's slow laptop;
- `before-slow`: the quick start as it was before (`--recipe tiny --budget 2m`, read from `--before`) in the slow
  case, warm: the alternative it replaced, measured beside it.

Threads are not pinned by the script: the quick start is measured as a user runs it (torch takes one thread per core
it may use: 2 here, 1 under taskset; each case records what the run used). The machine is shared, so each case
records /proc/loadavg before and after it; the load is part of the result.

    python benchmarks/quickstart.py --cases fast-cold,fast-warm,slow-cold,slow-warm,before-slow
      -> benchmarks/results/quickstart_cpu.json and .md; runs in runs/quickstart-bench/<case>/
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path


from benchmarks.common import RESULTS, ROOT, command_line, run_main, write_result

from tinyelectra.errors import UserError

CASES = ("fast-cold", "fast-warm", "slow-cold", "slow-warm", "before-slow")
BEFORE = "train --recipe tiny --budget 2m --device cpu --out runs/quickstart"  # main 0f79abe's quick start
HOG = "while True: pass"  # the CPU-bound process beside a slow case's run


def readme_command(readme: Path = ROOT / "README.md") -> list[str]:
    """The quick start's `tinyelectra` arguments: the README's first bash block after `.venv/bin/tinyelectra `."""
    blocks = re.findall(r"```bash\n(.*?)```", readme.read_text(encoding="utf-8"), flags=re.DOTALL)
    if not blocks or " && .venv/bin/tinyelectra " not in blocks[0]:
        raise UserError(f"{readme}: its first bash block has no `.venv/bin/tinyelectra` command")
    return shlex.split(blocks[0].strip().split(" && .venv/bin/tinyelectra ", 1)[1])


def with_out(args: list[str], out: Path) -> list[str]:
    """`args` with `--out`'s value replaced by `out`."""
    i = args.index("--out")
    return [*args[:i + 1], str(out), *args[i + 2:]]


def loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def run_case(name: str, args: list[str], work: Path, tinyelectra: str) -> dict:
    """One case: the command run to its end (its wall time measured from launch), then its run folder read."""
    slow, cold = name.startswith("slow") or name == "before-slow", name.endswith("-cold")
    cache = work / ("cache-slow" if slow else "cache-fast")
    if cold and cache.exists():
        shutil.rmtree(cache)
    run_dir = work / name
    if run_dir.exists():
        shutil.rmtree(run_dir)
    pin = ["taskset", "-c", "0"] if slow else []
    cmd = [*pin, tinyelectra, *with_out(args, run_dir)]
    env = dict(os.environ, TINYELECTRA_CACHE=str(cache))
    if not cold:  # the corpus prepared before (not timed), as a second run finds it: a one-step run of the command
        scratch = work / "prepare-only"
        one_step = with_out(args, scratch)
        one_step[one_step.index("--budget") + 1] = "1steps"
        subprocess.run([tinyelectra, *one_step, "--force"], env=env, capture_output=True, check=True)
        shutil.rmtree(scratch)
    hog = subprocess.Popen([*pin, sys.executable, "-c", HOG]) if slow else None
    try:
        before = loadavg()
        t0 = time.perf_counter()
        p = subprocess.run(cmd, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        after = loadavg()
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()
    (work / f"{name}.log").write_text(p.stdout + p.stderr, encoding="utf-8")
    out = {"command": shlex.join([*pin, "tinyelectra", *args]), "cache": "fresh" if cold else "corpus already prepared",
           "beside": (f"{shlex.join([*pin, 'python', '-c', HOG])} (pinned to the same core)" if slow
                      else "nothing added"),
           "exit_code": p.returncode, "wall_seconds": round(wall, 1), "loadavg_before": before, "loadavg_after": after}
    if p.returncode != 0:
        return {**out, "error": (p.stderr or p.stdout)[-2000:]}
    summary = json.loads((run_dir / "summary.json").read_text())
    checkpoints = []
    for ckpt in summary["checkpoints"]:
        meta = json.loads((run_dir / ckpt / "meta.json").read_text())
        e = meta["eval"]
        checkpoints.append({"name": ckpt, "step": meta["step"], "gen_acc": e["gen_acc"],
                            "unigram_acc": e["unigram_acc"],
                            "gen_over_unigram": round(e["gen_acc"] / e["unigram_acc"], 3), "learned": e["learned"],
                            "learning": e["learning"], "verdict": e["verdict"], "rows": e["rows"]})
    prepared = json.loads((cache / next(cache.iterdir()).name / "manifest.json").read_text()) if cold else None
    return {**out, "steps": summary["steps"], "train_seconds": round(summary["train_seconds"], 1),
            "process_seconds": summary["process_seconds"],
            "median_tokens_per_second": summary["median_tokens_per_second"],
            "cpu_threads": summary["runtime"]["cpu_threads"]["threads"],
            "prepare_seconds": prepared["seconds"]["total"] if prepared else None,
            "five_checkpoints": len(checkpoints) == 5, "flops_report": "FLOPs report" in p.stdout + p.stderr,
            "final": checkpoints[-1], "checkpoints": checkpoints}


def render(doc: dict) -> str:
    lines = [f"# The README's quick start, timed ({doc['machine']['cpu']}, {doc['machine']['cores']} cores, shared)",
             "",
             f"Command: `{doc['quick_start']}` (from the README; `--out` moved into the work folder). Before: "
             f"`{doc['before']}`. Commit {doc['git_commit']}. Wall time: launch to exit, Python start-up and corpus "
             "preparation included. Slow: `taskset -c 0` with a CPU-bound process on the same core.", "",
             "| case | cache | exit | wall s | prepare s | steps | train s | tokens/s | threads | load before -> "
             "after (1 min) | generator / unigram at the end | verdict "
             "|", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, c in doc["cases"].items():
        if c["exit_code"] != 0:
            lines.append(f"| {name} | {c['cache']} | {c['exit_code']} | {c['wall_seconds']} | | | | | | | | failed |")
            continue
        f = c["final"]
        lines.append(f"| {name} | {c['cache']} | 0 | {c['wall_seconds']:.0f} | {c['prepare_seconds'] or '-'} | "
                     f"{c['steps']} | {c['train_seconds']:.0f} | {c['median_tokens_per_second']:,.0f} | "
                     f"{c['cpu_threads']} | {c['loadavg_before'][0]:.1f} -> {c['loadavg_after'][0]:.1f} | "
                     f"{f['gen_over_unigram']:.2f}x ({f['gen_acc']:.3f} vs {f['unigram_acc']:.3f}) | "
                     f"{f['verdict'].split(':')[0]} |")
    return "\n".join([*lines, "", f"Produced by `{doc['command']}`", ""])


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    ap.add_argument("--before", default=BEFORE, help="the quick start's `tinyelectra` arguments before (before-slow)")
    ap.add_argument("--again", action="store_true", help="run finished cases again")
    ap.add_argument("--work-dir", default=str(ROOT / "runs" / "quickstart-bench"))
    ap.add_argument("--name", default="quickstart_cpu")
    argv = sys.argv[1:] if argv is None else list(argv)
    a = ap.parse_args(argv)
    names = [c.strip() for c in a.cases.split(",") if c.strip()]
    if bad := [c for c in names if c not in CASES]:
        raise UserError(f"--cases: unknown {', '.join(bad)} (choose from {', '.join(CASES)})")
    if any(c.startswith("slow") or c == "before-slow" for c in names) and shutil.which("taskset") is None:
        raise UserError("the slow cases need taskset (util-linux)")
    tinyelectra = str(Path(sys.executable).with_name("tinyelectra"))
    work = Path(a.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{a.name}.json"
    cases = json.loads(path.read_text())["cases"] if path.is_file() else {}
    quick_start = readme_command()
    for name in names:
        if name in cases and not a.again:
            print(f"{name}: kept from {path}")
            continue
        print(f"{name}: running", flush=True)
        cases[name] = run_case(name, shlex.split(a.before) if name == "before-slow" else quick_start, work, tinyelectra)
        print(f"{name}: {cases[name]['wall_seconds']} s, exit {cases[name]['exit_code']}", flush=True)
        doc = {"quick_start": shlex.join(["tinyelectra", *quick_start]), "before": f"tinyelectra {a.before}",
               "cases": {c: cases[c] for c in CASES if c in cases}}
        path = write_result(a.name, doc, command=command_line("benchmarks.quickstart", argv))
        path.with_suffix(".md").write_text(render(json.loads(path.read_text())), encoding="utf-8")
    return json.loads(path.read_text())


if __name__ == "__main__":
    run_main(main)
