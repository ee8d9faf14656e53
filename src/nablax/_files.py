"""Atomic file writes for ``nx.save`` (_io.py): a temporary file in the same directory, synced,
then renamed over the target, so a reader sees the old file or the new one, never a part.

A symlink is written through (its target is replaced, the link kept); a replaced file keeps its
mode, a new one gets ``0o666`` less the umask; errors name the user's path, never the hidden
temporary name.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat


def _os_error(e: OSError, path: str, what: str = "") -> OSError:
    """``e`` reported with the user's ``path`` (not the temporary file's)."""
    msg = f"nx.save: cannot write {path}: {what or e.strerror or e}"
    return OSError(e.errno, msg, path) if e.errno is not None else OSError(msg)


def write_atomic(path: str, data: bytes) -> None:
    """``data`` to ``path`` through a temporary file in the same directory, renamed over it."""
    target = os.path.realpath(path)  # a symlink is written through: its target is replaced
    directory = os.path.dirname(target)
    if not os.path.isdir(directory):
        e = FileNotFoundError(errno.ENOENT, "")
        fix = "Fix: create it first (os.makedirs(..., exist_ok=True))"
        raise _os_error(e, path, f"the directory {directory} does not exist. {fix}")
    if os.path.isdir(target):
        fix = f"Fix: name a file in it, e.g. {os.path.join(path, 'ckpt.safetensors')}"
        raise _os_error(IsADirectoryError(errno.EISDIR, ""), path, f"it is a directory. {fix}")
    try:
        mode = stat.S_IMODE(os.stat(target).st_mode)  # a replaced file keeps its mode
    except OSError:
        mode = None  # a new file: 0o666 less the umask, as open() gives
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    for _ in range(100):
        tmp = os.path.join(directory, f".nablax-save-{secrets.token_hex(8)}.tmp")
        try:
            fd = os.open(tmp, flags, 0o666)
            break
        except FileExistsError:
            continue
        except OSError as e:
            raise _os_error(e, path) from None
    else:
        raise _os_error(FileExistsError(errno.EEXIST, "no free temporary name"), path)
    try:
        with os.fdopen(fd, "wb") as f:
            if mode is not None:
                os.chmod(tmp, mode)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, OSError):
            raise _os_error(e, path) from None
        raise
    if hasattr(os, "O_DIRECTORY"):  # make the rename itself durable
        try:
            dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except OSError:
            pass
