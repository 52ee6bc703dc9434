"""The two Python parts of benchmarks/gpu_suite.sh: `env` (the machine, as env.json) and `summary` (every stage's
status and the headline figures, as summary.json, with the figures that are still unmeasured listed by name).

    python benchmarks/suite.py env OUT.json MODE
    python benchmarks/suite.py summary STAGE_DIR SUMMARY.json MODE SECONDS TIME_LIMIT_S [GIT_COMMIT]

Nothing here measures; it reads what the stages wrote. Every figure keeps the device and the stage it came from;
a figure whose stage failed, timed out or was skipped is null and named under "unmeasured".
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

# The figures issue 10 asks for: (name, stage file, path into its JSON). The stage file is the stage's name.
FIGURES = [
    ("tinyelectra tokens/s, compiled, bf16, batch 128", "te_compiled_bf16", ("tinyelectra", "tokens_per_s")),
    ("tinyelectra tokens/s, eager, bf16, batch 128", "te_eager_bf16", ("tinyelectra", "tokens_per_s")),
    ("transformers tokens/s, eager, bf16, batch 128", "hf_eager_bf16", ("transformers", "tokens_per_s")),
    ("transformers tokens/s, compiled, bf16, batch 128", "hf_compiled_bf16", ("transformers", "tokens_per_s")),
    ("tinyelectra tokens/s, CUDA graphs (reduce-overhead), bf16, batch 128", "te_cudagraphs_bf16", ("tinyelectra", "tokens_per_s")),
    ("tinyelectra tokens/s, compiled, fp16, batch 128", "te_compiled_fp16", ("tinyelectra", "tokens_per_s")),
    ("tinyelectra tokens/s, compiled, bf16, batch 256", "te_compiled_bf16_b256", ("tinyelectra", "tokens_per_s")),
    ("tinyelectra tokens/s, compiled, bf16, batch 512", "te_compiled_bf16_b512", ("tinyelectra", "tokens_per_s")),
    ("hardware MFU, compiled, bf16", "te_compiled_bf16", ("tinyelectra", "hardware_mfu")),
    ("fraction of the issue's 5M tokens/s ceiling estimate, compiled, bf16", "te_compiled_bf16", ("tinyelectra", "fraction_of_ceiling_estimate")),
    ("peak memory (bytes), compiled, bf16, batch 128, one step", "te_compiled_bf16", ("tinyelectra", "peak_memory_bytes")),
    ("peak memory (bytes), eager, bf16, batch 128, one step", "te_eager_bf16", ("tinyelectra", "peak_memory_bytes")),
    ("compile time (s): first call of the first compiled stage, incl. the compile check (cold if env.json's "
     "inductor_cache_at_start says empty)", "te_compiled_bf16", ("tinyelectra", "first_call_s")),
    ("graphs compiled, compiled bf16 step", "te_compiled_bf16", ("tinyelectra", "compile", "graphs_at_first_call")),
    ("graph breaks, compiled bf16 step", "te_compiled_bf16", ("tinyelectra", "compile", "graph_breaks_at_first_call")),
    ("recompilations while timing, compiled bf16 step", "te_compiled_bf16", ("graphs_compiled_while_timing",)),
    ("attention kernel that ran (tinyelectra, compiled bf16)", "te_compiled_bf16", ("tinyelectra", "attention", "summary")),
    ("kernel launches per step, eager bf16", "te_eager_bf16", ("tinyelectra", "profile", "kernel_launches_per_step")),
    ("kernel launches per step, compiled bf16", "te_compiled_bf16", ("tinyelectra", "profile", "kernel_launches_per_step")),
    ("kernel launches per step, CUDA graphs bf16", "te_cudagraphs_bf16", ("tinyelectra", "profile", "kernel_launches_per_step")),
    ("top kernels, compiled bf16", "te_compiled_bf16", ("tinyelectra", "profile", "top")),
    ("memory levers (checkpointing off/on), Small", "memory_small", ("sizes",)),
    ("attention kernels micro-benchmark (efficient / cuDNN / math / flash without mask)", "attention", ("results",)),
    ("eager vs compiled loss, 20 steps: max |difference|", "loss_check", ("max_abs_loss_difference",)),
]


def _get(doc: dict | None, path: tuple):
    for k in path:
        if not isinstance(doc, dict) or k not in doc:
            return None
        doc = doc[k]
    return doc


def _measured_as(doc: dict | None) -> str | None:
    """What a stage's figures are figures of, from its own file (the labels above name the GPU configuration)."""
    if not doc:
        return None
    parts = [str(doc.get("device", "?")), str(doc.get("recipe", "?"))]
    if doc.get("overrides"):
        parts.append(" ".join(doc["overrides"]))
    if doc.get("batch_size"):
        parts.append(f"batch {doc['batch_size']} x {doc.get('seq_len', '?')}")
    if doc.get("precision"):
        parts.append(str(doc["precision"]))
    notes = {v.get("compile_note") for v in (doc.get("tinyelectra"), doc.get("transformers")) if isinstance(v, dict)}
    notes.discard(None)
    parts += sorted(notes)
    return ", ".join(parts)


