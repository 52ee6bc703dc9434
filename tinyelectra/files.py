"""Writing files so that nothing is ever half-written, and reading back only what was written whole.

- `write_atomic`: small files written at once (a temporary file beside the target, fsync, then a rename: a reader
  sees the old file or the new one, never half) with an ordinary file's permissions: `tempfile.mkstemp` creates files
  only their owner can read (0600), which teammates on a shared server could not open; the result here is 0666 minus
  the umask (0644 under the usual 022), as `open()` would give.
- `write_sha256` / `verify_sha256`: a `sha256.json` beside the files of a checkpoint or resume state, written last and
  checked on load; a flipped byte or a truncated file is a one-line error naming the file, and so is a missing
  sha256.json where the directory's description says one was written (`written_with_checksums`), or a listing that
  leaves out a file the reader loads.
- `check_writable`: proves an output location can be written before any long work, and leaves nothing behind.
- `os_error_line`: the one-line text for an OSError of the place written to (a full disk, a read-only location):
  the path meant and, for a `WriteError`, what was being written ("... while writing the checkpoint").
- `replace_dir`: a finished temporary directory renamed onto its final name, replacing an older one only where the
  folder's record (runfolder.Written) lists all it holds; `staged_dir`: a temporary directory to write into, its files
  fsynced, given an ordinary file's permissions (safetensors, like mkstemp, creates 0600 files) and put in place by
  `replace_dir` on success, removed on any error (checkpoints, resume states, exports).
- `append_line`: one line added to a log; a failed write takes back what it wrote.
- `path_part`: a name read from a file (a task's, a recipe's) checked before it becomes part of a path.
Not here: what the files hold; who may write an output folder (runfolder.py).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from tinyelectra.errors import UserError

SHA256_FILE = "sha256.json"
# errors of the place written to, not of the program: a full disk or quota, a file-size limit, a read-only file
# system, no permission, a path through a regular file, ...
WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM,
                          errno.ENOTDIR, errno.EISDIR, errno.ENAMETOOLONG, errno.ENOENT, errno.EEXIST, errno.EIO})


class WriteError(OSError):
    """An OSError of the place written to (errno in WRITE_ERRNOS) that names the path meant and what was being written
    (`what`: "checkpoint", "resume state", ...). Raised only where the half-written output was removed."""

    what = ""


def _write_error(e: OSError, path: str | Path, what: str) -> WriteError:
    """`e`, an error of the place written to, as a WriteError naming `path` (not a temporary file inside it) and
    `what`; one that already names them is kept."""
    if isinstance(e, WriteError):
        return e
    named = WriteError(e.errno, e.strerror or str(e), str(path))
    named.what = what
    return named


def os_error_line(e: OSError) -> str:
    """'PATH: No space left on device' — the file and the system's reason, on one line; for a WriteError also what
    was being written and that nothing half-written was kept."""
    where = f"{e.filename}: " if e.filename is not None else ""
    what = (f" while writing the {e.what} (nothing half-written was kept)"
            if isinstance(e, WriteError) and e.what else "")
    return f"{where}{e.strerror or e}{what}"


def _umask() -> int:
    mask = os.umask(0o022)  # the only way to read it is to set it: put it back at once
    os.umask(mask)
    return mask


def fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # some platforms cannot open directories; the rename is still atomic
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str | Path, data: bytes | str, what: str = "") -> Path:
    """Write `data` (str as UTF-8) to `path` all at once: a reader sees the old file or the new one, never half. A
    failed write (a full disk) leaves the old file and no temporary one, and its OSError names `path` (and `what`
    it holds, where the name does not say it: "report", "GLUE results")."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        if e.errno in WRITE_ERRNOS:
            raise _write_error(e, path, what) from None
        raise OSError(e.errno, e.strerror, str(path)) from None  # name the file meant, not the temporary one
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def append_line(path: Path, line: str, what: str) -> None:
    """Add `line` and a newline to the end of `path` in one write; a failed write (a full disk) cuts the file back to
    its old length, so no torn line stays, and raises a WriteError naming `path` and `what`."""
    with open(path, "ab") as f:
        size = f.tell()
        try:
            f.write(line.encode("utf-8") + b"\n")
            f.flush()
        except OSError as e:
            with contextlib.suppress(OSError):
                f.truncate(size)
            if e.errno not in WRITE_ERRNOS:
                raise
            raise _write_error(e, path, what) from None


