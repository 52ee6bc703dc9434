"""What a training run shows and records: one-line notes, the plan table, a progress bar (or plain lines in logs),
metrics.jsonl, TensorBoard when installed, and the closing FLOPs report. Nothing here changes what is trained."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import torch

from tinyelectra.budget import Plan
from tinyelectra.config import Recipe
from tinyelectra.model import Electra, count_parameters
from tinyelectra.runtime import device_name


class Log:
    """metrics.jsonl (one JSON object per log step / event), TensorBoard when installed, one-line notes."""

    def __init__(self, run_dir: Path, main: bool) -> None:
        from rich.console import Console

        self.main = main
        self.path = run_dir / "metrics.jsonl"
        self.console = Console(stderr=True)
        self.tb = None
        if main:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(str(run_dir / "tensorboard"))
            except ImportError:  # optional: said once
                self.once("TensorBoard: not installed, so metrics go to metrics.jsonl only "
                          "(pip install 'tinyelectra[tensorboard]' adds RUN/tensorboard)")
            except Exception as e:  # installed but broken: said once, the run goes on
                self.once(f"TensorBoard: unavailable ({type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}); "
                          "metrics go to metrics.jsonl only")

    def once(self, text: str) -> None:
        if self.main and text:
            from rich.markup import escape

            self.console.print(f"[dim]·[/dim] {escape(text)}", highlight=False)  # text is not markup: "[tensorboard]"

    def metrics(self, rec: dict) -> None:
        if not self.main:
            return
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(rec) + "\n")
        if self.tb is None:
            return
        if "event" not in rec:
            for k, v in rec.items():
                if isinstance(v, (int, float)) and v is not None and k != "step":
                    self.tb.add_scalar(k, v, rec["step"])
        elif rec["event"] == "checkpoint":  # held-out diagnostics (diagnostics.evaluate) under heldout/
            for k, v in (rec.get("eval") or {}).items():
                if isinstance(v, (int, float)) and k != "rows":
                    self.tb.add_scalar(f"heldout/{k}", float(v), rec["step"])
            self.tb.flush()

    def truncate_after(self, step: int) -> None:
        """After a resume, drop log lines of steps that will be run again."""
        if not self.main or not self.path.exists():
            return
        keep = [line for line in self.path.read_text(encoding="utf-8").splitlines()
                if line.strip() and json.loads(line).get("step", 0) <= step]
        self.path.write_text("".join(k + "\n" for k in keep), encoding="utf-8")

    def plan(self, plan: Plan, recipe: Recipe, model: Electra, precision: str, device: torch.device, command: str) -> None:
        if not self.main:
            return
        from rich.table import Table

        from tinyelectra.flops import format_flops

        t = Table(title=f"plan: {recipe.name}, budget {plan.budget}" + (" (provisional until throughput is measured)" if plan.status == "provisional" else ""),
                  show_header=False, title_justify="left")
        if plan.status == "provisional":
            t.add_row("steps", "as many as fit: planned from the throughput measured over the first steps, then re-planned as it goes")
        else:
            t.add_row("steps", f"{plan.total_steps:,} (warm-up {plan.warmup_steps:,})")
        t.add_row("batch", f"{plan.batch_size} x {plan.seq_len} = {plan.tokens_per_step:,} tokens per step")
        if plan.status == "provisional":
            t.add_row("checkpoints", "at 6.25%, 12.5%, 25%, 50% and 100% of the steps")
            t.add_row("FLOPs per step, paper convention", format_flops(plan.train_flops_paper_per_step))
            t.add_row("FLOPs per step, hardware convention", format_flops(plan.train_flops_hardware_per_step))
        else:
            t.add_row("token positions (padding included)", f"{plan.expected_tokens:,}")
            t.add_row("checkpoints", ", ".join(f"{k}@{v:,}" for k, v in plan.checkpoint_steps.items()))
            t.add_row("FLOPs, paper convention", format_flops(plan.train_flops_paper))
            t.add_row("FLOPs, hardware convention", format_flops(plan.train_flops_hardware))
        if plan.budget_seconds:
            t.add_row("wall-clock budget", f"{plan.budget_seconds:,.0f} s of training time")
        t.add_row("model", f"{count_parameters(model):,} parameters, {precision} on {device_name(device)}")
        self.console.print(t)

    def summary(self, s: dict, plan: Plan) -> None:
        from rich.table import Table

        from tinyelectra.flops import format_flops

        t = Table(title="FLOPs report", show_header=False, title_justify="left")
        t.add_row("steps / tokens", f"{s['steps']:,} / {s['tokens_seen']:,}")
        t.add_row(plan.conventions["paper"], format_flops(s["train_flops_paper"]))
        t.add_row(plan.conventions["hardware"], format_flops(s["train_flops_hardware"]))
        budget_txt = f" (budget {s['budget_seconds']:.0f} s)" if s["budget_seconds"] else ""
        t.add_row("training time", f"{s['train_seconds']:.1f} s{budget_txt}")
        t.add_row("excluded", f"checkpoints/eval/state {s['excluded_seconds']['checkpoints_eval_state']:.1f} s")
        t.add_row("checkpoints", ", ".join(s["checkpoints"]))
        self.console.print(t)


class Progress:
    """A rich progress bar: step, losses, accuracies, lr, tokens/s, MFU, ETA to the next checkpoint and the end.
    When stderr is not a terminal (CI logs), one plain line per log step instead."""

    def __init__(self, plan: Plan, step: int, main: bool) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress as RichProgress, TextColumn, TimeRemainingColumn

        self.main = main
        self.console = Console(stderr=True)
        self.live = main and self.console.is_terminal
        self.plan = plan
        self.t0 = time.perf_counter()
        self.step0 = step
        if self.live:
            self.bar = RichProgress(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                                    TextColumn("{task.fields[info]}"), console=self.console, transient=False)
            self.task = self.bar.add_task("train", total=plan.total_steps, completed=step, info="")
            self.bar.start()

    def replan(self, plan: Plan) -> None:
        self.plan = plan
        if self.live:
            self.bar.update(self.task, total=plan.total_steps)

    def update(self, step: int, rec: dict) -> None:
        if not self.main:
            return
        rate = (step - self.step0) / max(time.perf_counter() - self.t0, 1e-9)
        upcoming = [s for s in self.plan.checkpoint_steps.values() if s > step]
        eta_ckpt = (min(upcoming) - step) / rate if upcoming and rate > 0 else 0.0
        eta_end = (self.plan.total_steps - step) / rate if rate > 0 else float("inf")
        parts = [f"loss g {rec['gen_loss']:.3f}"]
        if "disc_loss" in rec:
            parts.append(f"d {rec['disc_loss']:.4f}")
        parts.append(f"acc g {rec.get('gen_acc', 0):.3f}")
        if "disc_acc" in rec:
            parts.append(f"d {rec['disc_acc']:.3f}")
        parts += [f"lr {rec['lr']:.2e}", f"{rec['tokens_per_second']:,.0f} tok/s"]
        if rec.get("mfu") is not None:
            parts.append(f"MFU {100 * rec['mfu']:.1f}%")
        parts += [f"next ckpt {_hms(eta_ckpt)}", f"end {_hms(eta_end)}"]
        info = " | ".join(parts)
        if self.live:
            self.bar.update(self.task, completed=step, info=info)
        else:
            self.console.print(f"step {step}/{self.plan.total_steps} | {info}", highlight=False)

    def note(self, text: str) -> None:
        if self.main:
            (self.bar.console if self.live else self.console).print(f"[dim]·[/dim] {text}", highlight=False)

    def close(self) -> None:
        if self.live:
            self.bar.stop()
            self.live = False


def _hms(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    s = int(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"
