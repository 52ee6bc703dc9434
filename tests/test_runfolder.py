"""One writer per output folder, nothing written outside it, a run folder holds a run or nothing, and a run knows its
data (tinyelectra/runfolder.py, train.open_run_dir):

- two real `train` processes on one --out: the second (and a --resume beside the live run) is refused with one line
  naming the first's pid; a run killed with SIGKILL leaves its lock behind, and the same command takes it over and
  finishes the run, every step logged once;
- `glue` and `export` refuse an --out that another process holds (a real second process holds the lock), and say
  when the holder is on another machine (NFS) that its life cannot be checked from here;
- a name read from a file (a recipe's name) that would put the run folder elsewhere is refused;
- `train --out` into a folder of one's own files, or a prepared dataset, is refused; --force keeps what tinyelectra
  did not write and refuses to replace a folder of one's own that has a name the run writes;
- `--resume` with another dataset of the same size (same vocabulary, same rows, other text) is refused naming both;
  a run written before runs recorded their data is continued with a note, and recorded from then on.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from test_bad_input import assert_one_line, in_process

LOCK_NAME = ".tinyelectra.lock"  # where a folder's lock lives (runfolder.LOCK_NAME)

SMALL = ["--set", "model.num_layers=2", "--set", "train.batch_size=8", "--set", "train.eval_rows=32"]


def cli(args: list[str], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tinyelectra", *args], env=env, capture_output=True, text=True,
                          timeout=900)


def wait_for(predicate, what: str, process: subprocess.Popen | None = None, seconds: float = 600) -> None:
    end = time.monotonic() + seconds
    while not predicate():
        assert process is None or process.poll() is None, f"the process ended before {what}: {process.stderr.read()}"
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.2)


def lock_record(folder: Path) -> dict:
    try:
        return json.loads((folder / LOCK_NAME).read_text())
    except (OSError, ValueError):
        return {}


@pytest.mark.slow
@pytest.mark.cli
def test_a_second_train_on_a_live_run_is_refused_and_a_killed_runs_lock_is_taken_over(tmp_path, cli_env):
    """A: a new run, killed with SIGKILL once its first resume state exists; B: A's command with --resume (the way
    on after a kill), which takes over the lock A left, held while B trains (B is paused with SIGSTOP: a stopped
    process still holds its lock, and the checks below cannot race its end). While B holds it, B's own command
    and A's (without --resume) are refused naming B's pid, and write nothing. B killed with SIGKILL; its command
    again takes over and finishes the run: 60 steps, each logged once, the lock file gone."""
    run = tmp_path / "run"
    first = ["train", "--recipe", "tiny", "--budget", "60steps", "--device", "cpu", *SMALL,
             "--set", "train.log_every_steps=1", "--out", str(run)]
    again = [*first, "--resume"]
    a = subprocess.Popen([sys.executable, "-m", "tinyelectra", *first], env=cli_env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: (run / "state" / "LATEST").is_file(), "A's first resume state", a)
        assert lock_record(run)["pid"] == a.pid
    finally:
        a.kill()
        a.wait()
    assert lock_record(run)["pid"] == a.pid  # left behind by the killed process

    b = subprocess.Popen([sys.executable, "-m", "tinyelectra", *again], env=cli_env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: lock_record(run).get("pid") == b.pid and (run / "metrics.jsonl").is_file()
                 and (run / "metrics.jsonl").read_text().count("\n") >= 2, "B training", b)
        os.kill(b.pid, signal.SIGSTOP)
        metrics_before = (run / "metrics.jsonl").read_bytes()
        for args in (again, first):
            p = cli(args, cli_env)
            assert_one_line(p.returncode, p.stderr, f"--out {run}: in use by tinyelectra train",
                            f"pid {b.pid} on this machine")
        assert (run / "metrics.jsonl").read_bytes() == metrics_before  # the refused commands wrote nothing
    finally:
        b.kill()
        b.wait()
    took_over = b.stderr.read()
    assert "taking over the lock left by tinyelectra train" in took_over and f"pid {a.pid} " in took_over

    p = cli(again, cli_env)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "taking over the lock left by" in p.stderr and f"pid {b.pid} " in p.stderr
    steps = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines() if '"event"' not in x]
    assert steps == list(range(1, 61))  # every step once
    assert json.loads((run / "summary.json").read_text())["steps"] == 60
    assert not (run / LOCK_NAME).exists()


HOLD = """
import json, sys, time
from pathlib import Path
from tinyelectra.runfolder import holding
folder, host = Path(sys.argv[1]), sys.argv[2]
with holding(folder, "--out"):
    if host:  # a holder on another machine (NFS): its record names that machine
        path = folder / ".tinyelectra.lock"
        record = json.loads(path.read_text())
        path.write_text(json.dumps({**record, "host": host}))
    print("held", flush=True)
    sys.stdin.read()
