"""Issue 9: ELECTRA against the masked-LM baseline at equal compute, with a no-pre-training control, in one command.

Arms (each fine-tuned on the same GLUE tasks with the same protocol and seeds; medians and spreads reported):
- electra:     the ELECTRA recipe pre-trained for --steps steps;
- mlm:         the same encoder pre-trained as a masked LM (BERT's 80/10/10), given the same HARDWARE FLOPs (the
               matmuls actually executed: sparse embedding look-ups, backward = 2 x forward; the most steps that fit);
- mlm-paper:   the same masked LM given the same PAPER-convention FLOPs (the official counting script: dense one-hot
               embedding look-ups, backward = forward), so both conventions are on the table;
- random-init: no pre-training at all: the ELECTRA run's own initial weights, fine-tuned the same way (the control
               every pre-trained encoder must beat).

Presets: `paper` (electra-small vs bert-small, 62,500 steps: the paper's 6.25% point; a GPU), `cpu` (the `mini`
recipe against itself as a masked LM: what this project's 2-core CPU runs in hours), `tiny` (tests, smoke runs).

    python benchmarks/quality.py --preset cpu --data data/enwiki-v8k --glue-dir ../shared/data/glue --steps 6000 \
        --glue-set batching=length --glue-set precision=bf16 --threads 1          # the CPU experiment (hours)
    python benchmarks/quality.py --data DATA --glue-dir GLUE --device cuda     # the paper's 6.25% point (a GPU)
    python benchmarks/quality.py ... --dry-run                                 # the plan only; nothing runs
    python benchmarks/quality.py ... --arms mlm,mlm-paper                      # this process runs these arms only
      -> benchmarks/results/quality-<device>.json and .md (or --out-dir / --name); runs in runs/quality-<device>/<arm>/

Resumable and shareable: a finished pre-training run is reused (same recipe and budget), an interrupted one resumed
from its state, `tinyelectra glue` reuses finished tasks. The result file is assembled from what is on disk (every
arm's run, its GLUE results and a small stage record), so several processes may each run some `--arms` in parallel
(one CPU thread each is the efficient way on a small CPU) and every write shows all arms so far (`"complete":
false` until every arm has its GLUE results).

What the numbers are, and are not:
- The result file says whether this was the paper's configuration (electra-small vs bert-small, 62,500 steps,
  GLUE-5, >= 3 seeds, full training sets) or a reduced-scale run, and lists every difference.
- The paper's 74.1 at 6.25% is the 62.5k-step SNAPSHOT of a 1M-step run (learning rate not yet decayed), on
  Wikipedia + BooksCorpus, averaged over 8 GLUE tasks; this runs separately scheduled runs (warm-up and decay to 0
  within each) and averages the tasks it runs. The paper gives BERT-Small only at the full budget (75.1 vs 79.9).
- `--synthetic-glue` replaces GLUE by two generated tasks in GLUE's file formats (machines without GLUE data, e.g.
  the GPU suite and the tests); their scores say nothing about GLUE and the result file says so.

The stages call the library in this process (train_command, glue_command, report_command); the equivalent
`tinyelectra ...` command of each is recorded in the result file.
"""

from __future__ import annotations

import argparse
import itertools
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
from dataclasses import dataclass
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
CONTROL_CHECKPOINT = "ckpt-0"  # the random-init arm's "checkpoint": the initial weights
MLM_OVERRIDES = ("objective.kind=mlm", "objective.mask_token_fraction=0.8", "objective.random_token_fraction=0.1")
PRESETS = {  # (ELECTRA recipe, its overrides, MLM recipe, its overrides)
    "paper": ("electra-small", (), "bert-small", ()),
    # mini (6 x 128, CPU-scale) against the same encoder as a masked LM: one full-size encoder with BERT's 80/10/10
    "cpu": ("mini", (), "mini", MLM_OVERRIDES),
    "tiny": ("tiny", (), "tiny", MLM_OVERRIDES),
}
ARMS = ("electra", "mlm", "mlm-paper", "random-init")
PRETRAINED = ("electra", "mlm", "mlm-paper")
STAGE_FILE = "quality-stages.json"  # per arm: the commands that ran, their wall time, who ran them


# ----------------------------------------------------------------------------------------------------------------
# The plan: the arms and their equal compute
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class Arm:
    """One arm: what it is, its budget and plan, where its files go."""

    label: str  # electra | mlm | mlm-paper | random-init
    recipe_name: str
    overrides: list[str]
    recipe: object = None  # tinyelectra.config.Recipe
    budget: str = ""  # "" for random-init (nothing is trained)
    plan: object = None  # tinyelectra.budget.Plan (None for random-init)
    matched: str | None = None  # mlm arms: the FLOP convention in which they equal ELECTRA
    run_dir: Path | None = None

    @property
    def checkpoint(self) -> Path:
        return self.run_dir / (CONTROL_CHECKPOINT if self.label == "random-init" else FINAL_CHECKPOINT)