def env(out: str, mode: str) -> int:
    info: dict = {"mode": mode, "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                  "python": platform.python_version(), "platform": platform.platform(), "executable": sys.executable,
                  "cpu_count": os.cpu_count(), "c_compiler": shutil.which("cc") or shutil.which("gcc") or "none (Triton needs one)",
                  "inductor_cache_at_start": os.environ.get("SUITE_INDUCTOR_CACHE_AT_START", "unknown")}
    for pkg in ("torch", "triton", "transformers", "tokenizers", "safetensors", "sentencepiece", "numpy", "rich", "typer",
                "matplotlib", "bitsandbytes", "deepspeed"):
        try:
            info[pkg] = __import__(pkg).__version__
        except Exception as e:  # noqa: BLE001 - a missing or broken package is recorded, not fatal
            info[pkg] = f"missing ({type(e).__name__})"
    import torch

    info["cuda_available"] = torch.cuda.is_available()
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(cuda=torch.version.cuda, gpu=torch.cuda.get_device_name(0), gpu_count=torch.cuda.device_count(),
                    gpu_memory_gib=props.total_memory / 2**30, compute_capability=f"{props.major}.{props.minor}",
                    bf16_supported=torch.cuda.is_bf16_supported())
        try:
            info["nvidia_smi"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                                                 "--format=csv,noheader"], capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError) as e:
            info["nvidia_smi"] = f"unavailable ({e})"
    import tinyelectra

    info["tinyelectra_from"] = os.path.dirname(tinyelectra.__file__)
    Path(out).write_text(json.dumps(info, indent=2) + "\n")
    print(json.dumps(info, indent=2))
    if mode == "gpu" and not info["cuda_available"]:
        print("no CUDA GPU visible to torch: the GPU stages will fail (use --cpu-smoke on a CPU)", file=sys.stderr)
        return 1
    return 0