"""


class Holder:
    """A second real process holding an output folder's lock until closed."""

    def __init__(self, folder: Path, env: dict, host: str = "") -> None:
        self.p = subprocess.Popen([sys.executable, "-c", HOLD, str(folder), host], env=env,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.p.stdout.readline().strip() == "held"

    def close(self) -> None:
        self.p.stdin.close()
        self.p.wait(timeout=60)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    from test_glue import make_checkpoint

    return make_checkpoint(tmp_path_factory.mktemp("ckpt") / "ckpt-10000")


def test_glue_and_export_refuse_an_out_another_process_holds(ckpt, tmp_path, cli_env, monkeypatch, capsys):
    from test_glue import write_sst2_like

    glue_dir = write_sst2_like(tmp_path / "glue", train_rows=16, dev_rows=8)
    out = tmp_path / "g"
    holder = Holder(out, cli_env)
    try:
        code, err = in_process(["glue", "--checkpoint", str(ckpt), "--glue-dir", str(glue_dir), "--tasks", "sst2",
                                "--seeds", "1", "--device", "cpu", "--set", "epochs=1", "--out", str(out)],
                               cli_env, monkeypatch, capsys)
        assert_one_line(code, err, f"--out {out}: in use by", f"pid {holder.p.pid} on this machine")
        assert not (out / "ckpt-10000").exists()
    finally:
        holder.close()
    assert not out.exists()  # the holder made it for its lock only, and removed it

    export = tmp_path / "hf"
    holder = Holder(export, cli_env, host="gpu-node-7")
    try:
        code, err = in_process(["export", str(ckpt), "--out", str(export)], cli_env, monkeypatch, capsys)
        assert_one_line(code, err, f"--out {export}: in use by", "on machine gpu-node-7",
                        "cannot be checked from this machine", f"delete {export / LOCK_NAME}")
        assert [p.name for p in export.iterdir()] == [LOCK_NAME]  # the holder's, and nothing of the export's
    finally:
        holder.close()
    assert not export.exists()
    code, err = in_process(["export", str(ckpt), "--out", str(export)], cli_env, monkeypatch, capsys)
    assert code == 0, err
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith((".hf", "hf"))) == ["hf"]
    assert sorted(p.name for p in export.iterdir()) == [".tinyelectra.written", "discriminator", "generator"]