def flops_budget_text(total_flops: float) -> str:
    """A `...flops` budget that parses back to exactly `total_flops` (repr keeps every digit of the float)."""
    return f"{total_flops!r}flops"


def build_arms(args) -> dict[str, Arm]:
    e_name, e_set, m_name, m_set = PRESETS[args.preset]
    e_name, m_name = args.electra_recipe or e_name, args.mlm_recipe or m_name
    if args.mlm_recipe:  # an explicitly named MLM recipe is taken as it is
        m_set = ()
    electra = Arm("electra", e_name, [*e_set, *args.recipe_set, *args.electra_set])
    electra.recipe = load_recipe(electra.recipe_name, electra.overrides)
    mlm_overrides = [*m_set, *args.recipe_set, *args.mlm_set]
    mlm_recipe = load_recipe(m_name, mlm_overrides)
    if electra.recipe.objective.kind != "electra":
        raise UserError(f"--electra-recipe {e_name}: its objective is {electra.recipe.objective.kind!r}, not electra")
    if mlm_recipe.objective.kind != "mlm":
        raise UserError(f"the MLM arm ({m_name} with {' '.join(mlm_overrides) or 'no overrides'}) has objective "
                        f"{mlm_recipe.objective.kind!r}; use an MLM recipe (bert-small) or --mlm-set objective.kind=mlm")
    er, mr = electra.recipe, mlm_recipe
    if (er.train.seq_len, er.model.vocab_size) != (mr.train.seq_len, mr.model.vocab_size):
        raise UserError(f"the two recipes must read the same data: ELECTRA has T {er.train.seq_len} and V "
                        f"{er.model.vocab_size}, the MLM T {mr.train.seq_len} and V {mr.model.vocab_size}")
    if args.steps < 1:
        raise UserError("--steps must be at least 1")
    electra.budget = f"{args.steps}steps"
    electra.plan = make_plan(parse_budget(electra.budget), er)
    arms = {"electra": electra}
    # equal hardware FLOPs: the most MLM steps whose matmul FLOPs fit in ELECTRA's (a steps budget)
    probe = make_plan(parse_budget("1steps"), mr)
    hw_steps = int(electra.plan.train_flops_hardware // probe.train_flops_hardware_per_step)
    if hw_steps < 1:
        raise UserError("the MLM arm cannot run one step within ELECTRA's hardware FLOPs; give more --steps")
    arms["mlm"] = Arm("mlm", m_name, list(mlm_overrides), mr, f"{hw_steps}steps", matched="hardware")
    # equal paper-convention FLOPs: a `...flops` budget (the trainer rounds down to whole steps)
    arms["mlm-paper"] = Arm("mlm-paper", m_name, list(mlm_overrides), mr, flops_budget_text(electra.plan.train_flops_paper),
                            matched="paper")
    for arm in arms.values():
        if arm.plan is None:
            arm.plan = make_plan(parse_budget(arm.budget), arm.recipe)
    arms["random-init"] = Arm("random-init", e_name, list(electra.overrides), er)
    return arms


def scale_differences(args, arms: dict[str, Arm], tasks: list[str]) -> list[str]:
    """Every way this run differs from the paper's 6.25% experiment; empty means it is that experiment."""
    diffs = []
    electra, mlm = arms["electra"], arms["mlm"]
    if electra.recipe_name != "electra-small":
        diffs.append(f"ELECTRA recipe {electra.recipe_name}, not electra-small")
    if mlm.recipe_name != "bert-small":
        diffs.append(f"MLM recipe {mlm.recipe_name}" + (f" with {' '.join(mlm.overrides)}" if mlm.overrides else "")
                     + ", not bert-small")
    for arm in (electra, mlm):
        shaping = [o for o in arm.overrides if o not in MLM_OVERRIDES and not o.startswith(("train.precision=", "train.compile="))]
        if shaping and arm.recipe_name in ("electra-small", "bert-small"):
            diffs.append(f"{arm.label} recipe overridden: {' '.join(shaping)}")
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


def expected_train_seconds(arms: dict[str, Arm], device: torch.device) -> dict:
    """Expected pre-training wall time from a measured throughput (ELECTRA), the MLM arms scaled by the hardware
    FLOPs per step; None where nothing was measured."""
    electra = arms["electra"]
    tr = electra.recipe.train
    found = known_throughput(device, electra.recipe_name, tr.batch_size, tr.seq_len)
    out: dict = {label: None for label in PRETRAINED}
    if found is None:
        out["source"] = ("unknown: no throughput result for this recipe, shape and device in benchmarks/results "
                         "(run benchmarks/throughput.py)")
        return out
    tps, source = found
    out["electra"] = electra.plan.expected_tokens / tps
    for label in ("mlm", "mlm-paper"):
        p = arms[label].plan
        out[label] = p.total_steps * p.train_flops_hardware_per_step / electra.plan.train_flops_hardware_per_step * electra.plan.tokens_per_step / tps
    out["source"] = (f"ELECTRA: {tps:,.0f} tokens/s measured in {source}; MLM: that rate scaled by the ratio of hardware "
                     "FLOPs per step, an estimate")
    return out


def plan_record(arm: Arm) -> dict:
    if arm.plan is None:
        return {"recipe": arm.recipe_name, "overrides": arm.overrides, "objective": "none (no pre-training)",
                "budget": "none", "steps": 0, "tokens": 0, "train_flops_paper": 0.0, "train_flops_hardware": 0.0,
                "note": "the ELECTRA run's initial weights (same seed, same initialisation), fine-tuned directly"}
    p = arm.plan
    return {"recipe": arm.recipe_name, "overrides": arm.overrides, "objective": arm.recipe.objective.kind,
            "budget": arm.budget, "matched_convention": arm.matched, "steps": p.total_steps,
            "warmup_steps": p.warmup_steps, "batch_size": p.batch_size, "seq_len": p.seq_len, "tokens": p.expected_tokens,
            "train_flops_paper_per_step": p.train_flops_paper_per_step, "train_flops_paper": p.train_flops_paper,
            "train_flops_hardware_per_step": p.train_flops_hardware_per_step,
            "train_flops_hardware": p.train_flops_hardware}


def print_plan(arms: dict[str, Arm], run: list[str], tasks: list[str], args, diffs: list[str], expected: dict) -> None:
    print("quality benchmark plan" + (" (the paper's 6.25% experiment)" if not diffs else " (REDUCED SCALE)"))
    e = arms["electra"].plan
    for label, arm in arms.items():
        r = plan_record(arm)
        if arm.plan is None:
            print(f"  {label:11s} no pre-training: the ELECTRA run's initial weights" + ("" if label in run else "  (not run here)"))
            continue
        secs = expected.get(label)
        ratios = (f"  = {r['train_flops_hardware'] / e.train_flops_hardware:.4f} x ELECTRA's hardware FLOPs, "
                  f"{r['train_flops_paper'] / e.train_flops_paper:.4f} x its paper FLOPs") if label != "electra" else ""
        print(f"  {label:11s} {arm.recipe_name:13s} {r['steps']:>10,} steps {r['tokens']:>14,} tokens  "
              f"{r['train_flops_paper']:.4e} FLOPs (paper)  {r['train_flops_hardware']:.4e} (hardware)  "
              f"warm-up {r['warmup_steps']:,}  expected {'unknown' if secs is None else f'{secs / 3600:.2f} h'}{ratios}"
              + ("" if label in run else "  (not run here)"))
        if arm.overrides:
            print(f"              --set {' --set '.join(arm.overrides)}")
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
# Running one arm: pre-train (or reuse / resume) or write the initial weights, fine-tune, report
# ----------------------------------------------------------------------------------------------------------------


def _cli(*parts: str) -> str:
    return "tinyelectra " + " ".join(shlex.quote(p) for p in parts)


def _set_args(overrides: list[str]) -> list[str]:
    return [x for o in overrides for x in ("--set", o)]


def train_args(arm: Arm, data: str, device: torch.device) -> list[str]:
    args = ["train", "--recipe", arm.recipe_name, "--budget", arm.budget, "--device", str(device),
            "--out", str(arm.run_dir), *_set_args(arm.overrides)]
    return args if data == "builtin" else [*args, "--data", data]


def training_state(arm: Arm) -> str:
    """finished (same recipe and budget) | resume | fresh; a UserError when the directory holds another run."""
    run = arm.run_dir
    if not (run / "plan.json").is_file():
        return "fresh"
    saved_recipe = json.loads((run / "recipe.json").read_text()) if (run / "recipe.json").is_file() else {}
    saved_budget = json.loads((run / "plan.json").read_text()).get("budget")
    now = json.loads(json.dumps(arm.recipe.to_dict()))
    saved_recipe.pop("deviations", None), now.pop("deviations", None)  # the trainer adds the --set changes to its copy
    if saved_recipe != now or saved_budget != arm.budget:
        raise UserError(f"{run} holds another run (recipe or budget {saved_budget} differ from this plan's "
                        f"{arm.budget}); choose another --work-dir or remove it")
    if (run / "summary.json").is_file() and (run / FINAL_CHECKPOINT).is_dir():
        return "finished"
    if (run / "state" / "LATEST").exists():
        return "resume"
    return "fresh"  # it stopped during start-up, before its first resume state: train starts it again


def pretrain(arm: Arm, data: str, device: torch.device) -> dict:
    from tinyelectra.train import train_command

    state = training_state(arm)
    args = train_args(arm, data, device)
    info = {"command": _cli(*args, *(["--resume"] if state == "resume" else [])), "state_before": state}
    if state == "finished":
        print(f"{arm.label}: reusing the finished run in {arm.run_dir}")
        return info
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}  # the trainer installs its own
    t0 = time.perf_counter()
    try:
        train_command(budget=arm.budget, data_dir=None if data == "builtin" else Path(data), corpus=None,
                      recipe_name=arm.recipe_name, gpu=None, device=str(device), out_dir=arm.run_dir,
                      resume=state == "resume", overrides=list(arm.overrides), command=info["command"])
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
    info["stage_wall_seconds"] = time.perf_counter() - t0
    return info


