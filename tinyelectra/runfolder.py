"""Who writes a folder, what tinyelectra wrote in it, and what a run knows of its data: `holding` (one writer per
folder: an OS lock inside it naming the process and host holding it), `Written` (the record of what each command wrote
there: all that may ever be replaced or deleted) and `record_data` / `check_data` (the prepared dataset a run trains
on, its files' bytes checked on --resume). Not here: what a run folder holds (train.open_run_dir), writing files
safely (files.py), reading prepared data (data.py).

One rule for every command that writes (prepare, train, glue, export, report, the GPU check): it holds the lock of the
folder it writes, taken before its first byte and held to its end, and it replaces or deletes only what the folder's
record says it (or, for `train --force`, the run) wrote. A folder given as a symbolic link is written through.

The lock: `FOLDER/.tinyelectra.lock`, opened without following a link at that name (O_NOFOLLOW: a link planted there is
refused, never followed), `fcntl.flock` taken without waiting and held until the command ends. The file holds the
holder's command, pid, host, start time and the names it writes in the folder (`reserves`): a second writer of the
folder is refused with one line saying who, and so is a command whose folder lies inside a held one under a name the
holder writes (`export --out RUN/ckpt-5000` while RUN trains; `glue --out RUN/glue` is not such a name). The kernel
drops the lock when its process ends however it ends (kill -9 too), so a lock left by a killed process is simply taken
again, with a note naming the process that left it; a finished command deletes the file, and the folder too when the
lock was all it held. The file is deleted while still locked and a taker checks that the file it locked is still the
one at the path, so two takers never both hold it. Under torchrun only rank 0 takes it (only rank 0 writes). On NFS,
flock is a POSIX lock through the server's lock manager, so it holds across machines; a lock held from another
machine is refused like any other, but whether that process still runs cannot be checked from here, and the line says
so (and what to delete if it does not). A file system without locks (ENOLCK) is said once and the command goes on
without one. Tests hold a command just after it took its lock: TINYELECTRA_PAUSE_AFTER_LOCK=PATH makes it wait while
PATH exists.

The record: `FOLDER/.tinyelectra.written`, one JSON line per thing written ({"by": "train", "file": "plan.json"}; "dir"
for a folder made; "glob" for files whose names are known only once written, such as TensorBoard's), appended and
fsynced before the thing is written, so what a killed command left is still on record as its own. Besides each
recorded thing, its temporary names count as recorded: `.NAME.*.tmp` beside a file (files.write_atomic) and
`NAME.tmp-PID` / `NAME.old-PID` beside a folder (files.staged_dir). A folder written before records existed has none:
its files are nobody's to delete (train.open_run_dir and prepare say what that means for them).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import fnmatch
import glob
import json
import os
import shlex
import socket
import stat
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from tinyelectra.errors import UserError
from tinyelectra.files import pid_alive, write_atomic, write_json

LOCK_NAME = ".tinyelectra.lock"
RECORD_NAME = ".tinyelectra.written"
BOOKKEEPING = (LOCK_NAME, RECORD_NAME)
PAUSE_ENV = "TINYELECTRA_PAUSE_AFTER_LOCK"
DATASET_FILE = "dataset.json"  # in a run folder: the prepared data it trains on (`data_record`)


# ---------------------------------------------------------------------------------------------------- the lock
def _holder_text(record: dict, lock_file: Path) -> str:
    """Who a lock record names, in words: 'tinyelectra train (pid 41 on this machine, since 10:02:11 UTC)'."""
    if not record:
        return "another process (which has not written its name into the lock yet)"
    pid, host = record.get("pid"), record.get("host")
    since = f", since {record['started_utc']}" if record.get("started_utc") else ""
    what = record.get("command") or "another process"
    if host != socket.gethostname():
        return (f"{what} (pid {pid} on machine {host}{since}; whether it still runs cannot be checked from this "
                f"machine: if it does not, delete {lock_file})")
    state = "" if isinstance(pid, int) and pid_alive(pid) else ", which has ended: a process it started holds the lock"
    return f"{what} (pid {pid} on this machine{since}{state})"


def _read_record(fd: int) -> dict:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        record = json.loads(os.read(fd, 1 << 16).decode("utf-8"))
        return record if isinstance(record, dict) else {}
    except (OSError, ValueError, UnicodeDecodeError):
        return {}


class NotAPlainFile(Exception):
    """Something other than a regular file at FOLDER/.tinyelectra.lock or .tinyelectra.written (a link, a folder)."""


def _open_no_follow(path: Path, flags: int) -> int:
    """`path` opened as a regular file, never through a link (O_NOFOLLOW) and never waiting on a pipe (O_NONBLOCK)."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o666)  # less the umask, as open()
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise NotAPlainFile("is a symbolic link") from None
        if e.errno == errno.EISDIR:
            raise NotAPlainFile("is a folder") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise NotAPlainFile("is not a regular file")
    return fd


