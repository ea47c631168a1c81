"""Write outputs atomically: a failed step leaves no partial file or folder behind."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; move it into place only if the block succeeds.

    Works for a file or a folder. On error the temporary is removed and ``path`` is left untouched.
    """
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent))
    target = tmp / final.name
    try:
        yield target
        if not target.exists():
            raise FileNotFoundError(f"the step did not write {final}")
        if final.exists():
            _remove(final)
        os.replace(target, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def atomic_outputs(*paths: str | os.PathLike) -> Iterator[list[Path]]:
    """Several outputs that appear together or not at all."""
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(atomic_output(p)) for p in paths]