def write_initial_weights(arm: Arm, data: str, device: torch.device) -> dict:
    """The control's checkpoint: the model the ELECTRA run starts from (same recipe, same seed), with the data's
    tokenizer and the held-out diagnostics of those untrained weights."""
    from contextlib import nullcontext

    from tinyelectra.checkpoint import is_checkpoint, save_checkpoint
    from tinyelectra.data import PretrainData
    from tinyelectra.diagnostics import evaluate
    from tinyelectra.electra import SpecialIds
    from tinyelectra.model import Electra
    from tinyelectra.train import Dist, resolve_data

    target = arm.checkpoint
    if is_checkpoint(target):
        print(f"{arm.label}: reusing the initial weights in {target}")
        return {"state_before": "finished", "checkpoint": str(target)}
    recipe = arm.recipe
    data_dir = resolve_data(None if data == "builtin" else Path(data), None, recipe, arm.run_dir, Dist())
    pd = PretrainData(data_dir)
    torch.manual_seed(recipe.train.seed)  # as train() does before building the model
    model = Electra(recipe.model, recipe.objective.kind)
    ev = evaluate(model, pd, recipe, SpecialIds.from_tokenizer(pd.tokenizer), torch.device("cpu"), nullcontext(),
                  micro=recipe.train.batch_size)
    meta = {"name": CONTROL_CHECKPOINT, "step": 0, "fraction": 0.0, "tokens_seen": 0, "train_flops_paper": 0.0,
            "train_flops_hardware": 0.0, "eval": ev, "recipe": recipe.name,
            "note": "no pre-training: the initial weights of the ELECTRA run (same recipe, same seed)"}
    save_checkpoint(target, model, recipe, meta, pd.path / "tokenizer")
    return {"state_before": "fresh", "checkpoint": str(target)}


