"""What a training run shows and records: one-line notes, the plan table, a progress display (or plain lines in logs),
metrics.jsonl, TensorBoard when installed, and the closing FLOPs report. Nothing here changes what is trained.

How text reaches a person (wrapped in a terminal, whole lines in a file) is console.py's `make_console`.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

from rich.markup import escape
from rich.progress import BarColumn, Progress as RichProgress, TextColumn
from rich.table import Table
from rich.text import Text

from tinyelectra.budget import Plan, stops_text
from tinyelectra.config import Recipe
from tinyelectra.console import make_console
from tinyelectra.files import append_line, write_atomic
from tinyelectra.flops import format_flops


def _note(console, text: str) -> None:
    console.print(f"[dim]·[/dim] {escape(text)}", highlight=False)  # text is not markup: "[tensorboard]"


class Log:
    """metrics.jsonl (one JSON object per log step / event), TensorBoard when installed, one-line notes.
    Nothing is written into the run directory before the first metrics line (bad input leaves no files behind)."""

    def __init__(self, run_dir: Path, main: bool) -> None:
        self.main, self.run_dir, self.path = main, run_dir, run_dir / "metrics.jsonl"
        self.console = make_console()
        self.tb, self._tb_tried = None, False

    def _tensorboard(self):
        if not self._tb_tried:
            self._tb_tried = True
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(str(self.run_dir / "tensorboard"))
            except ImportError:  # optional: said once
                self.once("TensorBoard: not installed, so metrics go to metrics.jsonl only "
                          "(pip install 'tinyelectra[tensorboard]' adds RUN/tensorboard)")
            except Exception as e:  # installed but broken: said once, the run goes on
                self.once(f"TensorBoard: unavailable ({type(e).__name__}: "
                          f"{str(e).splitlines()[0][:120] if str(e) else ''}); metrics go to metrics.jsonl only")
        return self.tb

    def once(self, text: str) -> None:
        if self.main and text:
            _note(self.console, text)

    def metrics(self, rec: dict) -> None:
        if not self.main:
            return
        append_line(self.path, json.dumps(rec), "metrics log")  # a failed write leaves no torn line
        tb = self._tensorboard()
        if tb is None:
            return
        if "event" not in rec:
            for k, v in rec.items():
                if isinstance(v, (int, float)) and k != "step":
                    tb.add_scalar(k, v, rec["step"])
        elif rec["event"] == "checkpoint":  # held-out diagnostics (diagnostics.evaluate) under heldout/
            for k, v in (rec.get("eval") or {}).items():
                if isinstance(v, (int, float)) and k != "rows":
                    tb.add_scalar(f"heldout/{k}", float(v), rec["step"])
            tb.flush()

    def truncate_after(self, step: int) -> None:
        """After a resume, drop log lines of steps that will be run again (and a last line cut short by a crash)."""
        if not self.main or not self.path.exists():
            return
        keep = []
        for line in self.path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict) and rec.get("step", 0) <= step:
                keep.append(line)
        write_atomic(self.path, "".join(k + "\n" for k in keep))

    def plan(self, plan: Plan, recipe: Recipe, model, precision: str, device, command: str) -> None:
        if not self.main:
            return
        from tinyelectra.model import count_parameters
        from tinyelectra.runtime import device_name

        provisional = plan.status == "provisional"
        t = Table(title=f"plan: {recipe.name}, budget {plan.budget}"
                  + (" (steps planned once the speed is measured)" if provisional else ""),
                  show_header=False, title_justify="left")
        if provisional:
            t.add_row("steps", "as many as fit: planned from the speed measured over the first steps, then re-planned "
                               "as it changes")
        else:
            t.add_row("steps", f"{plan.total_steps:,} (warm-up {plan.warmup_steps:,})")
        if plan.stop:  # where this command ends the run: the schedule stays as planned
            t.add_row("this command stops", f"{stops_text(plan.stop)}; then --resume continues the schedule")
        t.add_row("batch", f"{plan.batch_size} x {plan.seq_len} = {plan.tokens_per_step:,} tokens per step")
        if provisional:
            t.add_row("checkpoints", "at 6.25%, 12.5%, 25%, 50% and 100% of the steps, each on its own step")
            t.add_row("FLOPs per step, paper convention", format_flops(plan.train_flops_paper_per_step))
            t.add_row("FLOPs per step, hardware convention", format_flops(plan.train_flops_hardware_per_step))
        else:
            t.add_row("token positions (padding included)", f"{plan.expected_tokens:,}")
            t.add_row("checkpoints", ", ".join(f"{k}@{v:,}" for k, v in plan.checkpoint_steps.items()))
            t.add_row("FLOPs, paper convention", format_flops(plan.train_flops_paper))
            t.add_row("FLOPs, hardware convention", format_flops(plan.train_flops_hardware))
        if plan.budget_seconds:
            t.add_row("wall-clock budget", f"{plan.budget_seconds:,.0f} s of training time (not reproducible: the "
                      "steps that fit depend on the machine's speed and load)")
        t.add_row("model", f"{count_parameters(model):,} parameters, {precision} on {device_name(device)}")
        self.console.print(t)
        for note in plan.notes:
            self.once(note)

    def summary(self, s: dict, plan: Plan, next_commands: list[tuple[str, str]]) -> None:
        """The closing FLOPs report, then the commands that come next for this run (export, glue, report)."""
        t = Table(title="FLOPs report", show_header=False, title_justify="left")
        t.add_row("steps / tokens", f"{s['steps']:,} / {s['tokens_seen']:,}")
        if s.get("stopped"):
            t.add_row("stopped", f"by {s['stopped']['why']} at {100 * s['stopped']['fraction_of_schedule']:.4g}% of "
                      f"the schedule ({plan.schedule_text()}; learning rate {s['stopped']['lr']:.3g})")
        if s.get("data_repetition"):
            r = s["data_repetition"]
            unique = f" of {r['unique_tokens']:,} unique tokens" if r.get("unique_tokens") else ""
            t.add_row("data", f"{r['passes']:.3g} passes over {r['train_rows']:,} training rows{unique}")
        t.add_row(plan.conventions["paper"], format_flops(s["train_flops_paper"]))
        t.add_row(plan.conventions["hardware"], format_flops(s["train_flops_hardware"]))
        budget_txt = f" (budget {s['budget_seconds']:.0f} s)" if s["budget_seconds"] else ""
        t.add_row("training time", f"{s['train_seconds']:.1f} s{budget_txt}")
        t.add_row("excluded", f"checkpoints/eval/state {s['excluded_seconds']['checkpoints_eval_state']:.1f} s")
        # the stop's checkpoint is a fraction checkpoint when the stop fell on its step: listed once, as the stop's
        stop_ckpt = s["stopped"]["checkpoint"] if s.get("stopped") else None
        written = [f"{n}@{s['checkpoint_steps'][n]:,}" for n in s["checkpoints"] if n != stop_ckpt]
        if stop_ckpt:
            written += [f"{stop_ckpt}@{s['stopped']['step']:,} (where it stopped)"]
        written = ([f"{s['initial_checkpoint']}@0 (initial weights)"] if s.get("initial_checkpoint") else []) + written
        t.add_row("checkpoints", ", ".join(written) or "none")
        if s["median_tokens_per_second"] is not None:
            t.add_row("speed", f"{s['median_tokens_per_second']:,.0f} tokens/s (median of the log windows after the "
                      f"first){'; ' + s['host_sync_per_step'] if s['host_sync_per_step'] else ''}")
        if s["peak_gpu_memory_gib"] is not None:
            t.add_row("peak GPU memory", f"{s['peak_gpu_memory_gib']:.2f} GiB (tensors)")
        self.console.print(t)
        self.console.print("next, for this run:", highlight=False)
        for command, what in next_commands:
            self.console.print(f"  {command}   # {what}", markup=False, highlight=False, soft_wrap=True)


def median_tokens_per_second(records: list[dict]) -> float | None:
    """The median of the log windows' tokens/s (`records`: one process's metrics.jsonl lines in order), the first
    window left out (compilation and warm-up can fall in it); None without a window after the first."""
    rates = [r["tokens_per_second"] for r in records[1:]]
    return statistics.median(rates) if rates else None


class _TwoLines(RichProgress):
    def get_renderables(self):
        yield self.make_tasks_table(self.tasks)
        for task in self.tasks:
            if task.fields.get("info"):
                yield Text(task.fields["info"], overflow="fold")


class Progress:
    """The step counter, a bar and the ETAs on one short line that fits an 80-column terminal, the losses,
    accuracies, lr and speed on the line below (wrapped, never cut). Before a time budget's speed is measured the
    total is unknown and shown as such ("12/?"), never as a placeholder number. The ETAs use the speed of the last
    few log steps, so start-up (the first compiled steps, CUDA-graph capture) and checkpoint pauses do not stretch
    them. When stderr is not a terminal (CI logs), one plain line per log step instead."""

    RATE_WINDOW_LOG_STEPS = 8

    def __init__(self, plan: Plan, step: int, main: bool, clock: Callable[[], float] = time.perf_counter,
                 console=None) -> None:
        self.main, self.plan, self.clock, self.t0 = main, plan, clock, clock()
        self.console = console if console is not None else make_console()
        self.live = main and self.console.is_terminal
        self.step0 = self.step = step
        self.marks: deque[tuple[float, int]] = deque(maxlen=self.RATE_WINDOW_LOG_STEPS + 1)  # (clock, step) per update
        if main:
            self.bar = _TwoLines(TextColumn("[bold]train[/] {task.fields[counter]}"), BarColumn(bar_width=None),
                                TextColumn("{task.fields[eta]}"), console=self.console, transient=False, expand=True)
            self.task = self.bar.add_task("train", total=plan.total_steps, completed=step, info="",
                                          counter=self._counter(step), eta=self._eta(step))
            if self.live:
                self.bar.start()

    def _counter(self, step: int) -> str:
        total = "?" if self.plan.total_steps is None else f"{self.plan.total_steps:,}"
        return f"{step:,}/{total}"

    def _eta(self, step: int) -> str:
        if self.plan.total_steps is None:
            return "measuring the speed"
        if len(self.marks) >= 2:  # the steps per second over the last log steps
            (t_first, s_first), (t_last, s_last) = self.marks[0], self.marks[-1]
            rate = (s_last - s_first) / max(t_last - t_first, 1e-9)
        else:  # one log step so far: its speed since the start
            now = self.marks[-1][0] if self.marks else self.clock()
            rate = (step - self.step0) / max(now - self.t0, 1e-9)
        upcoming = [s for s in self.plan.checkpoint_steps.values() if s > step]
        eta_ckpt = (min(upcoming) - step) / rate if upcoming and rate > 0 else None
        eta_end = (self.plan.total_steps - step) / rate if rate > 0 else float("inf")
        text = f"end {_hms(eta_end)}"
        return text + (f" · next ckpt {_hms(eta_ckpt)}" if eta_ckpt is not None else "")

    def replan(self, plan: Plan) -> None:
        self.plan = plan
        if self.main:
            self.bar.update(self.task, total=plan.total_steps, counter=self._counter(self.step),
                            eta=self._eta(self.step))

    def update(self, step: int, rec: dict) -> None:
        if not self.main:
            return
        self.step = step
        self.marks.append((self.clock(), step))
        parts = [f"loss g {rec['gen_loss']:.3f}"]
        if "disc_loss" in rec:
            parts.append(f"d {rec['disc_loss']:.4f}")
        parts.append(f"acc g {rec.get('gen_acc', 0):.3f}")
        if "disc_acc" in rec:
            parts.append(f"d {rec['disc_acc']:.3f}")
        parts += [f"lr {rec['lr']:.2e}", f"{rec['tokens_per_second']:,.0f} tok/s"]
        if rec.get("mfu") is not None:
            parts.append(f"MFU {100 * rec['mfu']:.1f}%")
        info = " | ".join(parts)
        self.bar.update(self.task, completed=step, info=info, counter=self._counter(step), eta=self._eta(step))
        if not self.live:
            self.console.print(f"step {self._counter(step)} | {self._eta(step)} | {info}", highlight=False)

    def note(self, text: str) -> None:
        if self.main:
            _note(self.bar.console if self.live else self.console, text)

    def close(self) -> None:
        if self.live:
            self.bar.stop()
            self.live = False


def _hms(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    s = int(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"