def _held_by_other(folder: Path) -> dict | None:
    """The lock record of `folder` when a process other than this one holds its lock; None when nobody or this
    process does (or it cannot be read: then it is no lock of tinyelectra's)."""
    try:
        fd = _open_no_follow(Path(folder) / LOCK_NAME, os.O_RDONLY)
    except (OSError, NotAPlainFile):
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return None
    except OSError as e:
        if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return None
        record = _read_record(fd)
        mine = record.get("pid") == os.getpid() and record.get("host") == socket.gethostname()
        return None if mine else (record or {"command": None})
    finally:
        os.close(fd)


class OutputLock:
    """A held lock on an output folder (see the module docstring); `release` ends it."""

    def __init__(self, directory: Path, flag: str, command: str, reserves: Iterable[str]) -> None:
        self.directory, self.lock_file, self.fd = directory, directory / LOCK_NAME, -1
        self.created: list[Path] = []  # folders made for the lock, removed again if it was all they held
        missing, p = [], directory
        while not p.exists() and not p.is_symlink() and p != p.parent:
            missing.append(p)
            p = p.parent
        if directory.exists() and not directory.is_dir():
            raise UserError(f"{flag} {directory}: exists and is not a directory")
        try:
            for d in reversed(missing):
                d.mkdir()
                self.created.append(d)
            self._take(flag, command, list(reserves))
            self._check_enclosing(flag)
        except NotAPlainFile as e:
            self.release()
            raise UserError(f"{flag} {directory}: {self.lock_file} {e}, not tinyelectra's lock file (it is never "
                            f"followed or written through): delete it, or choose another {flag}") from None
        except OSError as e:
            self.release()
            raise UserError(f"{flag} {directory}: cannot write there ({e.strerror or e})") from None
        except BaseException:
            self.release()
            raise

    def _take(self, flag: str, command: str, reserves: list[str]) -> None:
        while True:
            fd = _open_no_follow(self.lock_file, os.O_RDWR | os.O_CREAT)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                if e.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                    print(f"· {flag} {self.directory}: this file system cannot lock files ({e.strerror}); going on "
                          "without a lock, so nothing stops a second command from writing here at the same time",
                          file=sys.stderr)
                    self.fd = fd  # released as a lock is: the file deleted
                    return
                holder = _read_record(fd)
                os.close(fd)
                if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise UserError(f"{flag} {self.directory}: in use by {_holder_text(holder, self.lock_file)}; "
                                    "one command writes a folder at a time: wait for it, or choose another "
                                    f"{flag}") from None
                raise
            try:  # the file locked must still be the one at the path (an ending holder deletes it while locked)
                same = os.path.samestat(os.fstat(fd), os.stat(self.lock_file, follow_symlinks=False))
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        self.fd = fd
        left = _read_record(fd)  # a record still there: its process ended without releasing (killed)
        if left:
            host = "this machine" if left.get("host") == socket.gethostname() else left.get("host")
            since = ", since " + left["started_utc"] if left.get("started_utc") else ""
            print(f"· {flag} {self.directory}: taking over the lock left by {left.get('command') or 'a process'} "
                  f"(pid {left.get('pid')} on {host}{since}), which ended without releasing it", file=sys.stderr)
        self.record = {"command": command, "pid": os.getpid(), "host": socket.gethostname(),
                       "started_utc": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "reserves": reserves}
        self._write_record()

    def _write_record(self) -> None:
        data = json.dumps(self.record).encode("utf-8")
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, data, 0)
        os.fsync(self.fd)

    def reserve(self, reserves: Iterable[str]) -> None:
        """From now on the names this command writes in its folder are `reserves` (train --force holds all of its
        folder, "*", until the earlier run is deleted, then only the names a run writes)."""
        if self.fd >= 0 and hasattr(self, "record"):
            self.record["reserves"] = list(reserves)
            self._write_record()

    def _check_enclosing(self, flag: str) -> None:
        """Refuse a folder inside one another live command holds, under a name that command writes there (checked
        after taking this lock: of two such commands starting together, at least one sees the other)."""
        real = Path(os.path.realpath(self.directory))
        for folder in real.parents:
            holder = _held_by_other(folder)
            name = real.relative_to(folder).parts[0]
            if holder and any(fnmatch.fnmatchcase(name, p) for p in holder.get("reserves", ["*"])):
                raise UserError(f"{flag} {self.directory}: {name} in {folder} is written by "
                                f"{_holder_text(holder, folder / LOCK_NAME)}; choose another {flag}")

    def release(self) -> None:
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.unlink(self.lock_file)  # while still locked: a waiting taker sees it gone and tries again
            os.close(self.fd)
            self.fd = -1
        for d in reversed(self.created):  # deepest first; a folder that holds anything else stays
            with contextlib.suppress(OSError):
                d.rmdir()
        self.created = []


