"""Writing files so that nothing is ever half-written, and reading back only what was written whole.

- `write_atomic`: small files written at once (a temporary file beside the target, fsync, then a rename: a reader
  sees the old file or the new one, never half) with an ordinary file's permissions: `tempfile.mkstemp` creates files
  only their owner can read (0600), which teammates on a shared server could not open; the result here is 0666 minus
  the umask (0644 under the usual 022), as `open()` would give.
- `write_sha256` / `verify_sha256`: a `sha256.json` beside the files of a checkpoint or resume state, written last and
  checked on load; a flipped byte or a truncated file is a one-line error naming the file.
- `check_writable`: proves an output location can be written before any long work, and leaves nothing behind.
- `os_error_line`: the one-line text for an OSError of the place written to (a full disk, a read-only location).
- `replace_dir`: a finished temporary directory renamed onto its final name (a prepared dataset, an export), an
  older one renamed away first, then deleted; `staged_dir`: a temporary directory to write into, its files fsynced
  and put in place by `replace_dir` on success, removed on any error (checkpoints, resume states, exports).
Not here: what the files hold.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from tinyelectra.errors import UserError

SHA256_FILE = "sha256.json"
# errors of the place written to, not of the program: a full disk or quota, a file-size limit, a read-only file
# system, no permission, a path through a regular file, ...
WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM,
                          errno.ENOTDIR, errno.EISDIR, errno.ENAMETOOLONG, errno.ENOENT, errno.EEXIST, errno.EIO})


def os_error_line(e: OSError) -> str:
    """'PATH: No space left on device' — the file and the system's reason, on one line."""
    where = f"{e.filename}: " if e.filename is not None else ""
    return f"{where}{e.strerror or e}"


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


def write_atomic(path: str | Path, data: bytes | str) -> Path:
    """Write `data` (str as UTF-8) to `path` all at once: a reader sees the old file or the new one, never half. A
    failed write (a full disk) leaves the old file and no temporary one, and its OSError names `path`."""
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
        raise OSError(e.errno, e.strerror, str(path)) from None  # name the file meant, not the temporary one
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def replace_dir(tmp: Path, final: Path) -> None:
    """Move a finished temporary directory onto `final`, replacing an older one (rename, never copy)."""
    fsync_dir(tmp)
    old = None
    if final.exists():
        old = final.with_name(f"{final.name}.old-{os.getpid()}")
        os.replace(final, old)
    os.replace(tmp, final)
    fsync_dir(final.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def staged_dir(directory: Path) -> Iterator[Path]:
    """A fresh `NAME.tmp-<pid>` beside `directory` to write into: on success its files are fsynced and it replaces
    `directory`; on any error or interrupt it is removed, leaving `directory` as it was."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = directory.with_name(f"{directory.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
        for p in tmp.rglob("*"):
            if p.is_file():
                fsync_file(p)
        replace_dir(tmp, directory)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def write_json(path: str | Path, obj) -> Path:
    """`obj` as indented JSON, atomically; text outside ASCII (a Korean path, a Japanese task name) stays readable."""
    return write_atomic(path, json.dumps(obj, indent=2, ensure_ascii=False) + "\n")


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


def verify_sha256(directory: Path, what: str) -> bool:
    """Check every file listed in `directory/sha256.json`; a missing or changed one is a UserError naming it.
    Returns False (nothing checked) for a directory written before checksums existed."""
    directory = Path(directory)
    listing = directory / SHA256_FILE
    if not listing.exists():
        return False
    try:
        sums = json.loads(listing.read_text(encoding="utf-8"))
        if not isinstance(sums, dict):
            raise ValueError("not a table")
    except (ValueError, UnicodeDecodeError, OSError) as e:
        raise UserError(f"{listing}: damaged ({first_line(e)}); {what} cannot be checked") from None
    for name, digest in sums.items():
        path = directory / name
        if not path.is_file():
            raise UserError(f"{directory}: {what} is missing {name}")
        if sha256_of(path) != digest:
            raise UserError(f"{path}: damaged (its sha256 differs from the one written with it); {what} cannot be used")
    return True


def check_writable(directory: Path, flag: str) -> None:
    """Create `directory` if needed, write and delete a probe file in it, and remove the directories this created:
    an unwritable, full or impossible output location is a one-line UserError before any work, leaving nothing."""
    directory = Path(directory)
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
            raise UserError(f"{flag} {directory}: exists and is not a directory")
        fd, probe = tempfile.mkstemp(prefix=".write-test-", dir=directory)
        try:
            os.write(fd, b"ok\n")
            os.fsync(fd)
        finally:
            os.close(fd)
            os.unlink(probe)
    except OSError as e:
        raise UserError(f"{flag} {directory}: cannot write there ({e.strerror or e})") from None
    finally:
        for d in reversed(created):
            try:
                d.rmdir()
            except OSError:
                pass


def first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0][:200] if text else type(e).__name__
