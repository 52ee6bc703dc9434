"""Small files written atomically (a temporary file beside the target, then a rename) with an ordinary file's
permissions: `tempfile.mkstemp` creates files only their owner can read (0600), which teammates on a shared server
could not open; the result here is 0666 minus the umask (0644 under the usual 022), as `open()` would give.
Not here: checkpoints and datasets (whole directories, renamed into place: checkpoint.py, data.py)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def _umask() -> int:
    mask = os.umask(0o022)  # the only way to read it is to set it: put it back at once
    os.umask(mask)
    return mask


def write_atomic(path: str | Path, data: bytes | str) -> Path:
    """Write `data` (str as UTF-8) to `path` all at once: a reader sees the old file or the new one, never half."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
