"""Issue 6, item 3: the paper's budget experiment at the 6.25% point, in one command.

ELECTRA-Small pre-trained for 62,500 steps of 128 x 128 (paper-convention FLOPs = 62,500 x its per-step count) and
the MLM baseline (recipe bert-small: the same encoder trained as a masked LM) given the SAME paper-convention
FLOPs (a `...flops` budget), both on the same prepared data; then both final checkpoints fine-tuned on GLUE-5
(CoLA, SST-2, MRPC, STS-B, RTE) with the paper's protocol, medians over 3 seeds; then `tinyelectra report` on each
run and a comparison.

    python benchmarks/quality.py --data DATA --glue-dir GLUE [--device cuda]          # the experiment (a GPU, hours)
    python benchmarks/quality.py --data DATA --glue-dir GLUE --dry-run                # the plan only, nothing runs
    python benchmarks/quality.py --preset tiny --steps 2000 --data DATA --glue-dir GLUE \
        --tasks rte,mrpc,stsb,cola --seeds 3 --max-train-rows 2000                    # a CPU-scale demonstration
      -> benchmarks/results/quality-<device>.json and .md (or --out-dir / --name); runs in runs/quality-<device>/

Everything is resumable: a finished pre-training run is reused (same recipe and budget), an interrupted one is
resumed from its state, and `tinyelectra glue` reuses finished tasks; the result file is rewritten after every
stage (`"complete": false` until the end), so a run cut short still leaves what it measured.

What the numbers are, and are not:
- The result file says whether this was the paper's configuration (electra-small vs bert-small, 62,500 steps,
  GLUE-5, >= 3 seeds, full training sets) or a reduced-scale run, and lists every difference. A reduced-scale
  run is a demonstration of the machinery, not the 6.25% experiment.
- The paper's 74.1 at 6.25% is the 62.5k-step SNAPSHOT of a 1M-step run (learning rate not yet decayed), on
  Wikipedia + BooksCorpus, averaged over 8 GLUE tasks; this runs a separately scheduled 62.5k-step run (warm-up
  and decay to 0 within it) and averages GLUE-5. The paper gives BERT-Small only at the full budget (75.1 vs
  ELECTRA-Small's 79.9). All published numbers are stored labelled as such.
- `--synthetic-glue` replaces GLUE by two generated tasks in GLUE's file formats (for machines without GLUE data,
  e.g. the GPU suite and the tests); their scores say nothing about GLUE and the result file says so.

The stages call the library in this process (train_command, glue_command, report_command); the equivalent
`tinyelectra ...` command of each is recorded in the result file.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import shlex
import signal
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import torch  # noqa: E402
from common import RESULTS, ROOT, command_line, git_commit, run_main, write_result  # noqa: E402

from tinyelectra import paper  # noqa: E402
from tinyelectra.budget import make_plan, parse_budget  # noqa: E402
from tinyelectra.config import load_recipe  # noqa: E402
from tinyelectra.errors import UserError  # noqa: E402

PAPER_STEPS = 62_500  # 6.25% of ELECTRA-Small's 1M steps (Table 1)
GLUE5 = ("cola", "sst2", "mrpc", "stsb", "rte")
FINAL_CHECKPOINT = "ckpt-10000"  # the end of each run (its whole budget)
MLM_TINY_OVERRIDES = ("objective.kind=mlm", "objective.mask_token_fraction=0.8", "objective.random_token_fraction=0.1")
PRESETS = {  # (ELECTRA recipe, its overrides, MLM recipe, its overrides)
    "paper": ("electra-small", (), "bert-small", ()),
    # tiny-shaped ELECTRA against a tiny-shaped masked LM: one full-size (128-wide) encoder with BERT's 80/10/10
    "tiny": ("tiny", (), "tiny", MLM_TINY_OVERRIDES),
}
SIDES = ("electra", "mlm")


# ----------------------------------------------------------------------------------------------------------------
# The plan: two recipes, equal paper-convention FLOPs
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class Side:
    """One of the two pre-training runs: what it is, its budget and its plan."""

    label: str  # electra | mlm
    recipe_name: str
    overrides: list[str]
    recipe: object = None  # tinyelectra.config.Recipe
    budget: str = ""
    plan: object = None  # tinyelectra.budget.Plan
    run_dir: Path | None = None
    record: dict = field(default_factory=dict)  # what the result file says about this side


def flops_budget_text(total_flops: float) -> str:
    """A `...flops` budget that parses back to exactly `total_flops` (repr keeps every digit of the float)."""
    return f"{total_flops!r}flops"


def build_sides(args) -> tuple[Side, Side]:
    e_name, e_set, m_name, m_set = PRESETS[args.preset]
    e_name, m_name = args.electra_recipe or e_name, args.mlm_recipe or m_name
    if args.mlm_recipe:  # an explicitly named MLM recipe is taken as it is
        m_set = ()
    electra = Side("electra", e_name, [*e_set, *args.recipe_set, *args.electra_set])
    mlm = Side("mlm", m_name, [*m_set, *args.recipe_set, *args.mlm_set])
    for side in (electra, mlm):
        side.recipe = load_recipe(side.recipe_name, side.overrides)
    if electra.recipe.objective.kind != "electra":
        raise UserError(f"--electra-recipe {e_name}: its objective is {electra.recipe.objective.kind!r}, not electra")
    if mlm.recipe.objective.kind != "mlm":
        raise UserError(f"the MLM side ({m_name} with {' '.join(mlm.overrides) or 'no overrides'}) has objective "
                        f"{mlm.recipe.objective.kind!r}; use an MLM recipe (bert-small) or --mlm-set objective.kind=mlm")
    er, mr = electra.recipe, mlm.recipe
    if (er.train.seq_len, er.model.vocab_size) != (mr.train.seq_len, mr.model.vocab_size):
        raise UserError(f"the two recipes must read the same data: ELECTRA has T {er.train.seq_len} and V "
                        f"{er.model.vocab_size}, the MLM T {mr.train.seq_len} and V {mr.model.vocab_size}")
    if args.steps < 1:
        raise UserError("--steps must be at least 1")
    electra.budget = f"{args.steps}steps"
    electra.plan = make_plan(parse_budget(electra.budget), er)
    mlm.budget = flops_budget_text(electra.plan.train_flops_paper)
    mlm.plan = make_plan(parse_budget(mlm.budget), mr)  # the steps that fit in ELECTRA's FLOPs (rounded down)
    return electra, mlm


def scale_differences(args, electra: Side, mlm: Side, tasks: list[str]) -> list[str]:
    """Every way this run differs from the paper's 6.25% experiment; empty means it is that experiment."""
    diffs = []
    if electra.recipe_name != "electra-small":
        diffs.append(f"ELECTRA recipe {electra.recipe_name}, not electra-small")
    if mlm.recipe_name != "bert-small":
        diffs.append(f"MLM recipe {mlm.recipe_name}" + (f" with {' '.join(mlm.overrides)}" if mlm.overrides else "")
                     + ", not bert-small")
    for side in (electra, mlm):
        shaping = [o for o in side.overrides if o not in MLM_TINY_OVERRIDES and not o.startswith(("train.precision=", "train.compile="))]
        if shaping and side.recipe_name in ("electra-small", "bert-small"):
            diffs.append(f"{side.label} recipe overridden: {' '.join(shaping)}")
    if args.steps != PAPER_STEPS:
        diffs.append(f"{args.steps} ELECTRA steps, not {PAPER_STEPS:,}")
    if sorted(tasks) != sorted(GLUE5):
        diffs.append(f"GLUE tasks {','.join(tasks)}, not GLUE-5 ({','.join(GLUE5)})")
    if args.seeds < 3:
        diffs.append(f"{args.seeds} fine-tuning seed(s), not 3 or more")
    if args.max_train_rows:
        diffs.append(f"fine-tuned on the first {args.max_train_rows} training rows per task only")
    if args.glue_set:
        diffs.append(f"fine-tuning protocol changed: {' '.join(args.glue_set)}")
    if args.synthetic_glue:
        diffs.append("SYNTHETIC tasks in GLUE's file formats instead of GLUE")
    if args.data == "builtin":
        diffs.append("the built-in smoke-test corpus (Python's documentation) instead of a Wikipedia-scale corpus")
    return diffs


