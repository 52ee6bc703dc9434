"""Does the GLUE plan fit the time the --finish command has, and what runs if it does not: the arithmetic the suite's
glue stage does before it starts (benchmarks/gpu_check/suite.py), kept here so that tests check it against hand-computed
numbers.

`tinyelectra glue` runs its jobs (checkpoint x task x seed) round-robin in one process, one step of each job in flight
per round, longest first, at most `concurrent` in flight (finetune.run_jobs): every job in flight advances at the same
rate, the process's aggregate steps/s over the jobs in flight. So the stage's time is the critical path of that
schedule, not the total steps over an aggregate rate: while few long jobs are left (SST-2's 6,315 steps a seed), the
GPU is under-used and the aggregate drops (`simulate`). The aggregate as a function of the jobs in flight is today's
measurement (H100_STEPS_PER_S); between measured points it is interpolated, outside them held flat.

When the plan does not fit (`fit`), it is trimmed in a fixed order (`trimmed_plans`) and the first plan that fits
runs, what was trimmed said in one line: the longest task (SST-2: its jobs are the critical path) loses seeds one at a
time down to one, then the next longest, and so on; only when one seed of every task does not fit is the longest
task dropped, the others back at their full seeds. The cap on jobs in flight is the one with the shortest modeled
time (a cap starts the long jobs alone, at a higher rate each, and keeps short ones for the end, when the GPU would
otherwise run a few long jobs at a lower aggregate rate). Extra jobs that run only when time allows (`fit_with_extras`:
CoLA with the released code's learning rate) are planned first with the whole plan, and left out before anything is
trimmed.
"""

from __future__ import annotations

SOURCE = "benchmarks/results/h100-2026-11-26/ (the --finish archive: glue_speed.json and logs/glue.log)"
# Aggregate fine-tuning steps/s of one `tinyelectra glue` process with n jobs in flight (CUDA graphs, bf16 autocast,
# batch 32), measured on an NVIDIA H100 80GB HBM3 on 2026-11-26 (SOURCE):
H100_STEPS_PER_S = {
    1: 144.4,  # glue_speed.json, layout graphs:1 (every batch padded to 128 tokens: heavier than GLUE's rows)
    8: 269.0,  # glue_speed.json, layout graphs:8 (the same padding)
    12: 364.2,  # glue.log: ckpt-10000 sst2 seed 1 from step 1,711 (101 s) to 3,532 (161 s) with 12 jobs in flight
    #             (6 SST-2, 6 STS-B): 1,821 steps / 60 s = 30.35 steps/s a job
    # glue.log: ckpt-0000 cola seed 1 at step 359 after 30 s with all 30 jobs in flight: 358 / 30 = 11.93 a job
    30: 358.0,
}
# Time outside the steps, measured in the same run (SOURCE) unless said:
STARTUP_S = 15.0  # process start to the first job's set-up: glue_speed's process took 7 s beyond its layouts' wall
#                   time (60.2 s stage, 53.2 s of layouts: imports, CUDA, a checkpoint, exit); reading and tokenizing
#                   the five training sets took 3.3 s on a 2-core CPU; two checkpoints to load: rounded up (unmeasured
#                   whole)
JOB_SETUP_S = 0.55  # one job's set-up (classifier, optimizer, CUDA-graph capture), the host busy: glue.json's
#                     train_seconds (from set-up) minus glue.log's step time (from step 1) fall by 0.42-0.72 s a job
#                     down the creation order (STS-B 11.7 s, CoLA 7.4 s, RTE 3.8 s, MRPC 1.3 s)
JOB_FINISH_S = 0.4  # one finished job's host sync, dev-set evaluation and glue.json write, the others waiting: the
#                     rates above alone put RTE's end at 63.8 s from step 1, CoLA's at 65.0 s and STS-B's at 157.1 s;
#                     glue.log has 67-68 s, 69-71 s and 163-165 s, after 6, 12 and 18 finished jobs
FIT_MARGIN = 0.9  # the plan must fit in this share of the stage's time: the model rests on one run
MAX_CONCURRENT = 32  # finetune.AUTO_CONCURRENT: the most jobs in flight tried