def user_of(folder: Path) -> str | None:
    """Who (another process) holds the lock on `folder` right now, in words (as a refusal names it), or None."""
    holder = _held_by_other(folder)
    return None if holder is None else _holder_text(holder, Path(folder) / LOCK_NAME)


@contextlib.contextmanager
def holding(directory: Path, flag: str, enabled: bool = True,
            reserves: Iterable[str] = ()) -> Iterator[OutputLock | None]:
    """Hold the lock on the output folder `directory` (given as `flag`, e.g. "--out") for the block; a folder in use,
    or inside a held one under a name its holder writes, is a one-line UserError naming who uses it. `reserves`: the
    names (shell patterns) this command writes in the folder, which no other command may take as its own folder
    meanwhile (`OutputLock.reserve` changes them). `enabled` False (a torchrun rank other than 0): nothing is locked
    (None)."""
    if not enabled:
        yield None
        return
    directory = Path(directory)
    command = "tinyelectra " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv[1:] else "tinyelectra"
    lock = OutputLock(directory, flag, command, reserves)
    try:
        pause = os.environ.get(PAUSE_ENV)
        while pause and os.path.exists(pause):
            time.sleep(0.05)
        yield lock
    finally:
        lock.release()


# ---------------------------------------------------------------------------------------------------- the record
def _relative(folder: Path, path: Path | str) -> str:
    """`path` (built from `folder`, or already relative to it) relative to `folder`."""
    path = Path(path)
    for base in (folder, folder.absolute()):
        with contextlib.suppress(ValueError):
            return path.relative_to(base).as_posix()
    return path.as_posix()


def _append(path: Path, text: str) -> None:
    """`text` added to the end of `path` and fsynced; after a line a crash cut short, on a line of its own."""
    fd = _open_no_follow(path, os.O_RDWR | os.O_APPEND | os.O_CREAT)
    try:
        size = os.fstat(fd).st_size
        torn = size > 0 and os.pread(fd, 1, size - 1) != b"\n"
        os.write(fd, (("\n" if torn else "") + text).encode("utf-8"))
        os.fsync(fd)
    finally:
        os.close(fd)


class Written:
    """FOLDER's record of what command `by` ("train", "prepare", ...) wrote there (module docstring). `add` before
    writing: a file (default), a folder made ("dir") or a shell pattern of files ("glob"), relative to FOLDER or
    under it."""

    def __init__(self, folder: Path, by: str) -> None:
        self.folder, self.by = Path(folder), by

    def add(self, *paths: Path | str, kind: str = "file") -> None:
        if paths:
            lines = (json.dumps({"by": self.by, kind: _relative(self.folder, p)}, ensure_ascii=False) for p in paths)
            try:
                _append(self.folder / RECORD_NAME, "".join(line + "\n" for line in lines))
            except NotAPlainFile as e:
                raise UserError(f"{self.folder / RECORD_NAME} {e}, not tinyelectra's record (it is never followed): "
                                "delete it") from None

    def add_once(self, path: Path | str, kind: str = "file") -> None:
        """`add` unless the record already holds this entry of this command (an entry added again and again by a
        long-lived process: glue's TensorBoard glob, once per task)."""
        if {"by": self.by, kind: _relative(self.folder, path)} not in read_record(self.folder):
            self.add(path, kind=kind)

    def add_tree(self, staged: Path, final: Path) -> None:
        """Every file, then every folder, under `staged` (a finished temporary folder), as it will be named once
        moved onto `final`: on record before the move."""
        tree = sorted(Path(staged).rglob("*"))
        self.add(*(final / p.relative_to(staged) for p in tree if not p.is_dir()))
        self.add(*(final / p.relative_to(staged) for p in tree if p.is_dir()), kind="dir")

    def covered(self, under: Path | None = None) -> set[Path]:
        return covered(self.folder, (self.by,), under)[0]

    def foreign(self, under: Path) -> list[Path]:
        return foreign(self.folder, under, (self.by,))

    def delete(self, under: Path | None = None) -> list[Path]:
        return delete_recorded(self.folder, (self.by,), under)