def finetune(arm: Arm, glue_dir: Path, tasks: list[str], seeds: int, max_train_rows: int | None,
             glue_set: list[str], device: torch.device) -> dict:
    from tinyelectra.glue import glue_command

    overrides = ["test_predictions=false", *glue_set]  # dev scores only: no submission files
    ckpt = arm.checkpoint
    args = ["glue", "--checkpoint", str(ckpt), "--glue-dir", str(glue_dir), "--tasks", ",".join(tasks),
            "--seeds", str(seeds), "--device", str(device), *_set_args(overrides)]
    if max_train_rows:
        args += ["--max-train-rows", str(max_train_rows)]
    t0 = time.perf_counter()
    (path,) = glue_command(checkpoint=ckpt, glue_dir=glue_dir, use_hf=False, tasks=",".join(tasks), seeds=seeds,
                           out_dir=None, gpu=None, device=str(device), max_train_rows=max_train_rows,
                           overrides=overrides, command=_cli(*args))
    return {"command": _cli(*args), "glue_json": str(path), "stage_wall_seconds": time.perf_counter() - t0}


def report(arm: Arm) -> dict:
    from tinyelectra.report import report_command

    try:
        report_command(arm.run_dir, None)
        return {"command": _cli("report", str(arm.run_dir)), "report_md": str(arm.run_dir / "report.md")}
    except Exception as e:  # noqa: BLE001 - a report that cannot render must not lose the measured numbers
        return {"command": _cli("report", str(arm.run_dir)), "error": f"{type(e).__name__}: {e}"}


def read_stages(arm: Arm) -> dict:
    path = arm.run_dir / STAGE_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


def record_stage(arm: Arm, stage: str, info: dict) -> None:
    """What a stage ran (command, wall time, process), kept beside the arm's files for whichever process writes."""
    stages = read_stages(arm)
    stages[stage] = {**info, "pid": os.getpid(), "threads": torch.get_num_threads()}
    arm.run_dir.mkdir(parents=True, exist_ok=True)
    tmp = arm.run_dir / f"{STAGE_FILE}.tmp-{os.getpid()}"
    tmp.write_text(json.dumps(stages, indent=2) + "\n")
    os.replace(tmp, arm.run_dir / STAGE_FILE)


# ----------------------------------------------------------------------------------------------------------------
# Reading what the stages wrote, and the comparisons
# ----------------------------------------------------------------------------------------------------------------


