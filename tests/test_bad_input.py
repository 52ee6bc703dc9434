"""Bad input, damaged files and a full or unwritable output location (issue 11, point 3 and `glue --out`): each is
one line on stderr starting "error: ", exit code 2, no traceback, no advice to unpickle (`weights_only=False`), and
nothing half-written.

One real 8-step run (module fixture) provides a resume state and checkpoints to damage. Cases that fail before the
model is built run in this process (`tinyelectra.cli.main`); the others, and every "full disk" (a per-process file
size limit: writing past it fails with EFBIG, as a full disk fails with ENOSPC), run as subprocesses.
"""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SMALL = ["--set", "model.num_layers=2", "--set", "train.batch_size=8", "--set", "train.eval_rows=32"]
TRAIN = ["train", "--recipe", "tiny", "--budget", "8steps", "--device", "cpu", *SMALL]


@pytest.fixture(scope="module")
def done_run(cli_env, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("done") / "run"
    p = subprocess.run([sys.executable, "-m", "tinyelectra", *TRAIN, "--out", str(run)], env=cli_env,
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    return run


@pytest.fixture
def resumable(done_run, tmp_path) -> Path:
    """A copy of the run whose summary.json is gone: `--resume` loads its resume state."""
    run = tmp_path / "run"
    shutil.copytree(done_run, run)
    (run / "summary.json").unlink()
    return run


def state_file(run: Path, name: str) -> Path:
    return run / "state" / (run / "state" / "LATEST").read_text().strip() / name


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def flip_byte(path: Path, from_end: int = 100) -> None:
    data = bytearray(path.read_bytes())
    data[-from_end] ^= 0xFF  # inside the last tensor's data, past the header: still a well-formed file
    path.write_bytes(bytes(data))


def as_written_before_checksums(directory: Path, described_by: str) -> None:
    """What a checkpoint or resume state written before checksums existed looks like: no sha256.json, and no marker
    saying one was written in the JSON file describing it."""
    (directory / "sha256.json").unlink()
    path = directory / described_by
    raw = json.loads(path.read_text(encoding="utf-8"))
    del raw["checksums"]
    path.write_text(json.dumps(raw), encoding="utf-8")


def drop_sha256_entries(directory: Path, *names: str) -> None:
    sums = json.loads((directory / "sha256.json").read_text())
    (directory / "sha256.json").write_text(json.dumps({k: v for k, v in sums.items() if k not in names}))


def garbage(path: Path) -> None:
    path.write_bytes(b"\x80\x02not a pickle at all" + bytes(range(256)))


def in_process(args: list[str], env: dict, monkeypatch, capsys) -> tuple[int, str]:
    from tinyelectra import cli

    monkeypatch.setenv("TINYELECTRA_CACHE", env["TINYELECTRA_CACHE"])
    monkeypatch.setattr(sys, "argv", ["tinyelectra", *args])
    with pytest.raises(SystemExit) as exc:
        cli.main()
    return exc.value.code, capsys.readouterr().err


def subprocess_run(args: list[str], env: dict, limit_file_bytes: int | None = None) -> tuple[int, str]:
    def limit():
        import resource
        import signal

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_file_bytes, limit_file_bytes))

    p = subprocess.run([sys.executable, "-m", "tinyelectra", *args], env=env, capture_output=True, text=True,
                       timeout=900, preexec_fn=limit if limit_file_bytes else None)
    return p.returncode, p.stderr