def read_record(folder: Path) -> list[dict]:
    """FOLDER's record: each entry {"by", and one of "file"/"dir"/"glob": a path relative to FOLDER}, each once; a line
    that is not such an entry (a torn last line, one naming a path outside FOLDER) is left out."""
    try:
        fd = _open_no_follow(Path(folder) / RECORD_NAME, os.O_RDONLY)
    except (OSError, NotAPlainFile):
        return []
    with os.fdopen(fd, "rb") as f:
        raw = f.read().decode("utf-8", errors="replace")
    entries, seen = [], set()
    for line in raw.splitlines():
        try:
            e = json.loads(line)
        except ValueError:
            continue
        kinds = [k for k in ("file", "dir", "glob") if isinstance(e.get(k), str)] if isinstance(e, dict) else []
        if len(kinds) != 1 or not isinstance(e.get("by"), str):
            continue
        rel = e[kinds[0]]
        if rel in ("", ".") or Path(rel).is_absolute() or ".." in Path(rel).parts:
            continue
        key = (e["by"], kinds[0], rel)
        if key not in seen:
            seen.add(key)
            entries.append({"by": e["by"], kinds[0]: rel})
    return entries


def _regular(p: Path) -> bool:
    return p.is_file() and not p.is_symlink()


def _tree(top: Path) -> tuple[set[Path], set[Path]]:
    """Every file (of any kind) and folder under `top`, `top` included; links never followed."""
    files, dirs = set(), {top}
    for root, dirnames, filenames in os.walk(top):
        for n in dirnames:
            (dirs if not os.path.islink(os.path.join(root, n)) else files).add(Path(root) / n)
        files.update(Path(root) / n for n in filenames)
    return files, dirs


def covered(folder: Path, by: Iterable[str] | None = None, under: Path | None = None,
            temporaries: bool = False) -> tuple[set[Path], set[Path]]:
    """The files and folders that FOLDER's record lists (by the commands `by`; None: any), as they are now, with the
    temporary names of each (module docstring; only those with `temporaries`); only those under `under` when given.
    A recorded name now held by a link is not covered (a link was never written by tinyelectra)."""
    folder = Path(folder)
    by = None if by is None else set(by)
    files: set[Path] = set()
    dirs: set[Path] = set()
    for e in read_record(folder):
        if by is not None and e["by"] not in by:
            continue
        if "glob" in e:
            files.update(p for p in folder.glob(e["glob"]) if _regular(p) and not temporaries)
            continue
        path = folder / (e.get("file") or e["dir"])
        if "file" in e:
            if _regular(path) and not temporaries:
                files.add(path)
            files.update(p for p in path.parent.glob(f".{glob.escape(path.name)}.*.tmp") if _regular(p))
            continue
        if path.is_dir() and not path.is_symlink() and not temporaries:
            dirs.add(path)
        for staged in [*path.parent.glob(f"{glob.escape(path.name)}.tmp-*"),
                       *path.parent.glob(f"{glob.escape(path.name)}.old-*")]:
            if staged.is_dir() and not staged.is_symlink():
                more_files, more_dirs = _tree(staged)
                files |= more_files
                dirs |= more_dirs
    if under is not None:
        inside = lambda p: p == under or under in p.parents  # noqa: E731
        files, dirs = {p for p in files if inside(p)}, {p for p in dirs if inside(p)}
    return files, dirs


def delete_temporaries(folder: Path, by: str) -> None:
    """What writes of `by` in FOLDER left half-done when their process was killed (never renamed into place, so never
    read): the temporary names of what the record lists."""
    _remove(*covered(folder, (by,), temporaries=True))


def _remove(files: set[Path], dirs: set[Path]) -> None:
    """Delete `files` (one already gone is no error), then those of `dirs` left empty, the deepest first."""
    for p in sorted(files):
        with contextlib.suppress(FileNotFoundError):
            p.unlink()
    for d in sorted(dirs, key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):
            d.rmdir()