def known_throughput(device: torch.device, recipe_name: str, batch: int, seq_len: int) -> tuple[float, str] | None:
    """tinyelectra's tokens/s for this recipe and shape from a throughput result on this kind of device, if any."""
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    best = None
    for path in sorted(RESULTS.glob("**/throughput*.json")):
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if (doc.get("recipe"), doc.get("batch_size"), doc.get("seq_len"), doc.get("device")) != (recipe_name, batch, seq_len, device_name):
            continue
        tps = (doc.get("tinyelectra") or {}).get("tokens_per_s")
        if tps and (best is None or doc.get("date_utc", "") > best[2]):
            best = (float(tps), str(path.relative_to(ROOT)), doc.get("date_utc", ""))
    return None if best is None else best[:2]


def expected_train_seconds(electra: Side, mlm: Side, device: torch.device) -> dict:
    """Expected pre-training wall time from a measured throughput (ELECTRA side), the MLM side scaled by the
    hardware FLOPs per step; None where nothing was measured."""
    tr = electra.recipe.train
    found = known_throughput(device, electra.recipe_name, tr.batch_size, tr.seq_len)
    if found is None:
        return {"electra": None, "mlm": None, "source": "unknown: no throughput result for this recipe, shape and device "
                "in benchmarks/results (run benchmarks/throughput.py)"}
    tps, source = found
    e_seconds = electra.plan.expected_tokens / tps
    hw_ratio = mlm.plan.train_flops_hardware_per_step / electra.plan.train_flops_hardware_per_step
    m_seconds = mlm.plan.total_steps * hw_ratio * electra.plan.tokens_per_step / tps
    return {"electra": e_seconds, "mlm": m_seconds,
            "source": f"ELECTRA: {tps:,.0f} tokens/s measured in {source}; MLM: that rate scaled by the ratio of "
                      f"hardware FLOPs per step ({hw_ratio:.3f}), an estimate"}