def assert_one_line(code: int, err: str, *needles: str) -> str:
    lines = [line for line in err.strip().splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error: ")]
    assert code == 2, (code, err[-3000:])
    assert len(errors) == 1 and lines[-1] == errors[0], err[-3000:]
    assert "Traceback" not in err and "weights_only" not in err, err[-3000:]
    for n in needles:
        assert n in errors[0], (n, errors[0])
    return errors[0]


def no_temporary_files(root: Path) -> None:
    leftovers = [p for p in root.rglob("*") if ".tmp" in p.name or p.name.startswith(".write-test")]
    assert not leftovers, leftovers


# ---------------------------------------------------------------------------------------------------------------
# damaged resume states: `train --resume`

DAMAGED_STATE = {  # case: (damage(run), what the error names)
    "model.safetensors truncated": (lambda r: truncate(state_file(r, "model.safetensors")), ["model.safetensors"]),
    "model.safetensors one byte flipped": (lambda r: flip_byte(state_file(r, "model.safetensors")),
                                           ["model.safetensors", "sha256"]),
    "optimizer.pt truncated": (lambda r: truncate(state_file(r, "optimizer.pt")), ["optimizer.pt"]),
    "optimizer.pt corrupt": (lambda r: garbage(state_file(r, "optimizer.pt")), ["optimizer.pt"]),
    "trainer.json corrupt": (lambda r: state_file(r, "trainer.json").write_text('{"step": 8, "form'), ["trainer.json"]),
    "sha256.json corrupt": (lambda r: state_file(r, "sha256.json").write_text("[1, 2"), ["sha256.json"]),
    "sha256.json missing": (lambda r: state_file(r, "sha256.json").unlink(), ["sha256.json", "incomplete or damaged"]),
    "LATEST corrupt": (lambda r: (r / "state" / "LATEST").write_text("../../etc"), ["LATEST"]),
    # a listing with an entry removed, or emptied, must not let the file it no longer lists through
    "sha256.json without model.safetensors, which is flipped": (
        lambda r: (flip_byte(state_file(r, "model.safetensors")),
                   drop_sha256_entries(state_file(r, "sha256.json").parent, "model.safetensors")),
        ["sha256.json", "no entry for model.safetensors"]),
    "sha256.json emptied, model.safetensors flipped": (
        lambda r: (flip_byte(state_file(r, "model.safetensors")), state_file(r, "sha256.json").write_text("{}")),
        ["sha256.json", "no entries"]),
    "plan.json corrupt": (lambda r: (r / "plan.json").write_text('{"budget": "8st'), ["plan.json", "damaged"]),
    "recipe.json corrupt": (lambda r: (r / "recipe.json").write_bytes(b"\x00\xff\xfe"), ["recipe.json", "damaged"]),
    "recipe.json missing": (lambda r: (r / "recipe.json").unlink(), ["recipe.json", "missing"]),
}


@pytest.mark.parametrize("case", list(DAMAGED_STATE))
@pytest.mark.cli
@pytest.mark.slow
def test_damaged_resume_state(case, resumable, cli_env, monkeypatch, capsys):
    damage, needles = DAMAGED_STATE[case]
    damage(resumable)
    code, err = in_process([*TRAIN, "--out", str(resumable), "--resume"], cli_env, monkeypatch, capsys)
    assert_one_line(code, err, *needles)


@pytest.mark.parametrize("stop", [[], ["--stop-after", "8steps"]], ids=["resumed", "stop-already-reached"])
@pytest.mark.cli
@pytest.mark.slow
def test_a_resume_checks_its_state_once(stop, resumable, cli_env, monkeypatch, capsys):
    """`train --resume` checks the resume state's files against its sha256.json once for the whole start-up, then
    loads it (the run here is at its last step: it finishes at once); before, each part of the start-up that read it
    checked it again (three times; twice when a --stop-after was already reached)."""
    from tinyelectra import checkpoint

    checked = []

    def verify_sha256(directory, what, **kw):
        checked.append((Path(directory).name, what))
        return real(directory, what, **kw)

    real = checkpoint.verify_sha256
    monkeypatch.setattr(checkpoint, "verify_sha256", verify_sha256)
    code, err = in_process([*TRAIN, *stop, "--out", str(resumable), "--resume"], cli_env, monkeypatch, capsys)
    assert code == 0, err[-3000:]
    if stop:
        assert "already past --stop-after 8steps: nothing to do" in err and not (resumable / "summary.json").exists()
    else:
        assert json.loads((resumable / "summary.json").read_text())["steps"] == 8
    assert checked == [("step-000000008", "the resume state")]


@pytest.mark.slow
@pytest.mark.parametrize("case", ["model.safetensors truncated", "optimizer.pt corrupt", "optimizer.pt truncated"])
@pytest.mark.cli
def test_damaged_resume_state_without_checksums(case, resumable, cli_env):
    """A state written before checksums existed (no sha256.json): the loaders' own errors are one line too, and the
    optimizer state's does not repeat torch's advice to load with weights_only=False."""
    as_written_before_checksums(state_file(resumable, "trainer.json").parent, "trainer.json")
    damage, needles = DAMAGED_STATE[case]
    damage(resumable)
    assert_one_line(*subprocess_run([*TRAIN, "--out", str(resumable), "--resume"], cli_env), needles[0])


# ---------------------------------------------------------------------------------------------------------------
# damaged checkpoints, export, glue


@pytest.mark.cli
def test_flipped_byte_in_a_checkpoint_is_named(done_run, tmp_path, cli_env, monkeypatch, capsys):
    ckpt = tmp_path / "ckpt-10000"
    shutil.copytree(done_run / "ckpt-10000", ckpt)
    flip_byte(ckpt / "discriminator.safetensors")
    code, err = in_process(["export", str(ckpt), "--out", str(tmp_path / "hf")], cli_env, monkeypatch, capsys)
    assert_one_line(code, err, "discriminator.safetensors", "sha256")
    assert not (tmp_path / "hf").exists()
    glue_dir = sst2(tmp_path / "glue")
    code, err = in_process(["glue", "--checkpoint", str(ckpt), "--glue-dir", str(glue_dir), "--tasks", "sst2",
                            "--device", "cpu", "--out", str(tmp_path / "g")], cli_env, monkeypatch, capsys)
    assert_one_line(code, err, "discriminator.safetensors", "sha256")


@pytest.mark.cli
def test_truncated_checkpoint_without_checksums(done_run, tmp_path, cli_env, monkeypatch, capsys):
    """A checkpoint written before checksums existed: a warning naming it, and the loader's own checks still hold."""
    ckpt = tmp_path / "ckpt-10000"
    shutil.copytree(done_run / "ckpt-10000", ckpt)
    as_written_before_checksums(ckpt, "config.json")
    truncate(ckpt / "generator.safetensors")
    code, err = in_process(["export", str(ckpt), "--out", str(tmp_path / "hf")], cli_env, monkeypatch, capsys)
    assert_one_line(code, err, "generator.safetensors")
    assert f"warning: {ckpt}: the checkpoint has no sha256.json (written before checksums existed)" in err


@pytest.mark.parametrize("listing", ["entry removed", "emptied"])
@pytest.mark.cli
def test_a_sha256_json_that_leaves_a_file_out_is_refused(listing, done_run, tmp_path, cli_env, monkeypatch, capsys):
    """A flipped byte in the discriminator, whose entry is then removed from sha256.json (or the listing emptied):
    before, export checked only what was listed and wrote the damaged weights (exit 0)."""
    ckpt = tmp_path / "ckpt-10000"
    shutil.copytree(done_run / "ckpt-10000", ckpt)
    flip_byte(ckpt / "discriminator.safetensors")
    if listing == "emptied":
        (ckpt / "sha256.json").write_text("{}")
    else:
        drop_sha256_entries(ckpt, "discriminator.safetensors")
    code, err = in_process(["export", str(ckpt), "--out", str(tmp_path / "hf")], cli_env, monkeypatch, capsys)
    assert_one_line(code, err, str(ckpt / "sha256.json"),
                    "no entries" if listing == "emptied" else "no entry for discriminator.safetensors")
    assert not (tmp_path / "hf").exists()


@pytest.mark.parametrize("command", ["export", "glue"])
@pytest.mark.cli
def test_checkpoint_without_its_sha256_json_is_refused(command, done_run, tmp_path, cli_env, monkeypatch, capsys):
    """Every checkpoint this version writes has a sha256.json (its config.json says so): deleting it from a damaged
    checkpoint does not make the damage pass unchecked."""
    ckpt = tmp_path / "ckpt-10000"
    shutil.copytree(done_run / "ckpt-10000", ckpt)
    flip_byte(ckpt / "discriminator.safetensors")
    (ckpt / "sha256.json").unlink()
    args = {"export": ["export", str(ckpt), "--out", str(tmp_path / "hf")],
            "glue": ["glue", "--checkpoint", str(ckpt), "--glue-dir", str(sst2(tmp_path / "glue")), "--tasks", "sst2",
                     "--device", "cpu", "--out", str(tmp_path / "g")]}[command]
    code, err = in_process(args, cli_env, monkeypatch, capsys)
    assert_one_line(code, err, str(ckpt), "no sha256.json", "incomplete or damaged")
    assert not (tmp_path / "hf").exists()


@pytest.mark.cli
def test_export_without_a_tokenizer(done_run, tmp_path, cli_env, monkeypatch, capsys):
    ckpt = tmp_path / "ckpt-10000"
    shutil.copytree(done_run / "ckpt-10000", ckpt)
    shutil.rmtree(ckpt / "tokenizer")
    code, err = in_process(["export", str(ckpt), "--out", str(tmp_path / "hf")], cli_env, monkeypatch, capsys)
    assert_one_line(code, err, "tokenizer")
    assert not (tmp_path / "hf").exists()


def test_unloadable_transformers_weights_do_not_advise_weights_only_false(tmp_path, cli_env, monkeypatch, capsys):
    """A transformers directory whose pytorch_model.bin is not a weights file: torch's own error advises loading it
    with weights_only=False (which would run whatever the file holds); ours names the directory and stops there."""
    from transformers import ElectraConfig

    d = tmp_path / "hf"
    ElectraConfig(vocab_size=120, embedding_size=16, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                  intermediate_size=64).save_pretrained(d)
    (d / "pytorch_model.bin").write_bytes(b"\x80\x02garbage" + bytes(300))
    code, err = in_process(["glue", "--checkpoint", str(d), "--glue-dir", str(sst2(tmp_path / "glue")), "--tasks",
                            "sst2", "--device", "cpu", "--out", str(tmp_path / "g")], cli_env, monkeypatch, capsys)
    assert_one_line(code, err, str(d), "not a readable PyTorch weights file")


def sst2(glue_dir: Path) -> Path:
    folder = glue_dir / "SST-2"
    folder.mkdir(parents=True)
    rows = "".join(f"{'a good film' if i % 2 else 'a bad film'} number {i}\t{i % 2}\n" for i in range(16))
    for name in ("train", "dev"):
        (folder / f"{name}.tsv").write_text("sentence\tlabel\n" + rows, encoding="utf-8")
    return glue_dir


# ---------------------------------------------------------------------------------------------------------------
# damaged inputs of `report`: one line naming the file, never a quiet omission


def glue_json(run: Path, text: str) -> None:
    (run / "glue" / "ckpt-10000").mkdir(parents=True)
    (run / "glue" / "ckpt-10000" / "glue.json").write_text(text, encoding="utf-8")


DAMAGED_REPORT = {  # case: (damage(run), what the error names)
    "metrics.jsonl random bytes": (lambda r: (r / "metrics.jsonl").write_bytes(random.Random(0).randbytes(2000)),
                                   ["metrics.jsonl", "damaged"]),
    "summary.json a list": (lambda r: (r / "summary.json").write_text("[]"), ["summary.json", "not the object"]),
    "plan.json a number": (lambda r: (r / "plan.json").write_text("3"), ["plan.json", "not the object"]),
    "summary.json FLOPs a string": (lambda r: (r / "summary.json").write_text('{"train_flops_paper": "many"}'),
                                    ["summary.json", "train_flops_paper", "not a number"]),
    "glue.json cut short": (lambda r: glue_json(r, '{"format": "tinyelectra-glue", "tasks": {"ss'),
                            ["glue.json", "cannot read it as JSON"]),
    "glue.json a task that is not a table": (
        lambda r: glue_json(r, '{"format": "tinyelectra-glue", "tasks": {"sst2": 3}}'), ["glue.json", "damaged"]),
    "glue.json a score that is text": (lambda r: glue_json(r, json.dumps({"format": "tinyelectra-glue", "tasks": {
        "sst2": {"paper_metric": "accuracy", "glue_metric": "accuracy", "median_paper": "high", "std_paper": None,
                 "median_glue": 1.0, "std_glue": None, "seeds": []}}})), ["glue.json", "median_paper", "not a number"]),
    "glue.json not tinyelectra's": (lambda r: glue_json(r, '{"tasks": {}}'), ["glue.json", "not GLUE results"]),
}


@pytest.mark.parametrize("case", list(DAMAGED_REPORT))
@pytest.mark.cli
def test_damaged_report_input(case, done_run, tmp_path, cli_env, monkeypatch, capsys):
    run = tmp_path / "run"
    shutil.copytree(done_run, run)
    damage, needles = DAMAGED_REPORT[case]
    damage(run)
    code, err = in_process(["report", str(run)], cli_env, monkeypatch, capsys)
    assert_one_line(code, err, *needles)
    assert not (run / "report.md").exists() and not (run / "report.json").exists()


@pytest.mark.cli
def test_report_on_a_file_says_it_is_a_file(done_run, cli_env, monkeypatch, capsys):
    code, err = in_process(["report", str(done_run / "summary.json")], cli_env, monkeypatch, capsys)
    line = assert_one_line(code, err, "summary.json", "a file, not a run directory")
    assert "no such" not in line


# ---------------------------------------------------------------------------------------------------------------
# output locations that cannot be written: a path through a regular file (unwritable even for root)


def unwritable_cases(run: Path, tmp: Path) -> dict[str, list[str]]:
    blocker = tmp / "a-file"
    blocker.write_text("not a directory")
    out = str(blocker / "out")
    corpus = tmp / "c.txt"
    corpus.write_text("\n\n".join(f"Document {i}.\nIts second line {i}." for i in range(40)), encoding="utf-8")
    return {
        "prepare": ["prepare", "--corpus", str(corpus), "--out", out, "--vocab-size", "300"],
        "train": [*TRAIN, "--out", out],
        "export": ["export", str(run / "ckpt-10000"), "--out", out],
        "report": ["report", str(run), "--out", out],
        "glue": ["glue", "--checkpoint", str(run / "ckpt-10000"), "--glue-dir", str(sst2(tmp / "glue")),
                 "--tasks", "sst2", "--device", "cpu", "--out", out],
    }


@pytest.mark.parametrize("command", ["prepare", "train", "export", "report", "glue"])
@pytest.mark.cli
def test_unwritable_output(command, done_run, tmp_path, cli_env, monkeypatch, capsys):
    args = unwritable_cases(done_run, tmp_path)[command]
    code, err = in_process(args, cli_env, monkeypatch, capsys)
    assert_one_line(code, err, "a-file")
    assert "fine-tuning" not in capsys.readouterr().out  # glue: refused before any fine-tuning
    no_temporary_files(tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("command", ["prepare", "train", "export", "report"])
@pytest.mark.cli
def test_full_output_location(command, done_run, tmp_path, cli_env):
    """Every file write past 200 kB (train, export) or 2 kB (prepare, report) fails, as on a full disk."""
    out = tmp_path / "out"
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n\n".join(f"Document {i} has a first sentence.\nAnd a second one about {i}."
                                  for i in range(300)), encoding="utf-8")
    args = {"prepare": ["prepare", "--corpus", str(corpus), "--out", str(out), "--vocab-size", "300"],
            "train": [*TRAIN, "--out", str(out)],
            "export": ["export", str(done_run / "ckpt-10000"), "--out", str(out)],
            "report": ["report", str(done_run), "--out", str(out)]}[command]
    limit = 2_000 if command in ("prepare", "report") else 200_000
    code, err = subprocess_run(args, cli_env, limit_file_bytes=limit)
    line = assert_one_line(code, err)
    assert "too large" in line.lower(), line
    if command in ("prepare", "export"):  # all or nothing
        assert not out.exists()
    no_temporary_files(tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("what,target", [("checkpoint", "ckpt-0625"), ("resume state", "step-000000000")])
def test_full_disk_names_the_path_and_what_was_written(what, target, tmp_path, cli_env, monkeypatch, capsys):
    """A write that fails as on a full disk (ENOSPC from write(), which names no file): the one line says which
    checkpoint or resume state was being written, and no half-written directory stays."""
    real = Path.write_bytes

    def full(path: Path, data) -> int:
        if path.parent.name.startswith(f"{target}.tmp-"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(path, data)

    monkeypatch.setattr(Path, "write_bytes", full)
    run = tmp_path / "run"
    code, err = in_process([*TRAIN, "--out", str(run)], cli_env, monkeypatch, capsys)
    line = assert_one_line(code, err, "No space left on device", f"while writing the {what}", target)
    assert "nothing half-written was kept" in line
    assert not list(run.rglob(f"{target}*"))
    no_temporary_files(tmp_path)


def test_full_disk_while_appending_to_the_metrics_log_leaves_no_torn_line(tmp_path, monkeypatch):
    from tinyelectra import files

    log = tmp_path / "metrics.jsonl"
    log.write_text('{"step": 1}\n')

    class Full:  # writes half the bytes, then fails as a full disk does
        def __init__(self, f):
            self.f = f

        def write(self, data: bytes):
            self.f.write(data[: len(data) // 2])
            self.f.flush()
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        def __getattr__(self, name):
            return getattr(self.f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    monkeypatch.setattr(files, "open", lambda *a, **k: Full(open(*a, **k)), raising=False)
    with pytest.raises(files.WriteError) as e:
        files.append_line(log, '{"step": 2, "gen_loss": 1.0}', "metrics log")
    assert files.os_error_line(e.value) == (f"{log}: No space left on device while writing the metrics log "
                                            "(nothing half-written was kept)")
    assert log.read_text() == '{"step": 1}\n'


@pytest.mark.cli
def test_export_is_readable_by_others(done_run, tmp_path, cli_env, monkeypatch, capsys):
    """safetensors (like mkstemp) creates its files 0600; an export is meant to be shared: 0644 under umask 022, as
    every other file tinyelectra writes (the run's own files: 0666 minus the umask it was written under)."""
    ambient = os.umask(0o022)
    try:
        out = tmp_path / "hf"
        code, _ = in_process(["export", str(done_run / "ckpt-10000"), "--out", str(out)], cli_env, monkeypatch, capsys)
    finally:
        os.umask(ambient)
    assert code == 0
    exported = [p for p in out.rglob("*") if p.is_file()]
    assert {p.name for p in exported} >= {"model.safetensors", "config.json", "README.md"}
    assert {oct(stat.S_IMODE(p.stat().st_mode)) for p in exported} == {"0o644"}, exported
    run_files = [p for p in done_run.rglob("*") if p.is_file()]
    assert {oct(stat.S_IMODE(p.stat().st_mode)) for p in run_files} == {oct(0o666 & ~ambient)}, run_files


# ---------------------------------------------------------------------------------------------------------------
# arguments


@pytest.mark.parametrize("budget", ["1e400flops", "1e400steps", "inf flops", "nansteps"])
def test_budget_that_is_not_a_finite_number(budget, tmp_path, cli_env, monkeypatch, capsys):
    code, err = in_process(["train", "--recipe", "tiny", "--budget", budget, "--out", str(tmp_path / "r")], cli_env,
                           monkeypatch, capsys)
    assert_one_line(code, err, budget)
    assert not (tmp_path / "r").exists()


@pytest.mark.cli
def test_bad_budget_is_refused_before_torch_is_imported(tmp_path):
    script = ("import sys\nfrom tinyelectra.cli import main\nsys.argv = ['tinyelectra', 'train', '--budget', '4x']\n"
              "try:\n    main()\nexcept SystemExit as e:\n    print(e.code, 'torch' in sys.modules)\n")
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert p.stdout.split() == ["2", "False"], p.stdout + p.stderr
    assert p.stderr.startswith("error: budget '4x'")


def test_binary_file_as_recipe(tmp_path, cli_env, monkeypatch, capsys):
    binary = tmp_path / "model.bin"
    binary.write_bytes(bytes(range(256)) * 4)
    code, err = in_process(["train", "--recipe", str(binary), "--budget", "1steps", "--out", str(tmp_path / "r")],
                           cli_env, monkeypatch, capsys)
    assert_one_line(code, err, "model.bin")
    toml_binary = tmp_path / "r.toml"
    toml_binary.write_bytes(b"\xff\xfe\x00name = 1\x00")
    code, err = in_process(["flops", "--recipe", str(toml_binary)], cli_env, monkeypatch, capsys)
    assert_one_line(code, err, "r.toml")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_device_cuda_without_a_gpu_names_device(tmp_path, cli_env, monkeypatch, capsys):
    code, err = in_process(["train", "--recipe", "tiny", "--budget", "1steps", "--device", "cuda", "--out",
                            str(tmp_path / "r")], cli_env, monkeypatch, capsys)
    line = assert_one_line(code, err, "--device cuda", "--device cpu")
    assert "--gpu" not in line


@pytest.mark.cli
def test_resume_with_another_recipe_names_both(done_run, tmp_path, cli_env, monkeypatch, capsys):
    run = tmp_path / "run"
    shutil.copytree(done_run, run)
    code, err = in_process(["train", "--recipe", "electra-small", "--budget", "8steps", "--device", "cpu",
                            "--out", str(run), "--resume"], cli_env, monkeypatch, capsys)
    assert_one_line(code, err, "'tiny'", "'electra-small'")


@pytest.mark.cli
def test_damaged_data_shard_stops_the_set_up(done_run, tmp_path, cli_env, monkeypatch, capsys):
    """A truncated shard in --data (the issue's "data file that crashes the loader"): one line naming it, before the
    run directory is created, so the run can be started again once the data is prepared again."""
    data = tmp_path / "data"
    shutil.copytree(next(Path(cli_env["TINYELECTRA_CACHE"]).glob("builtin-v8192-*")), data)
    shard = sorted(data.glob("validation*ids*.npy"))[0]
    truncate(shard)
    out = tmp_path / "run"
    code, err = in_process([*TRAIN, "--data", str(data), "--out", str(out)], cli_env, monkeypatch, capsys)
    assert_one_line(code, err, shard.name, "prepare the data again")
    assert not out.exists()


@pytest.mark.cli
def test_shard_with_token_ids_beyond_the_vocabulary_stops_the_set_up(done_run, tmp_path, cli_env, monkeypatch, capsys):
    """A shard with one token id past the tokenizer's 8,192 entries in one row (damaged by hand, headers intact): one
    line naming the shard, the id and the vocabulary size, before the run directory is created. Before the check the
    run trained on while that row was not drawn (this 8-step run exits 0) and died with a 102-line IndexError at the
    step that drew it."""
    import numpy as np

    data = tmp_path / "data"
    shutil.copytree(next(Path(cli_env["TINYELECTRA_CACHE"]).glob("builtin-v8192-*")), data)
    shard = sorted(data.glob("train*ids*.npy"))[-1]
    ids = np.load(shard, mmap_mode="r+")
    ids[len(ids) // 2, 5] = 8192 + 7
    ids.flush()
    del ids
    out = tmp_path / "run"
    code, err = in_process([*TRAIN, "--data", str(data), "--out", str(out)], cli_env, monkeypatch, capsys)
    assert_one_line(code, err, shard.name, "token id 8199", "8192", "prepare the data again")
    assert not out.exists()


@pytest.mark.cli
def test_bad_input_after_the_run_directory_check_leaves_no_out(done_run, tmp_path, cli_env, monkeypatch, capsys):
    """--data of 128-token rows for a recipe set to 64 is found only after --out was checked: no empty --out is left."""
    data = next(Path(cli_env["TINYELECTRA_CACHE"]).glob("builtin-v8192-*"))
    out = tmp_path / "new" / "run"
    code, err = in_process(["train", "--recipe", "tiny", "--budget", "1steps", "--device", "cpu", "--data", str(data),
                            "--set", "train.seq_len=64", "--out", str(out)], cli_env, monkeypatch, capsys)
    assert_one_line(code, err, "128-token", "train.seq_len = 64")
    assert not (tmp_path / "new").exists()


# ---------------------------------------------------------------------------------------------------------------
# settings that are not finite numbers, do not fit or cannot work: one line in every command that takes --set


IMPOSSIBLE = {  # --set: what the error names ("1e400" is infinity; "1e30" steps does not fit int64)
    "optim.lr=inf": "optim.lr", "optim.lr=-inf": "optim.lr", "optim.eps=inf": "optim.eps",
    "optim.weight_decay=inf": "optim.weight_decay", "objective.temperature=inf": "objective.temperature",
    "objective.disc_weight=nan": "objective.disc_weight", "optim.clip_norm=inf": "optim.clip_norm",
    "model.dropout=nan": "model.dropout", "model.layer_norm_eps=inf": "model.layer_norm_eps",
    "train.resume_every_seconds=inf": "train.resume_every_seconds",
    "train.steps=1e400": "train.steps", "model.hidden_size=1e400": "model.hidden_size",
    "train.steps=1e30": "train.steps", "optim.warmup_steps=99999999999999999999": "optim.warmup_steps",
    "objective.mask_prob=0.001": "objective.mask_prob",  # no masked position in 128 tokens: was a oneDNN traceback
    "train.weight_copy=bf16": "train.weight_copy",  # cast or copy
}


@pytest.mark.parametrize("command", ["train", "flops", "recipe"])
@pytest.mark.parametrize("setting", list(IMPOSSIBLE))
def test_impossible_setting(setting, command, tmp_path, cli_env, monkeypatch, capsys):
    args = {"train": [*TRAIN, "--out", str(tmp_path / "r")], "flops": ["flops", "--recipe", "tiny"],
            "recipe": ["recipe", "tiny"]}[command]
    code, err = in_process([*args, "--set", setting], cli_env, monkeypatch, capsys)
    assert_one_line(code, err, IMPOSSIBLE[setting], setting.split("=")[1])
    assert not (tmp_path / "r").exists()


FINETUNE_NOT_FINITE = {"lr=inf": "'inf' is not a finite number", "finetune.weight_decay=inf": "'inf'",
                       "warmup_fraction=nan": "'nan'", "clip_norm=-inf": "'-inf'", "epochs=1e400": "'1e400'",
                       "batch_size=1e400": "'1e400'", "layerwise_decay=nan": "'nan'", "dropout=nan": "'nan'",
                       "seed=-1": "must be >= 0"}


def test_zero_fine_tuning_epochs_is_refused_not_the_default(tmp_path, cli_env, monkeypatch, capsys):
    """epochs=0 is the internal "the task's own" value; typed by a user it meant "no epochs", silently run as 3."""
    code, err = in_process(["glue", "--checkpoint", str(tmp_path), "--glue-dir", str(sst2(tmp_path / "glue")),
                            "--set", "finetune.epochs=0"], cli_env, monkeypatch, capsys)
    assert_one_line(code, err, "finetune.epochs=0", "train nothing", "leave epochs out")


def test_a_generator_size_that_fails_names_the_generator(tmp_path, cli_env, monkeypatch, capsys):
    """hidden 100,000 with one head is a valid discriminator; its generator (25,000 wide, 390 heads by the official
    rule) is not: the line named the discriminator's hidden size and num_heads before."""
    code, err = in_process(["flops", "--recipe", "tiny", "--set", "model.hidden_size=100000", "--set",
                            "model.num_heads=1"], cli_env, monkeypatch, capsys)
    line = assert_one_line(code, err, "model.generator_fraction", "generator of hidden size 25000", "390 heads")
    assert "must be divisible by num_heads" not in line


@pytest.mark.parametrize("kind", ["fifo", "character device"])
def test_a_corpus_that_is_not_a_regular_file_says_what_it_is(kind, tmp_path, cli_env, monkeypatch, capsys):
    if kind == "fifo":
        source = tmp_path / "pipe"
        os.mkfifo(source)
    else:
        source = Path("/dev/null")
    code, err = in_process(["prepare", "--corpus", str(source), "--out", str(tmp_path / "d")], cli_env, monkeypatch,
                           capsys)
    line = assert_one_line(code, err, str(source), "a named pipe (FIFO)" if kind == "fifo" else "a character device",
                           "not a regular file or folder")
    assert "no such file" not in line


@pytest.mark.cli
def test_export_into_an_empty_file_says_it_is_not_a_directory(done_run, tmp_path, cli_env, monkeypatch, capsys):
    target = tmp_path / "model"
    target.write_bytes(b"")
    code, err = in_process(["export", str(done_run / "ckpt-10000"), "--out", str(target)], cli_env, monkeypatch, capsys)
    line = assert_one_line(code, err, f"--out {target}: exists and is not a directory")
    assert "not empty" not in line and target.read_bytes() == b""


@pytest.mark.parametrize("setting", list(FINETUNE_NOT_FINITE))
def test_fine_tuning_setting_that_is_not_a_finite_number(setting, tmp_path, cli_env, monkeypatch, capsys):
    key = setting.split("=")[0].removeprefix("finetune.")
    code, err = in_process(["glue", "--checkpoint", str(tmp_path), "--glue-dir", str(sst2(tmp_path / "glue")),
                            "--set", setting], cli_env, monkeypatch, capsys)
    assert_one_line(code, err, key, FINETUNE_NOT_FINITE[setting])


@pytest.mark.parametrize("command", ["flops", "glue"])
def test_toml_setting_that_is_not_a_finite_number(command, tmp_path, cli_env, monkeypatch, capsys):
    """TOML spells inf and nan too: a recipe file (--recipe) or a [finetune] table (glue --config)."""
    path = tmp_path / "settings.toml"
    path.write_text("[optim]\nlr = inf\n" if command == "flops" else "[finetune]\nlr = nan\n", encoding="utf-8")
    args = (["flops", "--recipe", str(path)] if command == "flops" else
            ["glue", "--checkpoint", str(tmp_path), "--glue-dir", str(tmp_path), "--config", str(path)])
    code, err = in_process(args, cli_env, monkeypatch, capsys)
    assert_one_line(code, err, "settings.toml", "lr", "not a finite number")


# ---------------------------------------------------------------------------------------------------------------
# usage errors (click's, raised before any command runs): one line naming the option, and where the help is; before,
# a usage block, "Try 'tinyelectra flops -h' for help." and a blank line came first


USAGE = {  # argv: what the one line names
    "flops --steps 1e400": ["--steps '1e400'", "valid integer", "see tinyelectra flops --help"],
    "train --budget 1m --gpu=first": ["--gpu 'first'", "valid integer", "see tinyelectra train --help"],
    "prepare --corpus builtin --out OUT --vocab-size": ["--vocab-size", "requires an argument",
                                                       "see tinyelectra prepare --help"],
    "train --budget 1m --stpes 5": ["--stpes", "No such option", "see tinyelectra train --help"],
    "train --out OUT": ["Missing option '--budget'", "see tinyelectra train --help"],
    "glue --glue-dir OUT": ["Missing option '--checkpoint'", "see tinyelectra glue --help"],
    "export --out OUT": ["Missing argument 'CHECKPOINT'", "see tinyelectra export --help"],
    "prepare --corpus builtin --out OUT --force=yes": ["--force", "does not take a value"],
    "recipe show tiny extra": ["unexpected extra argument", "(extra)", "see tinyelectra recipe --help"],
    "pretrain --budget 1m": ["No such command 'pretrain'", "see tinyelectra --help"],
}


@pytest.mark.parametrize("argv", list(USAGE))
def test_usage_error(argv, tmp_path, cli_env, monkeypatch, capsys):
    code, err = in_process(argv.replace("OUT", str(tmp_path / "out")).split(), cli_env, monkeypatch, capsys)
    line = assert_one_line(code, err, *USAGE[argv])
    assert "Usage:" not in err and "Try '" not in err, err
    assert line.count(";") == 1  # what was wrong; where the help is
    assert not (tmp_path / "out").exists()


def test_help_and_version_still_exit_0(cli_env, monkeypatch, capsys):
    for argv in (["flops", "--help"], ["--version"]):
        code, _ = in_process(argv, cli_env, monkeypatch, capsys)
        assert code == 0, argv


FLOPS_OPTIONS = {  # `tinyelectra flops` option: the value that it cannot take (before: named as "--set train.steps")
    "--steps": "99999999999999999999999", "--batch": "9223372036854775808", "--seq-len": "1000",
}


@pytest.mark.parametrize("option", list(FLOPS_OPTIONS))
def test_flops_option_out_of_range_names_the_option(option, cli_env, monkeypatch, capsys):
    code, err = in_process(["flops", "--recipe", "tiny", option, FLOPS_OPTIONS[option]], cli_env, monkeypatch, capsys)
    line = assert_one_line(code, err, option, FLOPS_OPTIONS[option])
    assert "--set" not in line, line


# ---------------------------------------------------------------------------------------------------------------
# out of memory: the model's weights, or a training step (before: the allocator's RuntimeError as a traceback).
# The sizes asked for exceed any machine's address space (2^59 and 2^60 bytes), so the allocation fails at once
# whatever the kernel's overcommit policy: these tests never take memory.


@pytest.mark.slow
def test_a_model_too_large_for_memory_is_one_line(tmp_path, cli_env, monkeypatch, capsys):
    out = tmp_path / "run"
    code, err = in_process([*TRAIN, "--set", f"model.hidden_size={2**50}", "--out", str(out)], cli_env, monkeypatch,
                           capsys)
    assert_one_line(code, err, "the model of recipe tiny does not fit in CPU memory", "GiB", "try a smaller model",
                    "model.hidden_size")
    assert not out.exists()  # during start-up: no --out


@pytest.mark.slow
def test_a_training_step_out_of_memory_is_one_line(tmp_path, cli_env, monkeypatch, capsys):
    import tinyelectra.train as train

    def step_too_large(*args, **kwargs):
        torch.empty(2**60, dtype=torch.uint8)  # the CPU allocator's own error

    monkeypatch.setattr(train, "train_step", step_too_large)
    out = tmp_path / "run"
    code, err = in_process([*TRAIN, "--out", str(out)], cli_env, monkeypatch, capsys)
    assert_one_line(code, err, "a training step of 8 sequences x 128 tokens does not fit in CPU memory (tried to "
                    "allocate 1,073,741,824.0 GiB) after step 0", "--set train.micro_batch_size=4",
                    "--set train.grad_checkpointing=true", "a smaller model", "resume state at step 0",
                    "continue from the resume state with half the micro-batch: ",
                    "--resume --set train.micro_batch_size=4")


def test_a_gpu_out_of_memory_error_reads_as_one_line():
    """torch's CUDA allocator's words (c10/cuda/CUDACachingAllocator.cpp), read without a GPU."""
    from tinyelectra.config import load_recipe
    from tinyelectra.runstate import allocation_failure, out_of_memory_line

    e = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 "
                               "GiB of which 1.06 GiB is free. Of the allocated memory 75.2 GiB is allocated by "
                               "PyTorch")
    assert allocation_failure(e) == "tried to allocate 2.00 GiB"
    assert allocation_failure(RuntimeError("mat1 and mat2 shapes cannot be multiplied")) is None
    line = out_of_memory_line("tried to allocate 2.00 GiB", torch.device("cuda", 0), load_recipe("electra-small"), 32,
                              "after step 7")
    assert line == ("a training step of 32 sequences x 128 tokens does not fit in GPU memory (tried to allocate 2.00 "
                    "GiB) after step 7; try a smaller micro-batch (--set train.micro_batch_size=16: the same global "
                    "batch, accumulated), gradient checkpointing (--set train.grad_checkpointing=true) or a smaller "
                    "model")