def foreign(folder: Path, under: Path, by: Iterable[str] | None = None) -> list[Path]:
    """What lies under `under` (inside FOLDER) that FOLDER's record does not list (by `by`): files, links, anything
    but folders; FOLDER's own lock and record are not counted."""
    ours, _ = covered(folder, by, under)
    # (a link given as --out: its folder)
    found, _ = _tree(Path(under)) if Path(under).is_dir() else ({Path(under)}, set())
    own = {Path(folder) / n for n in BOOKKEEPING}
    return sorted(p for p in found if p not in ours and p not in own and (p.exists() or p.is_symlink()))


def delete_recorded(folder: Path, by: Iterable[str] | None = None, under: Path | None = None) -> list[Path]:
    """Delete what FOLDER's record lists (by `by`; under `under` when given), then the recorded folders it leaves
    empty; everything else stays, at any depth. The record then keeps only what is still there. Returns the files
    deleted."""
    files, dirs = covered(folder, by, under)
    _remove(files, dirs)
    tidy_record(Path(folder), under)
    return sorted(files)


def tidy_record(folder: Path, under: Path | None = None) -> None:
    """FOLDER's record without the entries (under `under` when given: entries elsewhere may name what is about to be
    written) whose things are gone, deleted; no record when nothing is left."""
    def there(e: dict) -> bool:
        if "glob" in e:
            return under is not None or any(folder.glob(e["glob"]))
        path = folder / (e.get("file") or e["dir"])
        if under is not None and path != under and under not in path.parents:
            return True
        return path.exists() or any(path.parent.glob(f"{glob.escape(path.name)}.tmp-*")) or \
            any(path.parent.glob(f".{glob.escape(path.name)}.*.tmp"))

    entries = read_record(folder)
    keep = [e for e in entries if there(e)]
    if len(keep) == len(entries):
        return
    path = folder / RECORD_NAME
    if keep:
        write_atomic(path, "".join(json.dumps(e, ensure_ascii=False) + "\n" for e in keep))
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


DERIVED_BY = ("train", "report", "glue", "export")  # what `train --force` deletes: the run and what was made from it


def delete_run(run_dir: Path) -> tuple[list[str], list[str]]:
    """`train --force`: delete what the records in RUN (its own and those of the folders inside it, at any depth)
    say train, report, glue and export wrote; a prepared dataset (prepare's) and everything no record lists stay.
    Each folder with a record or a lock inside RUN is held while it is cleared (one another command holds: a one-line
    UserError before anything is deleted). Returns what was deleted and what was kept, as short texts."""
    run_dir = Path(run_dir)
    folders = [Path(root) for root, _, names in os.walk(run_dir) if set(names) & set(BOOKKEEPING)]
    with contextlib.ExitStack() as stack:
        for f in sorted(folders, key=lambda p: len(p.parts)):
            if f != run_dir:
                stack.enter_context(holding(f, "--force:"))
        deleted = [p for f in folders for p in delete_recorded(f, DERIVED_BY)]
    for f in sorted(folders, key=lambda p: len(p.parts), reverse=True):  # the folders the outputs were in, if empty
        if f != run_dir:
            with contextlib.suppress(OSError):
                f.rmdir()
    tops: dict[str, int] = {}
    for p in deleted:
        rel = p.relative_to(run_dir)
        key = rel.parts[0] + ("/" if len(rel.parts) > 1 else "")
        tops[key] = tops.get(key, 0) + 1
    said = [f"{k} ({n} file{'s' if n > 1 else ''})" if k.endswith("/") else k for k, n in tops.items()]
    kept = []
    for p in sorted(run_dir.iterdir()):
        if p.name in BOOKKEEPING:
            continue
        # partly the run's: what is left of it, file by file
        if p.is_dir() and not p.is_symlink() and p.name + "/" in tops:
            kept += [q.relative_to(run_dir).as_posix() for q in sorted(_tree(p)[0])]
        else:
            kept.append(p.name)
    return said, kept


# ---------------------------------------------------------------------------------------------------- the data
def data_record(data) -> dict:
    """What identifies the prepared data `data` (a data.PretrainData): its fingerprint, with the facts it covers, and
    every shard file's size and sha256 as read now (`check_files`: read once per process)."""
    return {"path": str(Path(data.path).resolve()), **data.fingerprint(), "files": data.check_files()}


def record_data(run_dir: Path, data) -> None:
    """RUN/dataset.json: the data this run trains on (written when a run starts or continues; the resume state holds
    the same record, which is what --resume checks)."""
    write_json(Path(run_dir) / DATASET_FILE, data_record(data))