def replace_dir(tmp: Path, final: Path, written=None) -> None:
    """Move a finished temporary directory onto `final` (rename, never copy). An existing `final` is replaced only
    when `written` (the record of the folder it is in: runfolder.Written) lists everything it holds, what it lists
    deleted first; one holding anything else is a UserError naming it, and stays as it was. Without a record (library
    use, outside a command) an existing `final` is replaced whole."""
    fsync_dir(tmp)
    old = None
    if written is not None:
        if final.exists() or final.is_symlink():
            if others := written.foreign(final):
                raise UserError(f"{final}: holds {others[0].relative_to(final.parent)}"
                                f"{f' and {len(others) - 1} more' if len(others) > 1 else ''}, which no record of "
                                f"tinyelectra's lists; {final.name} is written again, which would replace it: move it "
                                "away, then run the command again")
            written.delete(under=final)
        written.add_tree(tmp, final)
    elif final.exists():
        old = final.with_name(f"{final.name}.old-{os.getpid()}")
        os.replace(final, old)
    os.replace(tmp, final)
    fsync_dir(final.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def staged_dir(directory: Path, what: str, written=None) -> Iterator[Path]:
    """A fresh `NAME.tmp-<pid>` beside `directory` to write into: on success its files get an ordinary file's
    permissions (0644 under the usual umask), are fsynced and it replaces `directory` (`replace_dir`: with the record
    `written`, only what that record lists, and the files put in place are recorded first); on any error or interrupt
    it is removed, leaving `directory` as it was, and an OSError of the place written to names `directory` and `what`
    (e.g. "checkpoint") was being written."""
    tmp = directory.with_name(f"{directory.name}.tmp-{os.getpid()}")
    try:
        directory.parent.mkdir(parents=True, exist_ok=True)
        if written is not None:
            written.add(directory, kind="dir")  # before the first byte: its temporary folder is then on record too
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        yield tmp
        mode = 0o666 & ~_umask()
        for p in tmp.rglob("*"):
            if p.is_file():
                os.chmod(p, mode)
                fsync_file(p)
        replace_dir(tmp, directory, written)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        elsewhere = e.filename is not None and not str(e.filename).startswith(str(tmp))  # e.g. a file being read
        if e.errno not in WRITE_ERRNOS or elsewhere:
            raise
        raise _write_error(e, directory, what) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def write_json(path: str | Path, obj, what: str = "") -> Path:
    """`obj` as indented JSON, atomically (`write_atomic`); text outside ASCII (a Korean path, a Japanese task name)
    stays readable."""
    return write_atomic(path, json.dumps(obj, indent=2, ensure_ascii=False) + "\n", what)


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_sha256(directory: Path, paths: list[Path] | None = None) -> None:
    """Record the sha256 of `paths` (default: every file under `directory`) in `directory/sha256.json`; call it last,
    before the directory is renamed into place."""
    directory = Path(directory)
    if paths is None:
        paths = [p for p in sorted(directory.rglob("*")) if p.is_file() and p.name != SHA256_FILE]
    sums = {Path(p).relative_to(directory).as_posix(): sha256_of(p) for p in paths}
    (directory / SHA256_FILE).write_text(json.dumps(sums, indent=2) + "\n", encoding="utf-8")


_WARNED: set[str] = set()


def verify_sha256(directory: Path, what: str, required: bool, guards: tuple[str, ...]) -> bool:
    """Check every file listed in `directory/sha256.json`; a missing or changed one is a UserError naming it, and so
    is a file of `guards` (the files the reader loads) that is there but not listed, or an empty listing: an entry
    removed, or `{}`, would let a changed file through unchecked.
    Without sha256.json: where `required` (the directory says this version wrote it, see `written_with_checksums`)
    a UserError, for its absence is itself damage; else (written before checksums existed) a one-line warning on
    stderr naming the directory, and False (nothing checked)."""
    directory = Path(directory)
    listing = directory / SHA256_FILE
    if not listing.exists():
        if required:
            raise UserError(f"{directory}: {what} has no {SHA256_FILE}, which is written with every one: it is "
                            "incomplete or damaged, and its files cannot be checked")
        if str(directory) not in _WARNED:  # once per directory: glue --released-lr loads each checkpoint twice
            _WARNED.add(str(directory))
            print(f"warning: {directory}: {what} has no {SHA256_FILE} (written before checksums existed), so its "
                  "files cannot be checked", file=sys.stderr)
        return False
    try:
        sums = json.loads(listing.read_text(encoding="utf-8"))
        if not isinstance(sums, dict):
            raise ValueError("not a table")
    except (ValueError, UnicodeDecodeError, OSError) as e:
        raise UserError(f"{listing}: damaged ({first_line(e)}); {what} cannot be checked") from None
    unlisted = [name for name in guards if name not in sums and (directory / name).exists()]
    if unlisted or not sums:
        which = "no entries" if not sums else f"no entry for {unlisted[0]}"
        raise UserError(f"{listing}: damaged ({which}); {what} cannot be checked without it")
    for name, digest in sums.items():
        if Path(name).is_absolute() or ".." in Path(name).parts:
            raise UserError(f"{listing}: damaged (it names {name!r}, outside {directory}); {what} cannot be checked")
        path = directory / name
        if not path.is_file():
            raise UserError(f"{directory}: {what} is missing {name}")
        if sha256_of(path) != digest:
            raise UserError(f"{path}: damaged (its sha256 differs from the one written with it); {what} cannot be used")
    return True


# in the JSON file that describes a checkpoint or resume state: "sha256.json" = one is written
CHECKSUMS_KEY = "checksums"


def written_with_checksums(described_by: Path) -> bool:
    """Whether the JSON file describing a directory (a checkpoint's config.json, a resume state's trainer.json) says
    a sha256.json was written with it; False when it does not or cannot be read (its reader reports that)."""
    try:
        return json.loads(Path(described_by).read_text(encoding="utf-8")).get(CHECKSUMS_KEY) == SHA256_FILE
    except (OSError, ValueError, UnicodeDecodeError, AttributeError):
        return False


def check_writable(directory: Path, flag: str, given: Path | None = None) -> None:
    """Create `directory` if needed, write and delete a probe file in it, and remove the directories this created:
    an unwritable, full or impossible output location is a one-line UserError before any work, leaving nothing.
    `given`: the path the user gave as `flag` when `directory` is another (the folder an output is written beside,
    or one inside it); the line names it first, then the folder that could not be written."""
    directory = Path(directory)
    shown = f"{flag} {given}" if given is not None and Path(given) != directory else f"{flag} {directory}"
    inside = f"{directory}: " if shown != f"{flag} {directory}" else ""
    missing: list[Path] = []
    p = directory
    while not p.exists() and not p.is_symlink() and p != p.parent:
        missing.append(p)
        p = p.parent
    created: list[Path] = []
    try:
        for d in reversed(missing):
            d.mkdir()
            created.append(d)
        if not directory.is_dir():
            raise UserError(f"{shown}: {inside}exists and is not a directory")
        fd, probe = tempfile.mkstemp(prefix=".write-test-", dir=directory)
        try:
            os.write(fd, b"ok\n")
            os.fsync(fd)
        finally:
            os.close(fd)
            os.unlink(probe)
    except OSError as e:
        raise UserError(f"{shown}: cannot write there ({inside}{e.strerror or e})") from None
    finally:
        for d in reversed(created):
            try:
                d.rmdir()
            except OSError:
                pass


def first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0][:200] if text else type(e).__name__


def path_part(name: str, what: str) -> str:
    """`name`, read from a file, checked before it becomes part of a path (a task's name in its submission file's
    name, a recipe's in the run folder's): one plain name, so nothing is written outside the folder meant. Empty (or
    only white space), ".", "..", a path separator (so an absolute path too) or a NUL is a one-line UserError naming
    `what` it is."""
    bad = ("is empty" if not name.strip() else "is . or .." if name.strip() in (".", "..") else
           "holds a path separator (/ or \\)" if "/" in name or "\\" in name else
           "holds a NUL character" if "\0" in name else "")
    if bad:
        raise UserError(f"{what} {name!r} {bad}: it becomes part of a file name, so it must be one name, not a path")
    return name


def pid_alive(pid: int) -> bool:
    """Whether a process of this machine with this id exists (another user's counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        pass
    return True
