"""The no-pre-training side of the GPU suite's GLUE comparison, computed beforehand on the CPU: the initial weights
of the recipe `pretrain` trains (its seed, the pack's tokenizer and vocabulary) fine-tuned with exactly the suite's
GLUE protocol (suite.GLUE: tasks, seeds, row cap, settings), so that the GPU spends its minutes on the pre-trained
side only and its summary puts the two side by side.

    python benchmarks/glue_baseline.py [--lease .lease] [--threads 1]     # -> benchmarks/results/glue_no_pretraining_cpu.json
    python benchmarks/glue_baseline.py --lease DIR --out-dir D --name N   # a smoke pack: the smoke protocol

Runs `tinyelectra glue --device cpu` pinned to --threads (OMP_NUM_THREADS), in --work (default runs/glue-baseline-
<kind>/); run again after an interruption, it reuses the finished tasks. The result names the machine, the commit,
the pack (its tokenizer's fingerprint and archives' sha256) and holds the whole glue.json, whose protocol and data
hashes the suite's summary compares with the GPU side's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pack  # noqa: E402
import suite  # noqa: E402
from common import command_line, run_main, save_initial_checkpoint, write_result  # noqa: E402

from tinyelectra.checkpoint import is_checkpoint  # noqa: E402


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lease", default=str(suite.ROOT / ".lease"), help="the pack (default .lease/)")
    ap.add_argument("--work", default=None, help="work folder (default runs/glue-baseline-<pack kind>/)")
    ap.add_argument("--threads", type=int, default=1, help="CPU threads of the fine-tuning process")
    ap.add_argument("--name", default=None, help="result name (default: glue_no_pretraining_cpu for a GPU pack)")
    ap.add_argument("--out-dir", default=None, help="where the result goes (default benchmarks/results/)")
    return ap


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    args = parser().parse_args(argv)
    info = json.loads((Path(args.lease) / "pack.json").read_text()) if (Path(args.lease) / "pack.json").is_file() else {}
    mode = info.get("kind", "gpu")
    work = Path(args.work or suite.ROOT / "runs" / f"glue-baseline-{mode}")
    doc = pack.unpack(Path(args.lease), work / "pack")
    data_dir, glue_dir, tasks = work / "pack" / "pretrain", work / "pack" / "glue", list(doc["glue"]["tasks"])
    recipe = suite.pretrain_recipe(mode, data_dir)
    init = work / "init"
    if not is_checkpoint(init):
        save_initial_checkpoint(recipe, data_dir, init, "no pre-training: the initial weights of the suite's pretrain "
                                "stage (same recipe, seed and tokenizer)")
    glue = [sys.executable, "-m", "tinyelectra", *suite.glue_args(mode, init, glue_dir, tasks, work / "glue", ["--device", "cpu"])]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads),
           "PYTHONPATH": os.pathsep.join([str(suite.ROOT), os.environ.get("PYTHONPATH", "")])}
    t0 = time.perf_counter()
    subprocess.run(glue, check=True, env=env)
    result = json.loads((work / "glue" / init.name / "glue.json").read_text())
    payload = {
        "what": "GLUE of the initial (never pre-trained) weights with the GPU suite's protocol: the no-pre-training "
                "side of its comparison",
        "device": "cpu", "threads": args.threads, "recipe": recipe.name, "recipe_sets": list(suite.PRETRAIN[mode]["sets"]),
        "protocol": {"mode": mode, **suite.GLUE[mode], "settings": list(suite.GLUE_SETTINGS), "tasks": tasks},
        "pack": {"tokenizer_fingerprint": doc["pretrain"]["tokenizer_fingerprint"], "files": doc["files"],
                 "glue": doc["glue"]["tasks"]},
        "glue_command": " ".join(["tinyelectra", *glue[3:]]), "seconds": round(time.perf_counter() - t0, 1),
        "scores": {t: v["median_paper"] for t, v in result["tasks"].items()}, "glue": result,
    }
    name = args.name or ("glue_no_pretraining_cpu" if mode == "gpu" else "glue_no_pretraining_smoke")
    path = write_result(name, payload, out_dir=args.out_dir, command=command_line("benchmarks/glue_baseline.py", argv))
    print(f"no pre-training, {', '.join(f'{t} {s:.1f}' for t, s in payload['scores'].items())} -> {path}")
    return payload


if __name__ == "__main__":
    run_main(main)