def plan_record(side: Side) -> dict:
    p = side.plan
    return {"recipe": side.recipe_name, "overrides": side.overrides, "objective": side.recipe.objective.kind,
            "budget": side.budget, "steps": p.total_steps, "warmup_steps": p.warmup_steps,
            "batch_size": p.batch_size, "seq_len": p.seq_len, "tokens": p.expected_tokens,
            "train_flops_paper_per_step": p.train_flops_paper_per_step, "train_flops_paper": p.train_flops_paper,
            "train_flops_hardware_per_step": p.train_flops_hardware_per_step,
            "train_flops_hardware": p.train_flops_hardware}


def print_plan(electra: Side, mlm: Side, tasks: list[str], args, diffs: list[str], expected: dict) -> None:
    print("quality benchmark plan" + (" (the paper's 6.25% experiment)" if not diffs else " (REDUCED SCALE)"))
    for side in (electra, mlm):
        r = plan_record(side)
        secs = expected[side.label]
        print(f"  {side.label:8s} {side.recipe_name:14s} {r['steps']:>10,} steps  {r['tokens']:>15,} tokens  "
              f"{r['train_flops_paper']:.4e} FLOPs (paper)  {r['train_flops_hardware']:.4e} (hardware)  "
              f"warm-up {r['warmup_steps']:,}  expected {'unknown' if secs is None else f'{secs / 3600:.2f} h'}")
        if side.overrides:
            print(f"           --set {' --set '.join(side.overrides)}")
    ratio = mlm.plan.train_flops_paper / electra.plan.train_flops_paper
    print(f"  MLM / ELECTRA paper-convention FLOPs: {ratio:.6f} (the MLM's steps are rounded down)")
    print(f"  expected time: {expected['source']}")
    print(f"  GLUE: {','.join(tasks)} x {args.seeds} seed(s)"
          + (f", first {args.max_train_rows} training rows" if args.max_train_rows else "")
          + (" on SYNTHETIC tasks" if args.synthetic_glue else ""))
    for d in diffs:
        print(f"  differs from the paper: {d}")


# ----------------------------------------------------------------------------------------------------------------
# Synthetic tasks (no GLUE data on the machine): learnable only from the text, in GLUE's file formats
# ----------------------------------------------------------------------------------------------------------------

# filler, cue and noun words are disjoint: a label depends only on the words its rule looks at
_FILLER = ("the a of and to in is was it for on with as by at from this that house music film book year people "
           "water war game party").split()
_CUES = {1: ("good", "great", "best", "happy", "strong"), 0: ("bad", "poor", "worst", "sad", "weak")}
_NOUNS = ("river", "city", "king", "school", "team", "church", "road", "village", "army", "island", "museum", "bridge")


