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

from dpr_pipeline.errors import DataError, OutputWriteError

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


def _write_failure(error: BaseException, temporaries: list[Path]) -> tuple[int, list[int]] | None:
    """(errno, indices of the outputs concerned) of a failed write of one of ``temporaries`` anywhere in
    ``error``'s chain, also when a library only kept its message (pyarrow, safetensors, faiss, numpy).

    Errors about other files (a failed read of an input) are not write failures: an OSError naming another
    file, a message naming another path, or a DataError. A message naming no file concerns every output."""
    seen = set()
    while error is not None and id(error) not in seen and not isinstance(error, DataError):
        seen.add(id(error))
        message = str(error)
        filename = getattr(error, "filename", None)
        named = [i for i, t in enumerate(temporaries)
                 if str(t) in message or filename and str(filename).startswith(str(t))]
        concerned = named or ([] if filename or _ANY_PATH.search(message) else list(range(len(temporaries))))
        if concerned:
            code = getattr(error, "errno", None)
            if code not in _WRITE_FAILURES:
                code = next((c for c in _WRITE_FAILURES if os.strerror(c) in message),
                            errno.ENOSPC if _SHORT_WRITE.search(message) else None)
            if code is not None:
                return code, concerned
        error = error.__cause__ or error.__context__
    return None


def _raise_write_failure(finals: list[Path], error: BaseException, code: int) -> None:
    first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    cause = f"{os.strerror(code)} ({errno.errorcode[code]}; {type(error).__name__}: {first_line})"
    if _SHORT_WRITE.search(first_line):
        cause = f"a short write: the disk is full or a file-size limit was reached ({first_line})"
    raise OutputWriteError(" and ".join(map(str, finals)), code, cause,
                           _WRITE_FAILURES[code].format(folder=finals[0].parent)) from error


@contextlib.contextmanager
def _translated(finals: list[Path], temporaries: list[Path]) -> Iterator[None]:
    """Raise a failed write inside the block as OutputWriteError naming the output(s) concerned."""
    try:
        yield
    except OutputWriteError:
        raise
    except Exception as error:
        failure = _write_failure(error, temporaries)
        if failure is not None:
            code, concerned = failure
            _raise_write_failure([finals[i] for i in concerned], error, code)
        raise


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


@contextlib.contextmanager
def _atomic_output(final: Path) -> Iterator[Path]:
    """atomic_output without translating errors raised inside the block."""
    try:
        if final.parent.exists() and not final.parent.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(final.parent))
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent))
    except OSError as error:
        if error.errno in _WRITE_FAILURES:
            _raise_write_failure([final], error, error.errno)
        raise
    target = tmp / final.name
    try:
        yield target
        with _translated([final], [tmp]):
            if not target.exists():
                raise FileNotFoundError(f"the step did not write {final}")
            if final.exists():
                _remove(final)
            os.replace(target, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; move it into place only if the block succeeds.

    Works for a file or a folder. On error the temporary is removed and ``path`` is left untouched.
    A write that fails for lack of space or permission raises OutputWriteError (see the module docstring).
    """
    with _atomic_output(Path(path)) as target, _translated([Path(path)], [target.parent]):
        yield target


@contextlib.contextmanager
def atomic_outputs(*paths: str | os.PathLike) -> Iterator[list[Path]]:
    """Several outputs that appear together or not at all."""
    finals = [Path(p) for p in paths]
    with contextlib.ExitStack() as stack:
        targets = [stack.enter_context(_atomic_output(p)) for p in finals]
        with _translated(finals, [t.parent for t in targets]):
            yield targets
