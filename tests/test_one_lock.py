"""One lock, one rule (issue 35; tinyelectra/runfolder.py): every command that writes holds the lock inside the
folder it writes from before its first byte to its end, and replaces or deletes only what a record says tinyelectra
wrote. Each finding of the issue is a test here (the GPU check's is in test_gpu_suite.py), and each failed on 0f79abe:

1. two real processes on one folder, made deterministic at any machine speed: the first command is held just after it
   took its lock (TINYELECTRA_PAUSE_AFTER_LOCK: it waits while a file of the test's exists), the second is refused in
   one line naming it and writes nothing, then the first is let go and finishes with exit code 0, its folder intact
   (export and prepare vs train; train and glue vs export; train vs prepare; train --force and export vs glue; glue vs
   train --force);
3. `train --force` deletes only what the run's records list and says what, keeping everything else at any depth
   (and refusing, deleting nothing, where the new run would write over a file of one's own); `prepare --force` too;
4. --resume checks every shard file's bytes against the run's record (a shard swapped for another dataset's, one token
   id changed, dataset.json deleted), and a run folder of this version without its data record is refused;
5. `--out` a link to an empty folder: every command writes through it, the link stays;
6. a link planted at FOLDER/.tinyelectra.lock (or .tinyelectra.written) is refused, never followed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from test_bad_input import assert_one_line, in_process
from test_runfolder import SMALL, drop_the_data_from_the_resume_state, lock_record, two_datasets, wait_for

LOCK_NAME, RECORD_NAME = ".tinyelectra.lock", ".tinyelectra.written"
PAUSE = "TINYELECTRA_PAUSE_AFTER_LOCK"
TRAIN = ["train", "--recipe", "tiny", "--budget", "4steps", "--device", "cpu", *SMALL, "--set",
         "train.log_every_steps=1"]
GLUE = ["--tasks", "sst2", "--seeds", "1", "--device", "cpu", "--set", "epochs=1"]


# ---------------------------------------------------------------------------------------------------- helpers
class Held:
    """A real `tinyelectra` process held just after it took the lock of `folder`, until `finish`."""

    def __init__(self, args: list[str], folder: Path, env: dict, tmp_path: Path) -> None:
        self.pause = tmp_path / f"pause-{len(list(tmp_path.glob('pause-*')))}"
        self.pause.write_text("held by the test\n")
        self.p = subprocess.Popen([sys.executable, "-m", "tinyelectra", *args], env={**env, PAUSE: str(self.pause)},
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait_for(lambda: lock_record(folder).get("pid") == self.p.pid, f"the lock of {folder}", self.p)

    def finish(self) -> tuple[int, str]:
        self.pause.unlink()
        _, err = self.p.communicate(timeout=1800)
        return self.p.returncode, err

    def kill(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
            self.p.communicate()


def refused(args: list[str], env: dict, monkeypatch, capsys, *needles: str) -> str:
    code, err = in_process(args, env, monkeypatch, capsys)
    return assert_one_line(code, err, *needles)


def corpus(tmp_path: Path, name: str = "c.txt", seed: int = 0) -> Path:
    path = tmp_path / name
    path.write_text("\n\n".join(f"Document {i + seed} has a first sentence.\nAnd a second one about item {i * seed}."
                                for i in range(80)), encoding="utf-8")
    return path


def tree(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` (its lock aside) with its bytes."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != LOCK_NAME}


def steps_logged(run: Path) -> list[int]:
    return [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines() if '"event"' not in x]


@pytest.fixture(scope="module")
def datasets(tmp_path_factory) -> tuple[Path, Path]:
    return two_datasets(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def done_run(datasets, cli_env, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("done") / "run"
    p = subprocess.run([sys.executable, "-m", "tinyelectra", *TRAIN, "--data", str(datasets[0]), "--out", str(run)],
                       env=cli_env, capture_output=True, text=True, timeout=1800)
    assert p.returncode == 0, p.stderr[-3000:]
    return run


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    from test_glue import make_checkpoint

    return make_checkpoint(tmp_path_factory.mktemp("ckpt") / "ckpt-10000")


@pytest.fixture(scope="module")
def glue_dir(tmp_path_factory) -> Path:
    from test_glue import write_sst2_like

    return write_sst2_like(tmp_path_factory.mktemp("glue"), train_rows=16, dev_rows=8)


# ---------------------------------------------------------------------------------------------------- 1. races
@pytest.mark.slow
def test_export_and_prepare_are_refused_in_a_live_train_which_finishes(datasets, ckpt, tmp_path, cli_env, monkeypatch,
                                                                       capsys):
    """export --out RUN replaced a training run (train died in TensorBoard's thread); export --out RUN/ckpt-5000 was
    replaced by the checkpoint later; prepare --out RUN replaced the run with a dataset."""
    run = tmp_path / "run"
    train = Held([*TRAIN, "--data", str(datasets[0]), "--out", str(run)], run, cli_env, tmp_path)
    try:
        who, pid = "tinyelectra train --recipe tiny", f"(pid {train.p.pid} on this machine"
        refused(["export", str(ckpt), "--out", str(run)], cli_env, monkeypatch, capsys, f"--out {run}: in use by {who}",
                pid)
        refused(["export", str(ckpt), "--out", str(run / "ckpt-5000")], cli_env, monkeypatch, capsys,
                f"--out {run / 'ckpt-5000'}: ckpt-5000 in {run} is written by {who}", pid)
        text = corpus(tmp_path)
        refused(["prepare", "--corpus", str(text), "--out", str(run), "--vocab-size", "300"], cli_env, monkeypatch,
                capsys, f"--out {run}: in use by {who}", pid)
        refused(["prepare", "--corpus", str(text), "--out", str(run / "data"), "--vocab-size", "300"], cli_env,
                monkeypatch, capsys, f"data in {run} is written by {who}", pid)
        assert [p.name for p in run.iterdir()] == [LOCK_NAME]  # nothing of theirs
        code, err = train.finish()
    finally:
        train.kill()
    assert code == 0, err[-3000:]
    assert steps_logged(run) == [1, 2, 3, 4] and json.loads((run / "summary.json").read_text())["steps"] == 4
    assert {p.name for p in run.iterdir()} == {RECORD_NAME, "recipe.json", "plan.json", "summary.json", "metrics.jsonl",
                                               "dataset.json", "state", "tensorboard", "ckpt-0625", "ckpt-1250",
                                               "ckpt-2500", "ckpt-5000", "ckpt-10000"}
    from tinyelectra.checkpoint import verify_checkpoint

    for name in ("ckpt-5000", "ckpt-10000"):
        verify_checkpoint(run / name)
        assert not (run / name / "discriminator").exists() and not (run / name / "generator").exists()


@pytest.mark.slow
def test_train_and_glue_are_refused_in_a_live_export_which_finishes(ckpt, glue_dir, tmp_path, cli_env, monkeypatch,
                                                                    capsys):
    """export and glue on one --out were both rc 0, their outputs mixed and glue's lock deleted under it."""
    out = tmp_path / "out"
    export = Held(["export", str(ckpt), "--out", str(out)], out, cli_env, tmp_path)
    try:
        who = f"tinyelectra export {ckpt} --out {out} (pid {export.p.pid} on this machine"
        refused([*TRAIN, "--out", str(out)], cli_env, monkeypatch, capsys, f"--out {out}: in use by {who}")
        refused(["glue", "--checkpoint", str(ckpt), "--glue-dir", str(glue_dir), *GLUE, "--out", str(out)], cli_env,
                monkeypatch, capsys, f"--out {out}: in use by {who}")
        assert [p.name for p in out.iterdir()] == [LOCK_NAME]
        code, err = export.finish()
    finally:
        export.kill()
    assert code == 0, err[-3000:]
    assert sorted(p.name for p in out.iterdir()) == [RECORD_NAME, "discriminator", "generator"]
    for part in ("discriminator", "generator"):
        assert {"config.json", "model.safetensors", "README.md"} <= {p.name for p in (out / part).iterdir()}


@pytest.mark.slow
def test_train_is_refused_in_a_live_prepare_which_finishes(tmp_path, cli_env, monkeypatch, capsys):
    """prepare took no lock: a train beside a starting prepare lost its run; one reading the folder read half a
    dataset."""
    from tinyelectra.data import PretrainData

    data = tmp_path / "data"
    prepare = Held(["prepare", "--corpus", str(corpus(tmp_path)), "--out", str(data), "--vocab-size", "300"], data,
                   cli_env, tmp_path)
    try:
        who = f"tinyelectra prepare --corpus {tmp_path / 'c.txt'} --out {data} --vocab-size 300 (pid {prepare.p.pid}"
        refused([*TRAIN, "--out", str(data)], cli_env, monkeypatch, capsys, f"--out {data}: in use by {who}")
        refused([*TRAIN, "--data", str(data), "--out", str(tmp_path / "run")], cli_env, monkeypatch, capsys,
                f"{data}: being written by {who}")
        assert not (tmp_path / "run").exists() and [p.name for p in data.iterdir()] == [LOCK_NAME]
        code, err = prepare.finish()
    finally:
        prepare.kill()
    assert code == 0, err[-3000:]
    assert PretrainData(data).num_rows("train") > 0
    assert {p.name for p in data.iterdir()} >= {"manifest.json", "tokenizer", RECORD_NAME}
    assert not [p for p in data.iterdir() if ".tmp" in p.name or p.name == LOCK_NAME]


@pytest.mark.slow
def test_train_force_and_export_are_refused_in_a_live_glue_which_finishes(done_run, datasets, glue_dir, tmp_path,
                                                                           cli_env, monkeypatch, capsys):
    run = tmp_path / "run"
    shutil.copytree(done_run, run)
    before = tree(run)
    glue = Held(["glue", "--checkpoint", str(run / "ckpt-10000"), "--glue-dir", str(glue_dir), *GLUE], run / "glue",
                cli_env, tmp_path)
    try:
        who = f"tinyelectra glue --checkpoint {run / 'ckpt-10000'}"
        refused([*TRAIN, "--data", str(datasets[0]), "--out", str(run), "--force"], cli_env, monkeypatch, capsys,
                f"--force: {run / 'glue'}: in use by {who}", f"pid {glue.p.pid} on this machine")
        refused(["export", str(run / "ckpt-10000"), "--out", str(run / "glue")], cli_env, monkeypatch, capsys,
                f"--out {run / 'glue'}: in use by {who}")
        refused(["export", str(run / "ckpt-10000"), "--out", str(run / "glue" / "ckpt-10000")], cli_env, monkeypatch,
                capsys, f"ckpt-10000 in {run / 'glue'} is written by {who}")
        assert tree(run) == before
        code, err = glue.finish()
    finally:
        glue.kill()
    assert code == 0, err[-3000:]
    result = json.loads((run / "glue" / "ckpt-10000" / "glue.json").read_text())
    assert "sst2" in result["tasks"]
    after = tree(run)
    # RUN's record gains exactly glue's TensorBoard files (written under RUN's lock; train --force deletes them)
    record = after.pop(RECORD_NAME).decode()
    assert record.startswith(before[RECORD_NAME].decode())
    added = [json.loads(line) for line in record[len(before[RECORD_NAME]):].splitlines()]
    assert added and all(e["by"] == "glue" and e["glob"].startswith("tensorboard/events.out.tfevents.") for e in added)
    assert {k: v for k, v in after.items() if not k.startswith(("glue/", "tensorboard/"))} == \
        {k: v for k, v in before.items() if not k.startswith("tensorboard/") and k != RECORD_NAME}


@pytest.mark.slow
def test_glue_is_refused_in_a_live_train_force_which_finishes(done_run, datasets, glue_dir, tmp_path, cli_env,
                                                              monkeypatch, capsys):
    """glue beside `train --force` of the same run wrote the old run's results into the new one."""
    run = tmp_path / "run"
    shutil.copytree(done_run, run)
    train = Held([*TRAIN, "--data", str(datasets[0]), "--out", str(run), "--force"], run, cli_env, tmp_path)
    try:
        refused(["glue", "--checkpoint", str(run / "ckpt-10000"), "--glue-dir", str(glue_dir), *GLUE], cli_env,
                monkeypatch, capsys, f"--out {run / 'glue'}: glue in {run} is written by tinyelectra train",
                f"pid {train.p.pid} on this machine")
        assert not (run / "glue").exists()
        code, err = train.finish()
    finally:
        train.kill()
    assert code == 0, err[-3000:]
    assert "--force: deleted the earlier run" in err and steps_logged(run) == [1, 2, 3, 4]
    assert not (run / "glue").exists()


# ---------------------------------------------------------------------------------------------------- 3. --force
@pytest.mark.slow
def test_force_deletes_only_what_the_records_list_and_says_what(done_run, datasets, glue_dir, tmp_path, cli_env,
                                                                monkeypatch, capsys):
    run = tmp_path / "run"
    shutil.copytree(done_run, run)
    code, err = in_process(["glue", "--checkpoint", str(run / "ckpt-10000"), "--glue-dir", str(glue_dir), *GLUE],
                           cli_env, monkeypatch, capsys)
    assert code == 0, err
    code, err = in_process(["report", str(run), "--out", str(run / "reports")], cli_env, monkeypatch, capsys)
    assert code == 0, err
    assert (run / "glue" / "ckpt-10000" / "glue.json").is_file() and (run / "reports" / "report.md").is_file()
    mine = {"ckpt-10000/NOTES.txt": "what I saw", "tensorboard/README-mine.txt": "how to read these",
            "glue/mine/results.csv": "task,score", "report.md": "my own report", "notes.txt": "ideas",
            "state/keep.txt": "even here", "reports/draft.md": "beside the report"}
    for name, text in mine.items():
        (run / name).parent.mkdir(parents=True, exist_ok=True)
        (run / name).write_text(text)

    # the new run writes ckpt-10000 again: a file of one's own in it is not deleted, and nothing else is either
    before = tree(run)
    force = [*TRAIN, "--data", str(datasets[0]), "--out", str(run), "--force"]
    refused(force, cli_env, monkeypatch, capsys, f"--force: {run / 'ckpt-10000'} holds ckpt-10000/NOTES.txt, which the "
            "run's record does not list, and the new run writes ckpt-10000 again: move it away first (nothing was "
            "deleted)")
    assert tree(run) == before
    (run / "ckpt-10000" / "NOTES.txt").rename(tmp_path / "NOTES.txt")
    del mine["ckpt-10000/NOTES.txt"]

    code, err = in_process(force, cli_env, monkeypatch, capsys)
    assert code == 0, err
    for name, text in mine.items():
        assert (run / name).read_text() == text, name
    said = next(line for line in err.splitlines() if "--force: deleted the earlier run" in line)
    for listed in ("recipe.json", "summary.json", "ckpt-10000/ (", "state/ (", "glue/ (", "reports/ (",
                   "kept everything else:", "glue/mine/results.csv", "report.md", "notes.txt",
                   "tensorboard/README-mine.txt", "state/keep.txt", "reports/draft.md"):
        assert listed in said, (listed, said)
    assert not (run / "glue" / "ckpt-10000").exists() and not (run / "reports" / "report.md").exists()
    assert steps_logged(run) == [1, 2, 3, 4]  # the new run


def test_prepare_force_replaces_only_its_own_dataset(tmp_path, monkeypatch, capsys):
    """prepare --force over a folder that also held GLUE results deleted them all, without a list."""
    from tinyelectra.data import PretrainData

    data = tmp_path / "data"
    base = ["prepare", "--out", str(data), "--vocab-size", "300"]
    code, err = in_process([*base, "--corpus", str(corpus(tmp_path))], {"TINYELECTRA_CACHE": str(tmp_path)},
                           monkeypatch, capsys)
    assert code == 0, err
    (data / "glue" / "ckpt-10000").mkdir(parents=True)
    (data / "glue" / "ckpt-10000" / "glue.json").write_text('{"mine": true}')
    (data / "notes.txt").write_text("where this came from")
    (data / "tokenizer" / "why.txt").write_text("the tokenizer's story")  # inside a folder prepare writes
    old_shards = {p.name for p in data.glob("*.npy")}
    code, err = in_process([*base, "--corpus", str(corpus(tmp_path, "d.txt", seed=3)), "--force"],
                           {"TINYELECTRA_CACHE": str(tmp_path)}, monkeypatch, capsys)
    assert code == 0, err
    assert (data / "glue" / "ckpt-10000" / "glue.json").read_text() == '{"mine": true}'
    assert (data / "notes.txt").read_text() == "where this came from"
    assert (data / "tokenizer" / "why.txt").read_text() == "the tokenizer's story"
    assert f"replaced the dataset in {data}: deleted its" in err
    assert "kept everything else: glue/ckpt-10000/glue.json, notes.txt, tokenizer/why.txt" in err
    assert PretrainData(data).manifest["sources"][0]["spec"].endswith("d.txt")
    assert {p.name for p in data.glob("*.npy")} == old_shards  # the same names, the new dataset's bytes


# ---------------------------------------------------------------------------------------------------- 4. data identity
def change_one_token(path: Path) -> None:
    ids = np.load(path)
    ids[0, 1] = 5 if ids[0, 1] != 5 else 6  # another id inside the vocabulary
    with open(path, "wb") as f:
        np.save(f, ids)


@pytest.mark.slow
def test_resume_checks_the_shards_bytes_against_the_runs_record(datasets, tmp_path, cli_env, monkeypatch, capsys):
    a, b = datasets
    data = tmp_path / "a"
    shutil.copytree(a, data)
    run = tmp_path / "run"
    code, err = in_process([*TRAIN, "--data", str(data), "--out", str(run)], cli_env, monkeypatch, capsys)
    assert code == 0, err
    (run / "summary.json").unlink()  # unfinished: --resume continues it
    resume = [*TRAIN, "--data", str(data), "--out", str(run), "--resume"]
    shard = data / "train-00000.ids.npy"
    original = shard.read_bytes()

    shutil.copyfile(b / shard.name, shard)  # another dataset's shard, of the same size, under the same name
    refused(resume, cli_env, monkeypatch, capsys, f"{shard}: its sha256", "the file was damaged or replaced since")
    shard.write_bytes(original)
    change_one_token(shard)  # one token id, still inside the vocabulary
    refused(resume, cli_env, monkeypatch, capsys, f"{shard}: its sha256", "the file was damaged or replaced since")
    shard.write_bytes(original)

    # data prepared before shards had their sha256 in the manifest: the run's own record of the bytes decides
    older = tmp_path / "older"
    shutil.copytree(a, older)
    manifest = json.loads((older / "manifest.json").read_text())
    for split in manifest["splits"].values():
        for s in split["shards"]:
            del s["ids_sha256"], s["meta_sha256"]
    (older / "manifest.json").write_text(json.dumps(manifest))
    run2 = tmp_path / "run2"
    code, err = in_process([*TRAIN, "--data", str(older), "--out", str(run2)], cli_env, monkeypatch, capsys)
    assert code == 0, err
    (run2 / "summary.json").unlink()
    change_one_token(older / shard.name)
    refused([*TRAIN, "--data", str(older), "--out", str(run2), "--resume"], cli_env, monkeypatch, capsys,
            f"--resume: {older / shard.name} is not the file {run2} trained on", "the data changed since")

    # dataset.json deleted: the resume state's record still decides (other data refused, the run's data continued)
    (run / "dataset.json").unlink()
    refused([*TRAIN, "--data", str(b), "--out", str(run), "--resume"], cli_env, monkeypatch, capsys,
            f"--resume: {run} was trained on {data.resolve()}", f"this command gives {b.resolve()}")
    code, err = in_process(resume, cli_env, monkeypatch, capsys)
    assert code == 0, err
    assert "before runs recorded their data" not in err and (run / "dataset.json").is_file()

    # a run of this version without any record of its data: refused, not trusted
    (run / "summary.json").unlink()
    (run / "dataset.json").unlink()
    drop_the_data_from_the_resume_state(run)
    refused(resume, cli_env, monkeypatch, capsys, f"--resume: {run} has no record of the data it trained on",
            "start over with --force")


# ---------------------------------------------------------------------------------------------------- 5. links
@pytest.mark.slow
def test_a_link_as_out_is_written_through_by_every_command(done_run, datasets, ckpt, tmp_path, cli_env, monkeypatch,
                                                          capsys):
    """export and prepare wrote a real folder beside a link and renamed the user's link away."""
    commands = {"prepare": ["prepare", "--corpus", str(corpus(tmp_path)), "--vocab-size", "300"],
                "export": ["export", str(ckpt)], "report": ["report", str(done_run)],
                "train": [*TRAIN, "--data", str(datasets[0])]}
    expected = {"prepare": "manifest.json", "export": "discriminator", "report": "report.md", "train": "summary.json"}
    for name, args in commands.items():
        target, link = tmp_path / f"{name}-target", tmp_path / f"{name}-link"
        target.mkdir()
        link.symlink_to(target, target_is_directory=True)
        code, err = in_process([*args, "--out", str(link)], cli_env, monkeypatch, capsys)
        assert code == 0, (name, err[-3000:])
        assert link.is_symlink() and os.readlink(link) == str(target), name
        assert (target / expected[name]).exists(), (name, sorted(p.name for p in target.iterdir()))
        assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(name)) == [
            f"{name}-link", f"{name}-target"]


# ---------------------------------------------------------------------------------------------------- 6. planted links
@pytest.mark.parametrize("command", ["train", "prepare", "export"])
def test_a_planted_lock_link_is_refused_never_followed(command, datasets, ckpt, tmp_path, cli_env, monkeypatch, capsys):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    args = {"train": [*TRAIN, "--data", str(datasets[0])],
            "prepare": ["prepare", "--corpus", str(corpus(tmp_path)), "--vocab-size", "300"],
            "export": ["export", str(ckpt)]}[command]
    for name, target in ((LOCK_NAME, victim), (LOCK_NAME, tmp_path / "elsewhere" / "created"),
                         (RECORD_NAME, victim)):
        out = tmp_path / f"out-{name}-{target.name}"
        out.mkdir()
        (out / name).symlink_to(target)
        refused([*args, "--out", str(out)], cli_env, monkeypatch, capsys, f"{out / name} is a symbolic link, not "
                f"tinyelectra's {'lock file' if name == LOCK_NAME else 'record'}", "never followed")
        assert victim.read_text() == "precious" and not (tmp_path / "elsewhere").exists()
        assert [p.name for p in out.iterdir()] == [name] and (out / name).is_symlink()