def write_synthetic_glue(glue_dir: Path, train_rows: int = 2000, dev_rows: int = 400, seed: int = 0) -> list[str]:
    """SST-2 format: the polarity of the one cue word is the label. RTE format: "entailment" when sentence 2's
    noun appears in sentence 1. Returns the task names written."""
    rng = random.Random(seed)

    def words(n: int) -> list[str]:
        return [rng.choice(_FILLER) for _ in range(n)]

    sst = glue_dir / "SST-2"
    sst.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", train_rows), ("dev", dev_rows)):
        lines = ["sentence\tlabel"]
        for i in range(n):
            y = i % 2
            w = words(rng.randint(4, 10))
            w.insert(rng.randrange(len(w) + 1), rng.choice(_CUES[y]))
            lines.append(f"{' '.join(w)}\t{y}")
        (sst / f"{split}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    rte = glue_dir / "RTE"
    rte.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", train_rows), ("dev", dev_rows)):
        lines = ["index\tsentence1\tsentence2\tlabel"]
        for i in range(n):
            present = rng.sample(_NOUNS, 3)
            entail = i % 2 == 0
            noun = rng.choice(present) if entail else rng.choice([x for x in _NOUNS if x not in present])
            s1 = words(rng.randint(3, 6)) + present
            rng.shuffle(s1)
            s2 = words(rng.randint(2, 4)) + [noun]
            rng.shuffle(s2)
            lines.append(f"{i}\t{' '.join(s1)}\t{' '.join(s2)}\t{'entailment' if entail else 'not_entailment'}")
        (rte / f"{split}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return ["sst2", "rte"]


# ----------------------------------------------------------------------------------------------------------------
# Running one side: pre-train (or reuse / resume), fine-tune, report
# ----------------------------------------------------------------------------------------------------------------


def _cli(*parts: str) -> str:
    return "tinyelectra " + " ".join(shlex.quote(p) for p in parts)


def _set_args(overrides: list[str]) -> list[str]:
    return [x for o in overrides for x in ("--set", o)]


def train_args(side: Side, data: str, device: torch.device) -> list[str]:
    args = ["train", "--recipe", side.recipe_name, "--budget", side.budget, "--device", str(device),
            "--out", str(side.run_dir), *_set_args(side.overrides)]
    return args if data == "builtin" else [*args, "--data", data]


def training_state(side: Side) -> str:
    """finished (same recipe and budget) | resume | fresh; a UserError when the directory holds another run."""
    run = side.run_dir
    if not (run / "plan.json").is_file():
        return "fresh"
    saved_recipe = json.loads((run / "recipe.json").read_text()) if (run / "recipe.json").is_file() else {}
    saved_budget = json.loads((run / "plan.json").read_text()).get("budget")
    now = json.loads(json.dumps(side.recipe.to_dict()))
    saved_recipe.pop("deviations", None), now.pop("deviations", None)  # the trainer adds the --set changes to its copy
    if saved_recipe != now or saved_budget != side.budget:
        raise UserError(f"{run} holds another run (recipe or budget {saved_budget} differ from this plan's "
                        f"{side.budget}); choose another --work-dir or remove it")
    if (run / "summary.json").is_file() and (run / FINAL_CHECKPOINT).is_dir():
        return "finished"
    if (run / "state" / "LATEST").exists():
        return "resume"
    raise UserError(f"{run} holds a run that stopped before its first resume state; remove it to start again")


def pretrain(side: Side, data: str, device: torch.device) -> dict:
    from tinyelectra.train import train_command

    state = training_state(side)
    args = train_args(side, data, device)
    info = {"command": _cli(*args, *(["--resume"] if state == "resume" else [])), "state_before": state}
    if state == "finished":
        print(f"{side.label}: reusing the finished run in {side.run_dir}")
        return info
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}  # the trainer installs its own
    t0 = time.perf_counter()
    try:
        train_command(budget=side.budget, data_dir=None if data == "builtin" else Path(data), corpus=None,
                      recipe_name=side.recipe_name, gpu=None, device=str(device), out_dir=side.run_dir,
                      resume=state == "resume", overrides=list(side.overrides), command=info["command"])
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
    info["stage_wall_seconds"] = time.perf_counter() - t0
    return info


def finetune(side: Side, glue_dir: Path, tasks: list[str], seeds: int, max_train_rows: int | None,
             glue_set: list[str], device: torch.device) -> dict:
    from tinyelectra.glue import glue_command

    overrides = ["test_predictions=false", *glue_set]  # dev scores only: no submission files
    ckpt = side.run_dir / FINAL_CHECKPOINT
    args = ["glue", "--checkpoint", str(ckpt), "--glue-dir", str(glue_dir), "--tasks", ",".join(tasks),
            "--seeds", str(seeds), "--device", str(device), *_set_args(overrides)]
    if max_train_rows:
        args += ["--max-train-rows", str(max_train_rows)]
    t0 = time.perf_counter()
    (path,) = glue_command(checkpoint=ckpt, glue_dir=glue_dir, use_hf=False, tasks=",".join(tasks), seeds=seeds,
                           out_dir=None, gpu=None, device=str(device), max_train_rows=max_train_rows,
                           overrides=overrides, command=_cli(*args))
    return {"command": _cli(*args), "glue_json": str(path), "stage_wall_seconds": time.perf_counter() - t0}


def report(side: Side) -> dict:
    from tinyelectra.report import report_command

    try:
        report_command(side.run_dir, None)
        return {"command": _cli("report", str(side.run_dir)), "report_md": str(side.run_dir / "report.md")}
    except Exception as e:  # noqa: BLE001 - a report that cannot render must not lose the measured numbers
        return {"command": _cli("report", str(side.run_dir)), "error": f"{type(e).__name__}: {e}"}


# ----------------------------------------------------------------------------------------------------------------
# Reading what the stages wrote, and the comparison
# ----------------------------------------------------------------------------------------------------------------


def pretraining_facts(side: Side, data_train_tokens: int | None) -> dict:
    run = side.run_dir
    s = json.loads((run / "summary.json").read_text())
    meta_path = run / FINAL_CHECKPOINT / "meta.json"
    ev = json.loads(meta_path.read_text()).get("eval", {}) if meta_path.is_file() else {}
    excluded = s.get("excluded_seconds") or {}
    out = {"steps": s["steps"], "tokens_seen": s["tokens_seen"], "train_flops_paper": s["train_flops_paper"],
           "train_flops_hardware": s["train_flops_hardware"], "train_seconds": s["train_seconds"],
           "excluded_seconds": excluded, "precision": s["precision"], "device": s["device"],
           "parameters": s["parameters"], "held_out_eval_at_end": ev,
           "epochs_over_data": None if not data_train_tokens else s["tokens_seen"] / data_train_tokens}
    if s.get("steps") and s["train_seconds"]:
        out["tokens_per_second"] = s["tokens_seen"] / s["train_seconds"]
    return out


def glue_facts(glue_json: Path) -> dict:
    g = json.loads(Path(glue_json).read_text())
    tasks = {}
    for t, e in g["tasks"].items():
        tasks[t] = {"metric": e["paper_metric"], "median": e["median_paper"], "std": e["std_paper"],
                    "seeds": [s["paper_score"] for s in e["seeds"]], "train_rows": e["train_rows"], "steps": e["steps"],
                    "seconds": sum(s["train_seconds"] + s["eval_seconds"] for s in e["seeds"])}
    avg = (g.get("averages") or {}).get("paper")
    # each seed's average over the tasks: its spread says how much of a gap fine-tuning noise alone can make
    n_seeds = min((len(v["seeds"]) for v in tasks.values()), default=0)
    per_seed = [statistics.fmean(v["seeds"][k] for v in tasks.values()) for k in range(n_seeds)]
    return {"tasks": tasks, "average": None if avg is None else avg["score"], "average_label": None if avg is None else avg["label"],
            "per_seed_averages": per_seed,
            "per_seed_average_std": statistics.stdev(per_seed) if len(per_seed) > 1 else None,
            "device": g["device"], "precision": g["precision"], "complete": g.get("complete", False),
            "seconds_total": g.get("seconds_total")}


def comparison(electra_glue: dict, mlm_glue: dict) -> dict:
    common_tasks = [t for t in electra_glue["tasks"] if t in mlm_glue["tasks"]]
    per_task = {t: electra_glue["tasks"][t]["median"] - mlm_glue["tasks"][t]["median"] for t in common_tasks}
    gap = None
    if electra_glue["average"] is not None and mlm_glue["average"] is not None:
        gap = electra_glue["average"] - mlm_glue["average"]
    return {"average_gap_electra_minus_mlm": gap, "per_task_gap_electra_minus_mlm": per_task,
            "electra_better_on": sorted(t for t, g in per_task.items() if g > 0),
            "mlm_better_on": sorted(t for t, g in per_task.items() if g < 0)}


def paper_reference(tasks: list[str]) -> dict:
    """The published numbers this experiment is read against, from tinyelectra.paper, labelled as such."""
    row = paper.table1_by_fraction()[0.0625]
    covered = [t for t in tasks if t in paper.PAPER_TASKS]
    return {
        "label": "PUBLISHED numbers (Clark et al. 2020 and the official README), not measured here; 8-task GLUE dev "
                 "averages unless said",
        "electra_small_6.25pct": {"glue_dev_8_tasks": row.glue_dev, "steps": row.steps,
                                  "train_flops_paper": row.train_flops_paper, "v100_time": row.v100_time,
                                  "note": "the 62.5k-step snapshot of a 1M-step run (learning rate not decayed); "
                                          "Wikipedia + BooksCorpus; FLOPs counted with generator hidden 128",
                                  "source": row.source},
        "electra_small_full": {"glue_dev_8_tasks": paper.table1_by_fraction()[1.0].glue_dev, "train_flops_paper": 1.4e18},
        "bert_small_full": {"glue_dev_8_tasks": paper.BERT_SMALL["glue_dev"], "train_flops_paper": paper.BERT_SMALL["train_flops_paper"],
                            "note": "same compute as the full ELECTRA-Small run; the paper gives no BERT-Small at 6.25%"},
        "full_budget_gap": paper.table1_by_fraction()[1.0].glue_dev - paper.BERT_SMALL["glue_dev"],
        "per_task_electra_small_owt_1M": {
            "scores": {t: paper.PER_TASK[0].scores[t] for t in covered},
            "average_over_these_tasks": statistics.fmean(paper.PER_TASK[0].scores[t] for t in covered) if covered else None,
            "source": paper.PER_TASK[0].source},
    }


# ----------------------------------------------------------------------------------------------------------------
# The comparison markdown
# ----------------------------------------------------------------------------------------------------------------


def _f(x, fmt="{:.1f}") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else fmt.format(x)


def _dur(seconds) -> str:
    if seconds is None:
        return "-"
    return f"{seconds:.0f} s" if seconds < 120 else (f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.2f} h")


def render_markdown(doc: dict) -> str:
    e, m = doc["runs"]["electra"], doc["runs"]["mlm"]
    lines = [f"# ELECTRA vs MLM at equal pre-training FLOPs ({doc['device']})", ""]
    if doc["experiment"]["is_paper_configuration"]:
        lines += ["The paper's 6.25% budget experiment (Clark et al. 2020, Table 1 point), as configured here.", ""]
    else:
        lines += ["**REDUCED SCALE: a demonstration of the machinery, NOT the paper's 6.25% experiment.** Differences:", ""]
        lines += [f"- {d}" for d in doc["experiment"]["differences"]] + [""]
    for c in doc["experiment"].get("caveats") or []:
        lines += [f"Caveat: {c}.", ""]
    lines += [f"Equal compute: the MLM's paper-convention training FLOPs are "
              f"{doc['experiment']['mlm_over_electra_train_flops_paper']:.5f} x ELECTRA's (its step count rounded down).", ""]
    if doc.get("note"):
        lines += [doc["note"], ""]
    lines += ["## Pre-training", "", "| | ELECTRA | MLM |", "|---|---|---|"]

    def row(name, key, fmt):
        pe, pm = e.get("pretraining") or {}, m.get("pretraining") or {}
        lines.append(f"| {name} | {fmt(pe.get(key))} | {fmt(pm.get(key))} |")

    lines.append(f"| recipe | {e['plan']['recipe']} {' '.join(e['plan']['overrides'])} | {m['plan']['recipe']} "
                 f"{' '.join(m['plan']['overrides'])} |")
    lines.append(f"| budget | {e['plan']['budget']} | {m['plan']['budget']} |")
    row("steps", "steps", lambda x: _f(x, "{:,}"))
    row("tokens seen", "tokens_seen", lambda x: _f(x, "{:,}"))
    row("train FLOPs, paper convention", "train_flops_paper", lambda x: _f(x, "{:.4e}"))
    row("train FLOPs, hardware convention", "train_flops_hardware", lambda x: _f(x, "{:.4e}"))
    row("training time", "train_seconds", _dur)
    row("tokens/s", "tokens_per_second", lambda x: _f(x, "{:,.0f}"))
    row("epochs over the data", "epochs_over_data", lambda x: _f(x, "{:.2f}"))
    row("precision", "precision", str)
    row("parameters", "parameters", lambda x: _f(x, "{:,}"))
    ev_e = (e.get("pretraining") or {}).get("held_out_eval_at_end") or {}
    ev_m = (m.get("pretraining") or {}).get("held_out_eval_at_end") or {}
    lines.append(f"| held-out MLM accuracy at the end | {_f(ev_e.get('gen_acc'), '{:.3f}')} | {_f(ev_m.get('gen_acc'), '{:.3f}')} |")
    lines.append(f"| held-out discriminator accuracy (all-original baseline) | {_f(ev_e.get('disc_acc'), '{:.4f}')} "
                 f"({_f(ev_e.get('baseline_acc'), '{:.4f}')}) | - |")
    lines += ["", f"Device: {(e.get('pretraining') or {}).get('device', '-')}.", ""]

    eg, mg = e.get("glue"), m.get("glue")
    if eg and mg:
        syn = " (SYNTHETIC tasks, not GLUE)" if doc["glue"]["synthetic"] else ""
        lines += [f"## Fine-tuning{syn}: median ± std over {doc['glue']['seeds']} seed(s)", "",
                  "| task | metric | ELECTRA | MLM | gap |", "|---|---|---|---|---|"]
        for t in doc["glue"]["tasks"]:
            te, tm = eg["tasks"].get(t), mg["tasks"].get(t)
            if te is None or tm is None:
                continue
            lines.append(f"| {t} | {te['metric']} | {_f(te['median'])} ± {_f(te['std'])} | {_f(tm['median'])} ± "
                         f"{_f(tm['std'])} | {_f(te['median'] - tm['median'], '{:+.1f}')} |")
        c = doc["comparison"]
        lines.append(f"| **average** | | **{_f(eg['average'])}** | **{_f(mg['average'])}** | "
                     f"**{_f(c['average_gap_electra_minus_mlm'], '{:+.1f}')}** |")
        lines += ["", f"Spread of the per-seed averages (std): ELECTRA {_f(eg['per_seed_average_std'], '{:.2f}')}, "
                      f"MLM {_f(mg['per_seed_average_std'], '{:.2f}')}.", ""]
    p = doc["paper_reference"]
    lines += ["## Published reference (not measured here)", "",
              f"- ELECTRA-Small at 6.25% (62.5k steps, {p['electra_small_6.25pct']['train_flops_paper']:.1e} FLOPs): "
              f"GLUE dev {p['electra_small_6.25pct']['glue_dev_8_tasks']} (8 tasks; {p['electra_small_6.25pct']['note']}).",
              f"- Full budget (1.4e18 FLOPs): ELECTRA-Small {p['electra_small_full']['glue_dev_8_tasks']} vs BERT-Small "
              f"{p['bert_small_full']['glue_dev_8_tasks']} (gap {p['full_budget_gap']:+.1f}).",
              f"- ELECTRA-Small (OpenWebText, 1M steps) averaged over the tasks run here: "
              f"{_f(p['per_task_electra_small_owt_1M']['average_over_these_tasks'])}.", ""]
    lines += ["## Files", ""]
    for label, r in (("ELECTRA", e), ("MLM", m)):
        lines.append(f"- {label}: run `{r['run_dir']}`" + (f", report `{r['report']['report_md']}`"
                                                           if (r.get("report") or {}).get("report_md") else ""))
    lines += ["", f"Command: `{doc['command']}`",
              f"Commit: {doc.get('git_commit_at_start', doc['git_commit'])} at the start; {doc['git_commit']} when written", ""]
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------------------------
# The command
# ----------------------------------------------------------------------------------------------------------------


def device_slug(device: torch.device) -> str:
    if device.type != "cuda":
        return device.type
    return re.sub(r"[^a-z0-9]+", "-", torch.cuda.get_device_name(device).lower()).strip("-")


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="builtin", help="a directory written by `tinyelectra prepare` (the enwiki data), "
                    "or 'builtin' (the offline smoke-test corpus, prepared for the recipes' vocabulary)")
    ap.add_argument("--glue-dir", default=None, help="the classic glue_data directory")
    ap.add_argument("--synthetic-glue", action="store_true", help="generated tasks in GLUE formats instead of GLUE "
                    "(for machines without GLUE data; the result says so)")
    ap.add_argument("--preset", default="paper", choices=sorted(PRESETS), help="paper: electra-small vs bert-small; "
                    "tiny: the tiny recipe vs the tiny recipe as a masked LM (" + " ".join(MLM_TINY_OVERRIDES) + ")")
    ap.add_argument("--electra-recipe", default=None, help="overrides the preset's ELECTRA recipe")
    ap.add_argument("--mlm-recipe", default=None, help="overrides the preset's MLM recipe (used as it is)")
    ap.add_argument("--steps", type=int, default=PAPER_STEPS, help="ELECTRA steps; the MLM gets the same paper FLOPs")
    ap.add_argument("--recipe-set", action="append", default=[], metavar="KEY=VALUE", help="recipe override for both runs")
    ap.add_argument("--electra-set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--mlm-set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--tasks", default=",".join(GLUE5))
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--max-train-rows", type=int, default=None, help="fine-tune on the first N training rows per task")
    ap.add_argument("--glue-set", action="append", default=[], metavar="KEY=VALUE", help="`tinyelectra glue --set`")
    ap.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: a GPU if there is one)")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    ap.add_argument("--work-dir", default=None, help="where the two runs go (default runs/quality-<device>)")
    ap.add_argument("--out-dir", default=None, help="result directory (default benchmarks/results)")
    ap.add_argument("--name", default=None, help="result file name (default quality-<device>)")
    ap.add_argument("--note", default=None, help="a sentence stored in the result and shown in the markdown")
    ap.add_argument("--dry-run", action="store_true", help="print the plan and exit; nothing runs or is written")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    from tinyelectra import runtime

    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = runtime.pick_device(None, args.device)
    electra, mlm = build_sides(args)
    if args.seeds < 1:
        raise UserError("--seeds must be at least 1")
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    if args.synthetic_glue:
        tasks = [t for t in tasks if t in ("sst2", "rte")] or ["sst2", "rte"]
    slug = device_slug(device)
    work = Path(args.work_dir) if args.work_dir else ROOT / "runs" / f"quality-{slug}"
    electra.run_dir, mlm.run_dir = work / "electra", work / "mlm"
    diffs = scale_differences(args, electra, mlm, tasks)
    expected = expected_train_seconds(electra, mlm, device)
    print_plan(electra, mlm, tasks, args, diffs, expected)
    plan_doc = {"electra": plan_record(electra), "mlm": plan_record(mlm), "expected_train_seconds": expected}
    if args.dry_run:
        return {"dry_run": True, **plan_doc, "differences": diffs}

    glue_dir = Path(args.glue_dir) if args.glue_dir else None
    if args.synthetic_glue:
        glue_dir = work / "glue-synthetic"
        write_synthetic_glue(glue_dir)
    elif glue_dir is None or not glue_dir.is_dir():
        raise UserError(f"--glue-dir {glue_dir}: not a directory (the classic glue_data folders), or use --synthetic-glue")
    from tinyelectra.glue import read_task

    for task in tasks:  # fail now, not after hours of pre-training
        read_task(task, glue_dir, args.max_train_rows, False)
    data_train_tokens = None
    if args.data != "builtin":
        manifest = Path(args.data) / "manifest.json"
        if not manifest.is_file():
            raise UserError(f"--data {args.data}: no manifest.json (prepare it with `tinyelectra prepare`)")
        data_train_tokens = json.loads(manifest.read_text())["tokens"]["train"]

    caveats = []
    if data_train_tokens:
        epochs = max(electra.plan.expected_tokens, mlm.plan.expected_tokens) / data_train_tokens
        if epochs > 1:
            caveats.append(f"the data holds {data_train_tokens:,} training tokens: the runs go over it up to "
                           f"{epochs:.1f} times (the paper's 6.25% point saw about 1.0B tokens of a 3.3B-token corpus, "
                           "a third of one pass)")
    flops_ratio = mlm.plan.train_flops_paper / electra.plan.train_flops_paper
    name = args.name or f"quality-{slug}"
    out_dir = Path(args.out_dir) if args.out_dir else RESULTS
    started = time.perf_counter()
    doc: dict = {
        "experiment": {"is_paper_configuration": not diffs, "differences": diffs,
                       "kind": "the paper's 6.25% experiment" if not diffs else
                               "REDUCED-SCALE demonstration, not the paper's 6.25% experiment",
                       "schedule": "each run is scheduled over its own budget (warm-up, then linear decay to 0 at its "
                                   "end); the paper's 6.25% row is a snapshot of a 1M-step run",
                       "caveats": caveats,
                       "mlm_over_electra_train_flops_paper": flops_ratio},
        "note": args.note, "device": slug, "torch_device": str(device),
        # the code that ran; "git_commit" beside it is HEAD when the file was (re)written, hours later at full scale
        "git_commit_at_start": git_commit(),
        "data": {"path": args.data, "train_tokens": data_train_tokens},
        "glue": {"dir": str(glue_dir), "synthetic": args.synthetic_glue, "tasks": tasks, "seeds": args.seeds,
                 "max_train_rows": args.max_train_rows, "settings": args.glue_set,
                 "protocol": "tinyelectra glue (paper protocol), dev sets, median over seeds; final checkpoint of each run"},
        "precision": None, "paper_reference": paper_reference(tasks),
        "runs": {s.label: {"plan": plan_record(s), "run_dir": str(s.run_dir)} for s in (electra, mlm)},
        "expected_train_seconds": expected, "comparison": None, "complete": False,
    }
    command = command_line("benchmarks/quality.py", argv)

    def save() -> Path:
        doc["wall_seconds_this_invocation"] = time.perf_counter() - started
        if all(doc["runs"][s].get("glue") for s in SIDES):
            doc["comparison"] = comparison(doc["runs"]["electra"]["glue"], doc["runs"]["mlm"]["glue"])
        path = write_result(name, doc, device, out_dir=out_dir, command=command)
        md = path.with_suffix(".md")  # rendered from the result file alone
        tmp = md.with_name(md.name + ".tmp")
        tmp.write_text(render_markdown(json.loads(path.read_text())), encoding="utf-8")
        os.replace(tmp, md)
        return path

    for side in (electra, mlm):  # pre-train both first: a GLUE failure never costs a pre-training run
        doc["runs"][side.label]["train"] = pretrain(side, args.data, device)
        doc["runs"][side.label]["pretraining"] = pretraining_facts(side, data_train_tokens)
        save()
    doc["precision"] = {s.label: doc["runs"][s.label]["pretraining"]["precision"] for s in (electra, mlm)}
    for side in (electra, mlm):
        info = finetune(side, glue_dir, tasks, args.seeds, args.max_train_rows, args.glue_set, device)
        doc["runs"][side.label]["finetune"] = info
        doc["runs"][side.label]["glue"] = glue_facts(Path(info["glue_json"]))
        doc["precision"][f"{side.label}_finetune"] = doc["runs"][side.label]["glue"]["precision"]
        save()
    for side in (electra, mlm):
        doc["runs"][side.label]["report"] = report(side)
    doc["complete"] = True
    path = save()
    c = doc["comparison"]
    print(f"GLUE average ({len(tasks)} task(s), median of {args.seeds} seed(s)): ELECTRA "
          f"{_f(doc['runs']['electra']['glue']['average'])} vs MLM {_f(doc['runs']['mlm']['glue']['average'])} "
          f"(gap {_f(c['average_gap_electra_minus_mlm'], '{:+.1f}')}) -> {path} and {path.with_suffix('.md')}")
    return doc


if __name__ == "__main__":
    run_main(main)
