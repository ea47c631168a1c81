"""Write outputs atomically: a failed step leaves no partial file or folder behind.

A write that fails because the disk is full, a file-size limit is reached, the folder is not writable or
read-only, or a path component is a file, raises :class:`dpr_pipeline.errors.OutputWriteError` naming the
output, the cause and the fix, whichever library did the writing (pyarrow, safetensors, faiss, plain Python).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

from .errors import OutputWriteError

# errno -> (the cause as the C library words it, the fix)
_WRITE_FAILURES = {
    errno.ENOSPC: "free space on the disk holding {folder} (or point the workflow's results at a larger disk), "
                  "then rerun",
    errno.EDQUOT: "free space within your disk quota on {folder}, then rerun",
    errno.EFBIG: "the file-size limit was reached: raise it (ulimit -f unlimited) or free space, then rerun",
    errno.EACCES: "make {folder} writable for this user (chmod/chown) or run from a folder you own, then rerun",
    errno.EPERM: "make {folder} writable for this user (chmod/chown) or run from a folder you own, then rerun",
    errno.EROFS: "{folder} is on a read-only file system: run from a writable folder, then rerun",
    errno.ENOTDIR: "a part of the path {folder} is a file, not a folder: move that file away, then rerun",
}


_SHORT_WRITE = re.compile(r"\d+ requested and \d+ written")   # numpy's tofile: a short write, errno lost
_ANY_PATH = re.compile(r"(?<![\w.])/[\w.-]+/")


def _write_failure(error: BaseException, temporary: Path) -> int | None:
    """The errno of a failed write of ``temporary`` anywhere in ``error``'s chain, also when a library only kept
    its message (pyarrow, safetensors, faiss). Errors about other files (a failed read of an input) are not
    write failures: an OSError naming another file, a message naming another path, or a DataError."""
    from .errors import DataError

    seen = set()
    while error is not None and id(error) not in seen and not isinstance(error, DataError):
        seen.add(id(error))
        message = str(error)
        filename = getattr(error, "filename", None)
        about_output = str(temporary) in message or (str(filename).startswith(str(temporary)) if filename
                                                     else not _ANY_PATH.search(message))
        if about_output:
            code = getattr(error, "errno", None)
            if code in _WRITE_FAILURES:
                return code
            for candidate in _WRITE_FAILURES:
                if os.strerror(candidate) in message:
                    return candidate
            if _SHORT_WRITE.search(message):
                return errno.ENOSPC
        error = error.__cause__ or error.__context__
    return None


def _raise_write_failure(final: Path, error: BaseException, code: int | None) -> None:
    if code is None:
        return
    first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    cause = f"{os.strerror(code)} ({errno.errorcode[code]}; {type(error).__name__}: {first_line})"
    raise OutputWriteError(final, code, cause, _WRITE_FAILURES[code].format(folder=final.parent)) from error


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; move it into place only if the block succeeds.

    Works for a file or a folder. On error the temporary is removed and ``path`` is left untouched.
    A write that fails for lack of space or permission raises OutputWriteError (see the module docstring).
    """
    final = Path(path)
    try:
        if final.parent.exists() and not final.parent.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(final.parent))
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent))
    except OSError as error:
        _raise_write_failure(final, error, error.errno if error.errno in _WRITE_FAILURES else None)
        raise
    target = tmp / final.name
    try:
        yield target
        if not target.exists():
            raise FileNotFoundError(f"the step did not write {final}")
        if final.exists():
            _remove(final)
        os.replace(target, final)
    except OutputWriteError:
        raise
    except Exception as error:
        _raise_write_failure(final, error, _write_failure(error, tmp))
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def atomic_outputs(*paths: str | os.PathLike) -> Iterator[list[Path]]:
    """Several outputs that appear together or not at all."""
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(atomic_output(p)) for p in paths]