def aggregate_rate(n: int, table: dict[int, float] = H100_STEPS_PER_S) -> float:
    """Aggregate steps/s with `n` jobs in flight: the measured value, linear between measured points, flat outside."""
    points = sorted(table.items())
    if n <= points[0][0]:
        return points[0][1]
    for (a, ra), (b, rb) in zip(points, points[1:]):
        if n <= b:
            return ra + (rb - ra) * (n - a) / (b - a)
    return points[-1][1]


def jobs_in_order(steps_per_seed: dict[str, int], seeds: dict[str, int], checkpoints: int) -> list[tuple[str, int]]:
    """The jobs as `tinyelectra glue` starts them: (task, steps) for every checkpoint, task and seed, longest first
    (a stable sort: ties keep the checkpoint, task, seed order)."""
    jobs = [(t, s) for _ in range(checkpoints) for t, s in steps_per_seed.items() for _ in range(seeds.get(t, 0))]
    return sorted(jobs, key=lambda j: -j[1])


def simulate(jobs: list[tuple[str, int]], concurrent: int, table: dict[int, float] = H100_STEPS_PER_S) -> dict:
    """Seconds from the process's start to its last job's end when `jobs` run `concurrent` at a time, round-robin
    (every job in flight at aggregate_rate(n) / n steps/s); each task's last end."""
    t, pending, active, ends = STARTUP_S, list(jobs), [], {}
    while pending or active:
        while pending and len(active) < concurrent:
            active.append(list(pending.pop(0)))
            t += JOB_SETUP_S
        per_job = aggregate_rate(len(active), table) / len(active)
        step = min(a[1] for a in active)
        t += step / per_job
        for a in active:
            a[1] -= step
        done = [a for a in active if a[1] <= 1e-9]
        active = [a for a in active if a[1] > 1e-9]
        t += JOB_FINISH_S * len(done)
        ends.update({a[0]: t for a in done})
    return {"seconds": t, "task_ends_s": ends, "concurrent": concurrent}


def best_schedule(jobs: list[tuple[str, int]], table: dict[int, float] = H100_STEPS_PER_S) -> dict:
    """The cap on jobs in flight (1 to MAX_CONCURRENT) with the shortest modeled time (the larger cap on a tie)."""
    tried = [simulate(jobs, k, table) for k in range(1, min(len(jobs), MAX_CONCURRENT) + 1)]
    best = min(tried, key=lambda r: (round(r["seconds"], 6), -r["concurrent"]))
    return {**best, "all_at_once_s": tried[-1]["seconds"]}


def trimmed_plans(steps_per_seed: dict[str, int], seeds: int):
    """The plans in the order they are tried, each {task: seeds}: the whole plan; then the tasks in order of steps a
    seed, longest first, lose one seed at a time down to one; when every task is down to one seed, the longest task is
    dropped and the same order starts again on the others, each back at `seeds` seeds."""
    tasks = sorted(steps_per_seed, key=lambda t: -steps_per_seed[t])  # stable: ties keep their order
    while tasks:
        kept = {t: seeds for t in tasks}
        yield dict(kept)
        for t in tasks:
            while kept[t] > 1:
                kept[t] -= 1
                yield dict(kept)
        tasks = tasks[1:]