def test_a_file_system_without_locks_is_said_and_the_command_goes_on(tmp_path, monkeypatch, capsys):
    import errno
    import fcntl

    from tinyelectra.runfolder import holding

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    with holding(tmp_path / "out", "--out"):
        assert (tmp_path / "out").is_dir()
    assert "cannot lock files (No locks available); going on without a lock" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_recipe_name_that_is_a_path_is_refused(tmp_path, cli_env, monkeypatch, capsys):
    """Without --out the run folder is runs/NAME-BUDGET, NAME from the recipe file: a name with ../ would put it
    outside runs/."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()  # earlier runs
    recipe = tmp_path / "r.toml"
    recipe.write_text('name = "../escaped"\n[model]\nnum_layers = 2\n')
    code, err = in_process(["train", "--recipe", str(recipe), "--budget", "1steps", "--device", "cpu", *SMALL],
                           cli_env, monkeypatch, capsys)
    assert_one_line(code, err, "recipe name '../escaped'", "path separator")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.toml", "runs"] and not any((tmp_path / "runs").iterdir())


TRAIN = ["train", "--recipe", "tiny", "--budget", "2steps", "--device", "cpu", *SMALL]


@pytest.fixture(scope="module")
def datasets(tmp_path_factory) -> tuple[Path, Path]:
    return two_datasets(tmp_path_factory.mktemp("data"))


def test_an_out_of_ones_own_files_or_a_dataset_is_refused(datasets, tmp_path, cli_env, monkeypatch, capsys):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("my own work")
    code, err = in_process([*TRAIN, "--out", str(mine)], cli_env, monkeypatch, capsys)
    assert_one_line(code, err, f"--out {mine}: holds files that are not a tinyelectra run (thesis.tex)")
    assert sorted(p.name for p in mine.iterdir()) == ["thesis.tex"]

    data = tmp_path / "data"
    shutil.copytree(datasets[0], data)
    before = sorted(p.name for p in data.iterdir())
    code, err = in_process([*TRAIN, "--data", str(data), "--out", str(data)], cli_env, monkeypatch, capsys)
    assert_one_line(code, err, f"--out {data}: holds a prepared dataset (give it as --data)")
    assert sorted(p.name for p in data.iterdir()) == before


@pytest.mark.slow
def test_force_keeps_what_tinyelectra_did_not_write(tmp_path, cli_env, monkeypatch, capsys):
    run = tmp_path / "run"
    code, err = in_process([*TRAIN, "--out", str(run)], cli_env, monkeypatch, capsys)
    assert code == 0, err
    (run / "notes.txt").write_text("what I tried")
    (run / "ckpt-0625.old").mkdir()  # a folder of one's own beside the checkpoints
    code, err = in_process([*TRAIN, "--out", str(run), "--force"], cli_env, monkeypatch, capsys)
    assert code == 0, err
    assert "kept everything else: ckpt-0625.old, notes.txt" in err
    assert (run / "notes.txt").read_text() == "what I tried" and (run / "ckpt-0625.old").is_dir()
    # RUN/glue while a `tinyelectra glue` (a real second process) holds it: --force does not pull it away
    holder = Holder(run / "glue", cli_env)
    try:
        code, err = in_process([*TRAIN, "--out", str(run), "--force"], cli_env, monkeypatch, capsys)
        assert_one_line(code, err, f"--force: {run / 'glue'}: in use by", f"pid {holder.p.pid}")
        assert (run / "summary.json").is_file()
    finally:
        holder.close()
    # a folder of one's own under a name the run writes (ckpt-5000): neither deleted by --force nor replaced
    shutil.rmtree(run / "ckpt-5000")
    (run / "ckpt-5000").mkdir()
    (run / "ckpt-5000" / "plots.png").write_bytes(b"mine")
    code, err = in_process([*TRAIN, "--out", str(run), "--force"], cli_env, monkeypatch, capsys)
    assert_one_line(code, err, "ckpt-5000 is not what tinyelectra writes under that name")
    assert (run / "ckpt-5000" / "plots.png").read_bytes() == b"mine" and (run / "summary.json").is_file()


def two_datasets(tmp_path: Path) -> tuple[Path, Path]:
    """Two prepared datasets of the same size and vocabulary but other text: B is A with every line's words in
    reverse order (the same words, so the same WordPiece; the same token count per line, so the same rows)."""
    from tinyelectra.prepare import prepare

    words = "the a cat dog sat ran on under mat tree big small red blue quickly slowly".split()
    lines_a = [" ".join(words[(d * 7 + s * 3 + k) % len(words)] for k in range(6 + (d + s) % 5))
               for d in range(300) for s in range(3)]
    docs_a = "\n\n".join("\n".join(lines_a[3 * d:3 * d + 3]) for d in range(300))
    docs_b = "\n".join(" ".join(reversed(line.split())) if line else line for line in docs_a.split("\n"))
    out = []
    for name, text in (("a", docs_a), ("b", docs_b)):
        (tmp_path / f"{name}.txt").write_text(text)
        prepare([str(tmp_path / f"{name}.txt")], tmp_path / name, vocab_size=200, seq_len=128, quiet=True,
                validation_fraction=0.0)
        out.append(tmp_path / name)
    return out[0], out[1]


@pytest.mark.slow
def test_resume_with_other_data_of_the_same_size_is_refused(datasets, tmp_path, cli_env, monkeypatch, capsys):
    a, b = datasets
    ma, mb = (json.loads((d / "manifest.json").read_text()) for d in (a, b))
    assert ma["tokenizer"]["fingerprint"] == mb["tokenizer"]["fingerprint"]  # the same vocabulary ...
    assert ma["splits"]["train"]["rows"] == mb["splits"]["train"]["rows"]  # ... and size: only the text differs
    run = tmp_path / "run"
    code, err = in_process([*TRAIN, "--data", str(a), "--out", str(run)], cli_env, monkeypatch, capsys)
    assert code == 0, err
    recorded = json.loads((run / "dataset.json").read_text())
    assert recorded["path"] == str(a.resolve()) and recorded["rows"]["train"] == ma["splits"]["train"]["rows"]
    assert json.loads((run / "summary.json").read_text())["data"] == recorded
    (run / "summary.json").unlink()  # unfinished: --resume continues it
    code, err = in_process([*TRAIN, "--data", str(b), "--out", str(run), "--resume"], cli_env, monkeypatch, capsys)
    line = assert_one_line(code, err, f"{run} was trained on {a.resolve()}", f"this command gives {b.resolve()}",
                           recorded["fingerprint"][:12], "the same sizes, other content")
    assert "--force" in line
    code, err = in_process([*TRAIN, "--data", str(a), "--out", str(run), "--resume"], cli_env, monkeypatch, capsys)
    assert code == 0, err

    # a run written before runs recorded their data: continued, said once, recorded from then on
    (run / "summary.json").unlink()
    as_written_before_data_records(run)
    code, err = in_process([*TRAIN, "--data", str(b), "--out", str(run), "--resume"], cli_env, monkeypatch, capsys)
    assert code == 0, err
    assert "was started before runs recorded their data" in err and "recording it in dataset.json" in err
    assert json.loads((run / "dataset.json").read_text())["path"] == str(b.resolve())


def as_written_before_data_records(run: Path) -> None:
    """What a run folder of a tinyelectra before runs recorded their data looks like: no dataset.json, no record of
    its files, a resume state without the data."""
    (run / "dataset.json").unlink()
    (run / ".tinyelectra.written").unlink()
    drop_the_data_from_the_resume_state(run)


def drop_the_data_from_the_resume_state(run: Path) -> None:
    """The latest resume state's trainer.json without its `data` (its sha256.json written again, as a tinyelectra
    before runs recorded their data wrote it)."""
    from tinyelectra.checkpoint import latest_state
    from tinyelectra.files import write_sha256

    state = latest_state(run)
    info = json.loads((state / "trainer.json").read_text())
    del info["data"]
    (state / "trainer.json").write_text(json.dumps(info))
    (state / "sha256.json").unlink()
    write_sha256(state)