def _describe(record: dict) -> str:
    rows = record.get("rows") or {}
    return (f"{record.get('path')} (fingerprint {str(record.get('fingerprint'))[:12]}, {rows.get('train', '?'):,} "
            f"training rows of {record.get('seq_len')} tokens, a {record.get('vocab_size')}-entry vocabulary)"
            if isinstance(rows.get("train"), int) else f"{record.get('path')} (fingerprint "
            f"{str(record.get('fingerprint'))[:12]})")


def _saved_record(run_dir: Path, state: dict | None) -> tuple[dict | None, str]:
    """The record of the data a run trained on, and where it was read: its resume state's (checked with the state's
    sha256.json), else RUN/dataset.json (runs of an earlier tinyelectra, whose resume state did not hold it); (None, "")
    when neither exists."""
    if state is not None and "data" in state:
        saved, where = state["data"], "its resume state"
    else:
        path = Path(run_dir) / DATASET_FILE
        if not path.is_file():
            return None, ""
        try:
            saved, where = json.loads(path.read_text(encoding="utf-8")), str(path)
        except (OSError, ValueError, UnicodeDecodeError) as e:
            raise UserError(f"{path}: damaged ({str(e)[:80]}); the data of the run cannot be checked (restore it, or "
                            "start over with --force)") from None
    if not isinstance(saved, dict) or not isinstance(saved.get("fingerprint"), str):
        raise UserError(f"{Path(run_dir)}: the record of its data ({where}) is damaged (no fingerprint); the data of "
                        "the run cannot be checked (restore it, or start over with --force)")
    return saved, where


def check_data(run_dir: Path, data, state: dict | None) -> str:
    """On --resume: the data given must be the data the run trained on, by its fingerprint and by every shard file's
    bytes (size and sha256, read now: data.check_files), against the record in the run's resume state `state`
    (trainer.json), else RUN/dataset.json; a difference is a UserError naming both. A run of this version (it keeps
    a record of its files, `Written`) without such a record is refused: it cannot be checked. Returns a note for the
    log: "" when all agree; for a run written before runs recorded their data, that it cannot be checked (accepted,
    and recorded from now on)."""
    saved, _ = _saved_record(run_dir, state)
    if saved is None:
        if (Path(run_dir) / RECORD_NAME).is_file():
            raise UserError(f"--resume: {run_dir} has no record of the data it trained on (its resume state and "
                            f"{DATASET_FILE} hold none), which this tinyelectra writes with every run: it cannot be "
                            f"checked that {data.path} is that data; start over with --force, or choose another --out")
        return (f"{run_dir} was started before runs recorded their data, so the data given ({data.path}) cannot be "
                "checked against it: continuing, and recording it in dataset.json for the next --resume")
    now = data_record(data)
    if saved["fingerprint"] != now["fingerprint"]:
        why = next((f"{k} {saved.get(k)!r} here, {now.get(k)!r} given"
                    for k in ("tokenizer", "vocab_size", "seq_len", "rows") if saved.get(k) != now.get(k)),
                   "the same sizes, other content")
        raise UserError(f"--resume: {run_dir} was trained on {_describe(saved)}, this command gives {_describe(now)}: "
                        f"other data ({why}); resume with the run's data, or start a new run (another --out, or "
                        "--force)")
    files = saved.get("files")
    # recorded by an earlier tinyelectra: the fingerprint covers the shards' sha256 where the manifest holds them
    # (bytes checked)
    if not isinstance(files, dict):
        return ("" if now.get("content") == "the shards' sha256" else
                f"{run_dir} recorded its data without the shards' sha256 (prepared before they were recorded), so the "
                f"bytes of {data.path} cannot be checked against it: continuing")
    for name, was in files.items():
        if not isinstance(was, dict) or now["files"].get(name) != {"bytes": was.get("bytes"),
                                                                   "sha256": was.get("sha256")}:
            got = now["files"].get(name)
            how = ("it is not in the data given" if got is None else
                   f"{was.get('bytes')} bytes with sha256 {str(was.get('sha256'))[:12]} then, {got['bytes']} bytes "
                   f"with sha256 {got['sha256'][:12]} now" if isinstance(was, dict) else "its record is damaged")
            raise UserError(f"--resume: {Path(data.path) / name} is not the file {run_dir} trained on ({how}): the "
                            "data changed since; resume with the run's data, or start a new run (another --out, or "
                            "--force)")
    return ""