def fit(steps_per_seed: dict[str, int], seeds: int, checkpoints: int, available_s: float,
        table: dict[int, float] = H100_STEPS_PER_S, margin: float = FIT_MARGIN) -> dict:
    """The first plan of `trimmed_plans` whose best schedule fits `margin` x `available_s`: per-task seeds (tasks
    dropped absent), the cap on jobs in flight, the modeled seconds and each task's end; what was trimmed against the
    whole plan, and the plans tried. `fits` is False when not even one seed of the shortest task fits."""
    budget = available_s * margin
    tried, plan, kept, full = [], None, {}, None
    for kept in trimmed_plans(steps_per_seed, seeds):
        plan = best_schedule(jobs_in_order(steps_per_seed, kept, checkpoints), table)
        full = full or plan  # trimmed_plans yields the whole plan first
        tried.append({"seeds": kept, "seconds": round(plan["seconds"], 1), "concurrent": plan["concurrent"]})
        if plan["seconds"] <= budget:
            break
    fits = plan is not None and plan["seconds"] <= budget
    trims = [f"{t} dropped" if t not in kept else f"{t} {kept[t]} seed{'s' if kept[t] > 1 else ''} of {seeds}"
             for t in sorted(steps_per_seed, key=lambda t: -steps_per_seed[t]) if kept.get(t) != seeds] if fits else []
    return {"fits": fits, "seeds": kept if fits else {},
            "dropped": [t for t in steps_per_seed if t not in kept] if fits else list(steps_per_seed),
            "trims": trims, "concurrent": plan["concurrent"] if fits else None,
            "estimate_s": plan["seconds"] if fits else None,
            "task_ends_s": plan["task_ends_s"] if fits else {}, "jobs": sum(kept.values()) * checkpoints if fits else 0,
            "steps": sum(steps_per_seed[t] * n * checkpoints for t, n in kept.items()) if fits else 0,
            "available_s": available_s, "margin": margin, "budget_s": budget, "tried": tried,
            "full_plan": {"seconds": full["seconds"], "concurrent": full["concurrent"],
                          "all_at_once_s": full["all_at_once_s"],
                          "jobs": seeds * checkpoints * len(steps_per_seed),
                          "steps": sum(s * seeds * checkpoints for s in steps_per_seed.values())},
            "model": {"steps_per_s_by_jobs_in_flight": table, "startup_s": STARTUP_S, "job_setup_s": JOB_SETUP_S,
                      "job_finish_s": JOB_FINISH_S, "source": SOURCE}}


def fit_with_extras(steps_per_seed: dict[str, int], extras: dict[str, int], seeds: int, checkpoints: int,
                    available_s: float, table: dict[int, float] = H100_STEPS_PER_S, margin: float = FIT_MARGIN) -> dict:
    """`fit` for a plan with `extras` ({name: steps a seed}) that run only when time allows: the whole plan with them
    when it fits untrimmed, else `fit` without them. `extras` lists the extras kept, `extras_dropped` those left out."""
    if extras:
        f = fit({**steps_per_seed, **extras}, seeds, checkpoints, available_s, table, margin)
        if f["fits"] and not f["trims"]:
            return {**f, "extras": list(extras), "extras_dropped": []}
    return {**fit(steps_per_seed, seeds, checkpoints, available_s, table, margin), "extras": [],
            "extras_dropped": list(extras)}


def describe(f: dict) -> str:
    """One line: the plan against its time, what was trimmed and why."""
    full = f["full_plan"]
    head = (f"{full['jobs']} jobs, {full['steps']:,} steps: modeled {full['seconds']:.0f} s with up to "
            f"{full['concurrent']} in flight (all at once: {full['all_at_once_s']:.0f} s) against {f['budget_s']:.0f} "
            f"s ({f['margin']:.0%} of the {f['available_s']:.0f} s left)")
    extras = (f"; left out to fit: {', '.join(f['extras_dropped'])} (run only when time allows)"
              if f.get("extras_dropped") else "")
    if not f["fits"]:
        return f"{head}: does not fit, not even one seed of one task"
    if not f["trims"]:
        return f"{head}: runs whole{extras}"
    return (f"{head}{extras}: TRIMMED to fit ({', '.join(f['trims'])}; the longest task's seeds go first): {f['jobs']} "
            f"jobs, {f['steps']:,} steps, modeled {f['estimate_s']:.0f} s with up to {f['concurrent']} in flight")
