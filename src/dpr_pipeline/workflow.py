"""Helpers for the thin ``workflow_scripts/``: send logging and tracebacks to the rule's log file."""

from __future__ import annotations

import contextlib
import logging
import sys
import traceback
from pathlib import Path
from typing import Iterator


@contextlib.contextmanager
def logged(log_file: str | Path, threads: int | None = None) -> Iterator[logging.Logger]:
    """Log INFO and above to ``log_file`` and stderr; write any exception's traceback there, then re-raise.

    ``threads``: the job's CPU threads (Snakemake's ``threads``), given to PyTorch's intra-op pool.
    """
    Path(log_file).parent.mkdir(parents=True, exist_ok=True)
    handlers = [logging.FileHandler(log_file, mode="w", encoding="utf-8"), logging.StreamHandler(sys.stderr)]
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        handlers=handlers, force=True)
    logging.getLogger("faiss").setLevel(logging.WARNING)
    logger = logging.getLogger("dpr_pipeline")
    if threads:
        import torch

        torch.set_num_threads(threads)
    try:
        yield logger
    except BaseException:
        logger.error("failed:\n%s", traceback.format_exc())
        raise