def pretraining_facts(arm: Arm, data_train_tokens: int | None) -> dict | None:
    """What the arm's pre-training did (None until it finished); for the control, its untrained weights' diagnostics."""
    if arm.label == "random-init":
        meta = arm.checkpoint / "meta.json"
        if not meta.is_file():
            return None
        return {"steps": 0, "tokens_seen": 0, "train_flops_paper": 0.0, "train_flops_hardware": 0.0,
                "held_out_eval_at_end": json.loads(meta.read_text()).get("eval", {})}
    run = arm.run_dir
    if not (run / "summary.json").is_file():
        return None
    s = json.loads((run / "summary.json").read_text())
    meta_path = run / FINAL_CHECKPOINT / "meta.json"
    ev = json.loads(meta_path.read_text()).get("eval", {}) if meta_path.is_file() else {}
    checkpoints = []
    for c in s.get("checkpoints", []):
        m = run / c / "meta.json"
        if m.is_file():
            meta = json.loads(m.read_text())
            checkpoints.append({"name": c, "step": meta.get("step"), "eval": meta.get("eval", {})})
    out = {"steps": s["steps"], "tokens_seen": s["tokens_seen"], "train_flops_paper": s["train_flops_paper"],
           "train_flops_hardware": s["train_flops_hardware"], "train_seconds": s["train_seconds"],
           "excluded_seconds": s.get("excluded_seconds") or {}, "precision": s["precision"], "device": s["device"],
           "parameters": s["parameters"], "held_out_eval_at_end": ev, "held_out_eval_by_checkpoint": checkpoints,
           "epochs_over_data": None if not data_train_tokens else s["tokens_seen"] / data_train_tokens}
    if s.get("steps") and s["train_seconds"]:
        out["tokens_per_second"] = s["tokens_seen"] / s["train_seconds"]
    return out


def glue_json_path(arm: Arm) -> Path:
    """Where `tinyelectra glue` writes the arm's results (a run's glue/ folder, or the control checkpoint's)."""
    base = arm.run_dir if arm.label != "random-init" else arm.checkpoint
    return base / "glue" / arm.checkpoint.name / "glue.json"


def glue_facts(glue_json: Path) -> dict | None:
    if not Path(glue_json).is_file():
        return None
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


def compare(a: dict, b: dict) -> dict:
    """Arm a against arm b on their common tasks: the gap of the averages of the per-task medians, per-task gaps, and
    the range of the differences between every per-seed average of a and every one of b (the spread a gap must
    clear before it says more than fine-tuning noise)."""
    common = [t for t in a["tasks"] if t in b["tasks"]]
    per_task = {t: a["tasks"][t]["median"] - b["tasks"][t]["median"] for t in common}
    gap = statistics.fmean(per_task.values()) if per_task else None
    seed_avg = lambda g: [statistics.fmean(g["tasks"][t]["seeds"][k] for t in common)  # noqa: E731
                          for k in range(min(len(g["tasks"][t]["seeds"]) for t in common))] if common else []
    diffs = [x - y for x, y in itertools.product(seed_avg(a), seed_avg(b))]
    return {"tasks": common, "average_gap": gap, "per_task_gap": per_task,
            "per_seed_average_gap_min": min(diffs) if diffs else None,
            "per_seed_average_gap_max": max(diffs) if diffs else None,
            "better_on": sorted(t for t, g in per_task.items() if g > 0),
            "worse_on": sorted(t for t, g in per_task.items() if g < 0),
            "every_seed_pair_agrees": bool(diffs) and (min(diffs) > 0 or max(diffs) < 0)}


COMPARISONS = (("electra", "mlm"), ("electra", "mlm-paper"), ("electra", "random-init"), ("mlm", "random-init"),
               ("mlm-paper", "random-init"))


def comparisons(runs: dict) -> dict:
    out = {}
    for a, b in COMPARISONS:
        ga, gb = (runs.get(a) or {}).get("glue"), (runs.get(b) or {}).get("glue")
        if ga and gb:
            out[f"{a}_minus_{b}"] = compare(ga, gb)
    return out


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
# The markdown
# ----------------------------------------------------------------------------------------------------------------


def _f(x, fmt="{:.1f}") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else fmt.format(x)


def _dur(seconds) -> str:
    if seconds is None:
        return "-"
    return f"{seconds:.0f} s" if seconds < 120 else (f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.2f} h")


ARM_TITLES = {"electra": "ELECTRA", "mlm": "MLM (equal hardware FLOPs)", "mlm-paper": "MLM (equal paper FLOPs)",
              "random-init": "no pre-training"}