def summary(stage_dir: str, out: str, mode: str, seconds: int, limit_s: int, commit_env: str = "") -> int:
    d = Path(stage_dir)
    stages = [json.loads(x) for x in (d / "stages.jsonl").read_text().splitlines() if x.strip()] if (d / "stages.jsonl").is_file() else []
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True,
                                cwd=Path(__file__).resolve().parent).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = f"{commit_env} (from SUITE_GIT_COMMIT)" if commit_env else "unknown (no .git; set SUITE_GIT_COMMIT)"
    docs: dict[str, dict] = {}
    for path in sorted(d.glob("*.json")):
        try:
            doc = json.loads(path.read_text())
        except ValueError:
            continue
        if doc.get("git_commit") == "unknown" and commit_env:  # the checkout had no .git: name the commit given
            doc["git_commit"] = f"{commit_env} (from SUITE_GIT_COMMIT)"
            tmp = path.with_suffix(".json.tmp")
            tmp.write_text(json.dumps(doc, indent=2) + "\n")
            os.replace(tmp, path)
        docs[path.stem] = doc
    status = {s["stage"]: s["status"] for s in stages}
    figures, unmeasured = {}, []
    for label, stage, path in FIGURES:
        sd = docs.get(stage)
        value = _get(sd, path)  # a stage cut short keeps what it wrote before (its file says complete: false)
        figures[label] = {"value": value, "stage": stage, "stage_status": status.get(stage, "not run"),
                          "stage_complete": _get(sd, ("complete",)), "measured_as": _measured_as(sd)}
        if value is None:
            unmeasured.append(label)
    tok = {k: _get(docs.get(k), (side, "tokens_per_s")) for k, side in (
        ("te_eager_bf16", "tinyelectra"), ("te_compiled_bf16", "tinyelectra"), ("hf_eager_bf16", "transformers"),
        ("hf_compiled_bf16", "transformers"))}
    speedups = {
        "eager (tinyelectra / transformers)": tok["te_eager_bf16"] / tok["hf_eager_bf16"] if tok["te_eager_bf16"] and tok["hf_eager_bf16"] else None,
        "compiled (tinyelectra / transformers)": tok["te_compiled_bf16"] / tok["hf_compiled_bf16"] if tok["te_compiled_bf16"] and tok["hf_compiled_bf16"] else None,
        "method": "ratio of median tokens/s measured in separate stages (processes) on the same device, one after the other",
    }
    for k, v in speedups.items():
        if v is None:
            unmeasured.append(f"speed-up {k}")
    te128 = tok["te_compiled_bf16"]
    peak = _get(docs.get("te_compiled_bf16"), ("tinyelectra", "peak_memory_bytes"))
    targets = [
        {"target": "tinyelectra Small 128 x 128 bf16 >= 1.5M tokens/s (floor), 2.5M (target)", "measured": te128,
         "met_floor": te128 >= 1.5e6 if te128 else None, "met_target": te128 >= 2.5e6 if te128 else None},
        {"target": ">= 2x transformers, both eager", "measured": speedups["eager (tinyelectra / transformers)"],
         "met": speedups["eager (tinyelectra / transformers)"] >= 2.0 if speedups["eager (tinyelectra / transformers)"] else None},
        {"target": ">= 1.5x transformers, both compiled", "measured": speedups["compiled (tinyelectra / transformers)"],
         "met": speedups["compiled (tinyelectra / transformers)"] >= 1.5 if speedups["compiled (tinyelectra / transformers)"] else None},
        {"target": "peak memory <= 1.5 GiB, Small, batch 128 (compiled bf16 step, no checkpointing)",
         "measured_gib": peak / 2**30 if peak else None, "met": peak / 2**30 <= 1.5 if peak else None},
    ]
    doc = {"benchmark": "gpu_suite", "mode": mode, "git_commit": commit,
           "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "seconds": seconds, "time_limit_s": limit_s,
           "within_time_limit": seconds <= limit_s, "device": (docs.get("env") or {}).get("gpu") or "cpu",
           "stages": stages, "figures": figures, "speedups": speedups, "targets": targets,
           "unmeasured": unmeasured, "files": sorted(p.name for p in d.rglob("*") if p.is_file())}
    if mode != "gpu":
        doc["note"] = ("CPU smoke run: toy sizes on the CPU (tiny recipe, a few rows); compile stages use the "
                       "aot_eager backend (TINYELECTRA_COMPILE_BACKEND), fp16 stages run fp32, CUDA graphs do not exist: "
                       "it checks the machinery, and none of these figures is a GPU figure")
    if "env" in docs:
        doc["env"] = docs["env"]
    tmp = Path(out + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    os.replace(tmp, out)
    ok = sum(1 for s in stages if s["status"] == "ok")
    bad = [s["stage"] for s in stages if s["status"] not in ("ok", "skipped")]
    print(f"[suite] {ok}/{len(stages)} stages ok" + (f"; not ok: {', '.join(bad)}" if bad else "") + f"; {seconds} s")
    for label, f in figures.items():
        v = f["value"]
        if isinstance(v, float):
            v = f"{v:,.4g}"
        elif isinstance(v, (dict, list)):
            v = "(table in the archive)"
        print(f"[suite]   {label}: {v if v is not None else 'UNMEASURED'}")
    for k, v in speedups.items():
        if k != "method":
            print(f"[suite]   speed-up {k}: {f'{v:.2f}x' if v else 'UNMEASURED'}")
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["env"] and len(argv) == 3:
        return env(argv[1], argv[2])
    if argv[:1] == ["summary"] and len(argv) in (6, 7):
        return summary(argv[1], argv[2], argv[3], int(argv[4]), int(argv[5]), argv[6] if len(argv) == 7 else "")
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
