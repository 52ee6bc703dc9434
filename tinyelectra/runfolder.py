"""Who writes an output folder, and what a run knows of its data: `holding` (one writer per --out: an OS lock that
names the process and host holding it) and `record_data` / `check_data` (the prepared dataset a run trains on, in
RUN/dataset.json, checked on --resume). Not here: what a run folder holds (train.open_run_dir), writing files safely
(files.py), reading prepared data (data.py).

The lock: `fcntl.flock` on a lock file (`FOLDER/.tinyelectra.lock`, or one the caller names, such as export's beside
its --out), taken without waiting and held until the command ends; the file holds the holder's command, pid, host
and start time, so a second writer is refused with one line saying who. The kernel drops the lock when its process
ends however it ends (kill -9 too), so a lock left by a killed process is simply taken again, with a note naming the
process that left it; a finished command deletes the file, and the folder too when the lock was all it held. The
file is deleted while still locked and a taker checks that the file it locked is still the one at the path, so two
takers never both hold it. Under torchrun only rank 0 takes it (only rank 0 writes). On NFS, flock is a POSIX lock
through the server's lock manager, so it holds across machines; a lock held from another machine is refused like any
other, but whether that process still runs cannot be checked from here, and the line says so (and what to delete if
it does not). A file system without locks (ENOLCK) is said once and the command goes on without one.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shlex
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from tinyelectra.errors import UserError
from tinyelectra.files import pid_alive, write_json

LOCK_NAME = ".tinyelectra.lock"
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


class OutputLock:
    """A held lock on an output folder (see the module docstring); `release` ends it."""

    def __init__(self, directory: Path, lock_file: Path, flag: str, command: str) -> None:
        self.directory, self.lock_file, self.fd = directory, lock_file, -1
        self.created: list[Path] = []  # folders made for the lock, removed again if it was all they held
        missing, p = [], lock_file.parent
        while not p.exists() and not p.is_symlink() and p != p.parent:
            missing.append(p)
            p = p.parent
        if directory.exists() and not directory.is_dir():
            raise UserError(f"{flag} {directory}: exists and is not a directory")
        try:
            for d in reversed(missing):
                d.mkdir()
                self.created.append(d)
            self._take(flag, command)
        except OSError as e:
            self.release()
            raise UserError(f"{flag} {directory}: cannot write there ({e.strerror or e})") from None
        except BaseException:
            self.release()
            raise

    def _take(self, flag: str, command: str) -> None:
        while True:
            fd = os.open(self.lock_file, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
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
                                    f"one command writes a folder at a time: wait for it, or choose another {flag}") from None
                raise
            try:  # the file locked must still be the one at the path (an ending holder deletes it while locked)
                same = os.path.samestat(os.fstat(fd), os.stat(self.lock_file))
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        self.fd = fd
        left = _read_record(fd)  # a record still there: its process ended without releasing (killed)
        if left:
            print(f"· {flag} {self.directory}: taking over the lock left by {left.get('command') or 'a process'} "
                  f"(pid {left.get('pid')} on {'this machine' if left.get('host') == socket.gethostname() else left.get('host')}"
                  f"{', since ' + left['started_utc'] if left.get('started_utc') else ''}), which ended without "
                  "releasing it", file=sys.stderr)
        record = {"command": command, "pid": os.getpid(), "host": socket.gethostname(),
                  "started_utc": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
        data = json.dumps(record).encode("utf-8")
        os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0)
        os.fsync(fd)

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
    """Who holds the lock on `folder` right now, in words (as a refusal names it), or None when nobody does."""
    lock_file = Path(folder) / LOCK_NAME
    try:
        fd = os.open(lock_file, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return None
    except OSError as e:
        return _holder_text(_read_record(fd), lock_file) if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES) else None
    finally:
        os.close(fd)


@contextlib.contextmanager
def holding(directory: Path, flag: str, enabled: bool = True, lock_file: Path | None = None) -> Iterator[None]:
    """Hold the lock on the output folder `directory` (given as `flag`, e.g. "--out") for the block; a folder in use
    is a one-line UserError naming who uses it. `lock_file`: where the lock lives (default FOLDER/.tinyelectra.lock).
    `enabled` False (a torchrun rank other than 0): nothing is locked."""
    if not enabled:
        yield
        return
    directory = Path(directory)
    command = "tinyelectra " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv[1:] else "tinyelectra"
    lock = OutputLock(directory, Path(lock_file) if lock_file else directory / LOCK_NAME, flag, command)
    try:
        yield
    finally:
        lock.release()


# ---------------------------------------------------------------------------------------------------- the data
def data_record(data) -> dict:
    """What identifies the prepared data `data` (a data.PretrainData): its fingerprint, with the facts it covers."""
    return {"path": str(Path(data.path).resolve()), **data.fingerprint()}


def record_data(run_dir: Path, data) -> None:
    """RUN/dataset.json: the data this run trains on (written when a run starts or continues)."""
    write_json(Path(run_dir) / DATASET_FILE, data_record(data))


def _describe(record: dict) -> str:
    rows = record.get("rows") or {}
    return (f"{record.get('path')} (fingerprint {str(record.get('fingerprint'))[:12]}, {rows.get('train', '?'):,} "
            f"training rows of {record.get('seq_len')} tokens, a {record.get('vocab_size')}-entry vocabulary)"
            if isinstance(rows.get("train"), int) else f"{record.get('path')} (fingerprint {str(record.get('fingerprint'))[:12]})")


def check_data(run_dir: Path, data) -> str:
    """On --resume: the data given must be the data the run trained on (RUN/dataset.json), else a UserError naming
    both. Returns a note for the log: "" when they agree; for a run written before runs recorded their data, that it
    cannot be checked (accepted, and recorded from now on)."""
    path = Path(run_dir) / DATASET_FILE
    if not path.is_file():
        return (f"{run_dir} was started before runs recorded their data, so the data given ({data.path}) cannot be "
                "checked against it: continuing, and recording it in dataset.json for the next --resume")
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(saved, dict) or not isinstance(saved.get("fingerprint"), str):
            raise ValueError("no fingerprint")
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: damaged ({str(e)[:80]}); the data of the run cannot be checked (restore it, or "
                        "delete it to continue unchecked)") from None
    now = data_record(data)
    if saved["fingerprint"] == now["fingerprint"]:
        return ""
    why = next((f"{k} {saved.get(k)!r} here, {now.get(k)!r} given" for k in ("tokenizer", "vocab_size", "seq_len", "rows")
                if saved.get(k) != now.get(k)), "the same sizes, other content")
    raise UserError(f"--resume: {run_dir} was trained on {_describe(saved)}, this command gives {_describe(now)}: other "
                    f"data ({why}); resume with the run's data, or start a new run (another --out, or --force)")