def render_markdown(doc: dict) -> str:
    runs = doc["runs"]
    labels = [a for a in ARMS if a in runs]
    lines = [f"# ELECTRA vs MLM at equal pre-training compute, and a no-pre-training control ({doc['device']})", ""]
    if doc["experiment"]["is_paper_configuration"]:
        lines += ["The paper's 6.25% budget experiment (Clark et al. 2020, Table 1 point), as configured here.", ""]
    else:
        lines += ["**REDUCED SCALE: NOT the paper's 6.25% experiment.** Differences from it:", ""]
        lines += [f"- {d}" for d in doc["experiment"]["differences"]] + [""]
    for c in doc["experiment"].get("caveats") or []:
        lines += [f"Caveat: {c}.", ""]
    if not doc.get("complete"):
        lines += ["**Incomplete**: some arms are still running; missing numbers show as -.", ""]
    if doc.get("note"):
        lines += [doc["note"], ""]
    head = "| | " + " | ".join(ARM_TITLES[a] for a in labels) + " |"
    lines += ["## Pre-training", "", head, "|---" * (len(labels) + 1) + "|"]

    def pre(a):
        return (runs[a].get("pretraining") or {})

    def ev(a):
        return pre(a).get("held_out_eval_at_end") or {}

    def row(name, fn):
        lines.append(f"| {name} | " + " | ".join(fn(a) for a in labels) + " |")

    row("recipe", lambda a: f"{runs[a]['plan']['recipe']} {' '.join(runs[a]['plan']['overrides'])}".strip())
    row("budget", lambda a: runs[a]["plan"]["budget"])
    row("steps", lambda a: _f(pre(a).get("steps"), "{:,}"))
    row("tokens seen", lambda a: _f(pre(a).get("tokens_seen"), "{:,}"))
    row("train FLOPs, hardware convention", lambda a: _f(pre(a).get("train_flops_hardware"), "{:.4e}"))
    row("train FLOPs, paper convention", lambda a: _f(pre(a).get("train_flops_paper"), "{:.4e}"))
    row("training time", lambda a: _dur(pre(a).get("train_seconds")))
    row("tokens/s", lambda a: _f(pre(a).get("tokens_per_second"), "{:,.0f}"))
    row("epochs over the data", lambda a: _f(pre(a).get("epochs_over_data"), "{:.2f}"))
    row("precision", lambda a: str(pre(a).get("precision", "-")))
    row("held-out discriminator accuracy (all-original prior)", lambda a: (
        f"{_f(ev(a).get('disc_acc'), '{:.4f}')} ({_f(ev(a).get('baseline_acc'), '{:.4f}')})" if "disc_acc" in ev(a) else "-"))
    row("held-out discriminator ROC-AUC", lambda a: _f(ev(a).get("disc_auc"), "{:.3f}"))
    row("held-out discriminator precision / recall", lambda a: (
        f"{_f(ev(a).get('disc_precision'), '{:.3f}')} / {_f(ev(a).get('disc_recall'), '{:.3f}')}" if "disc_acc" in ev(a) else "-"))
    row("held-out generator / MLM accuracy (unigram baseline)", lambda a: (
        f"{_f(ev(a).get('gen_acc'), '{:.3f}')} ({_f(ev(a).get('unigram_acc'), '{:.3f}')})" if "gen_acc" in ev(a) else "-"))
    row("verdict", lambda a: ev(a).get("verdict", "-").split(":")[0] if ev(a) else "-")
    device = next((pre(a).get("device") for a in labels if pre(a).get("device")), "-")
    lines += ["", f"Device: {device}.", ""]

    curves = [(a, pre(a).get("held_out_eval_by_checkpoint") or []) for a in labels if pre(a).get("held_out_eval_by_checkpoint")]
    if curves:
        lines += ["Held-out diagnostics at each fraction checkpoint:", "", "| arm | checkpoint | step | disc. acc - prior | AUC | gen./MLM acc | unigram |",
                  "|---|---|---|---|---|---|---|"]
        for a, cks in curves:
            for c in cks:
                e = c["eval"]
                gain = e["disc_acc"] - e["baseline_acc"] if "disc_acc" in e else None
                lines.append(f"| {ARM_TITLES[a]} | {c['name']} | {_f(c['step'], '{:,}')} | {_f(gain, '{:+.4f}')} | "
                             f"{_f(e.get('disc_auc'), '{:.3f}')} | {_f(e.get('gen_acc'), '{:.3f}')} | {_f(e.get('unigram_acc'), '{:.3f}')} |")
        lines.append("")

    glued = [a for a in labels if runs[a].get("glue")]
    if glued:
        syn = " (SYNTHETIC tasks, not GLUE)" if doc["glue"]["synthetic"] else ""
        lines += [f"## Fine-tuning{syn}: dev median ± std over {doc['glue']['seeds']} seed(s)", "",
                  "| task | metric | " + " | ".join(ARM_TITLES[a] for a in glued) + " |", "|---|---" + "|---" * len(glued) + "|"]
        for t in doc["glue"]["tasks"]:
            cells, metric = [], "-"
            for a in glued:
                te = runs[a]["glue"]["tasks"].get(t)
                metric = te["metric"] if te else metric
                cells.append(f"{_f(te['median'])} ± {_f(te['std'])}" if te else "-")
            lines.append(f"| {t} | {metric} | " + " | ".join(cells) + " |")
        lines.append("| **average** | | " + " | ".join(f"**{_f(runs[a]['glue']['average'])}**" for a in glued) + " |")
        lines.append("| per-seed averages | | " + " | ".join(
            ", ".join(_f(x) for x in runs[a]["glue"]["per_seed_averages"]) for a in glued) + " |")
        lines.append("")
    if doc.get("comparisons"):
        lines += ["## Gaps (average of the per-task median gaps; range over every pair of per-seed averages)", "",
                  "| comparison | gap | range | better on | worse on |", "|---|---|---|---|---|"]
        for key, c in doc["comparisons"].items():
            a, b = key.split("_minus_")
            lines.append(f"| {ARM_TITLES[a]} − {ARM_TITLES[b]} | {_f(c['average_gap'], '{:+.2f}')} | "
                         f"{_f(c['per_seed_average_gap_min'], '{:+.2f}')} … {_f(c['per_seed_average_gap_max'], '{:+.2f}')} | "
                         f"{', '.join(c['better_on']) or '-'} | {', '.join(c['worse_on']) or '-'} |")
        lines.append("")
    if doc.get("findings"):
        lines += ["## What this shows, and what it does not", ""] + [f"- {x}" for x in doc["findings"]] + [""]
    p = doc["paper_reference"]
    lines += ["## Published reference (not measured here)", "",
              f"- ELECTRA-Small at 6.25% (62.5k steps, {p['electra_small_6.25pct']['train_flops_paper']:.1e} FLOPs): "
              f"GLUE dev {p['electra_small_6.25pct']['glue_dev_8_tasks']} (8 tasks; {p['electra_small_6.25pct']['note']}).",
              f"- Full budget (1.4e18 FLOPs): ELECTRA-Small {p['electra_small_full']['glue_dev_8_tasks']} vs BERT-Small "
              f"{p['bert_small_full']['glue_dev_8_tasks']} (gap {p['full_budget_gap']:+.1f}).",
              f"- ELECTRA-Small (OpenWebText, 1M steps) averaged over the tasks run here: "
              f"{_f(p['per_task_electra_small_owt_1M']['average_over_these_tasks'])}.", ""]
    lines += ["## Files", ""]
    for a in labels:
        lines.append(f"- {ARM_TITLES[a]}: `{runs[a]['run_dir']}`" + (f", report `{runs[a]['report']['report_md']}`"
                                                                      if (runs[a].get("report") or {}).get("report_md") else ""))
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
                    "cpu: mini vs mini as a masked LM; tiny: tiny vs tiny as a masked LM (" + " ".join(MLM_OVERRIDES) + ")")
    ap.add_argument("--electra-recipe", default=None, help="overrides the preset's ELECTRA recipe")
    ap.add_argument("--mlm-recipe", default=None, help="overrides the preset's MLM recipe (used as it is)")
    ap.add_argument("--steps", type=int, default=PAPER_STEPS, help="ELECTRA steps; the MLM arms get the same FLOPs")
    ap.add_argument("--arms", default=",".join(ARMS), help=f"arms this process runs, of {','.join(ARMS)} (the result "
                    "file shows every arm found on disk)")
    ap.add_argument("--recipe-set", action="append", default=[], metavar="KEY=VALUE", help="recipe override for every arm")
    ap.add_argument("--electra-set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--mlm-set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--tasks", default=",".join(GLUE5))
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--max-train-rows", type=int, default=None, help="fine-tune on the first N training rows per task")
    ap.add_argument("--glue-set", action="append", default=[], metavar="KEY=VALUE", help="`tinyelectra glue --set`")
    ap.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: a GPU if there is one)")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    ap.add_argument("--work-dir", default=None, help="where the arms' runs go (default runs/quality-<device>)")
    ap.add_argument("--out-dir", default=None, help="result directory (default benchmarks/results)")
    ap.add_argument("--name", default=None, help="result file name (default quality-<device>)")
    ap.add_argument("--note", default=None, help="a sentence stored in the result and shown in the markdown")
    ap.add_argument("--findings", default=None, help="a JSON list of sentences (the write-up) stored and shown")
    ap.add_argument("--collect-only", action="store_true", help="run nothing; write the result from what is on disk")
    ap.add_argument("--dry-run", action="store_true", help="print the plan and exit; nothing runs or is written")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    from tinyelectra import runtime

    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = runtime.pick_device(None, args.device)
    arms = build_arms(args)
    run = [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = [a for a in run if a not in ARMS]
    if unknown or not run:
        raise UserError(f"--arms {args.arms!r}: choose among {', '.join(ARMS)}")
    if args.collect_only:
        run = []
    if args.seeds < 1:
        raise UserError("--seeds must be at least 1")
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    if args.synthetic_glue:
        tasks = [t for t in tasks if t in ("sst2", "rte")] or ["sst2", "rte"]
    slug = device_slug(device)
    work = Path(args.work_dir) if args.work_dir else ROOT / "runs" / f"quality-{slug}"
    for arm in arms.values():
        arm.run_dir = work / arm.label
    diffs = scale_differences(args, arms, tasks)
    expected = expected_train_seconds(arms, device)
    print_plan(arms, run, tasks, args, diffs, expected)
    plan_doc = {label: plan_record(arm) for label, arm in arms.items()}
    if args.dry_run:
        return {"dry_run": True, **plan_doc, "expected_train_seconds": expected, "differences": diffs}

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
        epochs = max(arms[a].plan.expected_tokens for a in PRETRAINED) / data_train_tokens
        if epochs > 1:
            caveats.append(f"the data holds {data_train_tokens:,} training tokens: the runs go over it up to "
                           f"{epochs:.1f} times (the paper's 6.25% point saw about 1.0B tokens of a 3.3B-token corpus, "
                           "a third of one pass)")
    e_plan = arms["electra"].plan
    name = args.name or f"quality-{slug}"
    out_dir = Path(args.out_dir) if args.out_dir else RESULTS
    started = time.perf_counter()
    command = command_line("benchmarks/quality.py", argv)
    findings = json.loads(args.findings) if args.findings else None
    head = {
        "experiment": {"is_paper_configuration": not diffs, "differences": diffs,
                       "kind": "the paper's 6.25% experiment" if not diffs else
                               "REDUCED-SCALE run, not the paper's 6.25% experiment",
                       "schedule": "each run is scheduled over its own budget (warm-up, then linear decay to 0 at its "
                                   "end); the paper's 6.25% row is a snapshot of a 1M-step run",
                       "equal_compute": {
                           "mlm": "the most MLM steps whose hardware-convention FLOPs fit in ELECTRA's",
                           "mlm-paper": "the most MLM steps whose paper-convention FLOPs fit in ELECTRA's",
                           "mlm_over_electra": {a: {"hardware": arms[a].plan.train_flops_hardware / e_plan.train_flops_hardware,
                                                    "paper": arms[a].plan.train_flops_paper / e_plan.train_flops_paper,
                                                    "steps": arms[a].plan.total_steps / e_plan.total_steps}
                                                for a in ("mlm", "mlm-paper")}},
                       "caveats": caveats},
        "note": args.note, "findings": findings, "device": slug, "torch_device": str(device),
        # the code that ran; "git_commit" beside it is HEAD when the file was (re)written, hours later at full scale
        "git_commit_at_start": git_commit(),
        "data": {"path": args.data, "train_tokens": data_train_tokens},
        "glue": {"dir": str(glue_dir), "synthetic": args.synthetic_glue, "tasks": tasks, "seeds": args.seeds,
                 "max_train_rows": args.max_train_rows, "settings": args.glue_set,
                 "protocol": "tinyelectra glue (paper protocol unless `settings` say otherwise), dev sets, median over "
                             "seeds; the final checkpoint of each pre-trained arm, the initial weights for random-init"},
        "paper_reference": paper_reference(tasks), "expected_train_seconds": expected,
    }

    def save() -> Path:
        """The result from what is on disk (any process's arms), rewritten atomically, and its markdown."""
        runs = {}
        for label, arm in arms.items():
            if label not in run and not arm.run_dir.exists():
                continue
            stages = read_stages(arm)
            runs[label] = {"plan": plan_record(arm), "run_dir": str(arm.run_dir), **stages,
                           "pretraining": pretraining_facts(arm, data_train_tokens), "glue": glue_facts(glue_json_path(arm))}
        complete = all((runs.get(a) or {}).get("glue") and runs[a]["glue"]["complete"] for a in ARMS if a in run or a in runs)
        doc = {**head, "runs": runs, "comparisons": comparisons(runs), "complete": bool(runs) and complete,
               "wall_seconds_this_invocation": time.perf_counter() - started}
        doc["comparison"] = doc["comparisons"].get("electra_minus_mlm")  # the headline (older readers)
        doc["precision"] = {label: (r.get("pretraining") or {}).get("precision") for label, r in runs.items()}
        path = write_result(name, doc, device, out_dir=out_dir, command=command)
        md = path.with_suffix(".md")  # rendered from the result file alone
        tmp = md.with_name(f"{md.name}.tmp-{os.getpid()}")
        tmp.write_text(render_markdown(json.loads(path.read_text())), encoding="utf-8")
        os.replace(tmp, md)
        return path

    for label in [a for a in ARMS if a in run]:  # pre-train first: a GLUE failure never costs a pre-training run
        arm = arms[label]
        info = write_initial_weights(arm, args.data, device) if label == "random-init" else pretrain(arm, args.data, device)
        record_stage(arm, "train" if info.get("state_before") != "finished" else "train_reused", info)
        save()
    for label in [a for a in ARMS if a in run]:
        arm = arms[label]
        record_stage(arm, "finetune", finetune(arm, glue_dir, tasks, args.seeds, args.max_train_rows, args.glue_set, device))
        save()
    for label in [a for a in PRETRAINED if a in run]:
        record_stage(arms[label], "report", report(arms[label]))
    path = save()
    doc = json.loads(path.read_text())
    for key, c in doc["comparisons"].items():
        print(f"{key}: {_f(c['average_gap'], '{:+.2f}')} (per-seed range {_f(c['per_seed_average_gap_min'], '{:+.2f}')} .. "
              f"{_f(c['per_seed_average_gap_max'], '{:+.2f}')})")
    print(f"-> {path} and {path.with_suffix('.md')}")
    return doc


if __name__ == "__main__":
    run_main(main)
