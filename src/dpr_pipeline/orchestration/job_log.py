"""A job's log: every workflow script runs inside :func:`logged`, which sends logging and tracebacks to the rule's
log file and the project's own message to the terminal."""

from __future__ import annotations

import contextlib
import logging
import sys
import traceback
from pathlib import Path
from typing import Iterator

from dpr_pipeline.errors import PipelineError
from dpr_pipeline.layout import error_file
from dpr_pipeline.orchestration.run_errors import job_error_line, write_job_error

#: Third-party log messages that tell the user nothing, by the logger that emits them and how they begin:
#: transformers' tensor-parallel plan report (printed for every model load, although no model here is loaded
#: tensor-parallel) and its notes on weights it leaves untied. Everything else those loggers say stays.
NOISE = {
    "transformers.distributed.tensor_parallel": ("The following layers were not sharded",
                                                 "The following TP rules were not applied"),
    "transformers.modeling_utils": ("The tied weights mapping and config for this model",),
}


class ThirdPartyNoise(logging.Filter):
    """Drops the :data:`NOISE` messages of one logger."""

    def __init__(self, prefixes: tuple[str, ...]):
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefixes)


def quiet_third_party() -> None:
    """Attach :class:`ThirdPartyNoise` to each logger of :data:`NOISE` (once): a logger's filter sees every record
    it emits, whichever handler (transformers' own on stderr, the job's log file) would print it, and whether or
    not the library is imported yet (``logging.getLogger`` returns the logger the library later uses)."""
    for name, prefixes in NOISE.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, ThirdPartyNoise) for f in logger.filters):
            logger.addFilter(ThirdPartyNoise(prefixes))


@contextlib.contextmanager
def logged(log_file: str | Path, threads: int | None = None) -> Iterator[logging.Logger]:
    """Log INFO and above to ``log_file`` and stderr; an exception's traceback goes to ``log_file``, and its
    message to the job's error file (:func:`~dpr_pipeline.layout.error_file`), which the Snakefile's
    ``onerror``
    shows as the run's last lines (:mod:`dpr_pipeline.orchestration.run_errors`).

    A :class:`~dpr_pipeline.errors.PipelineError` (bad data or config, an unusable checkpoint, an output that
    cannot be written) is the user's to fix: stderr gets its message alone, without the traceback, and the job
    exits with status 1. Any other exception is a bug: re-raised, so Python prints its traceback on stderr
    (once: the log file's copy is not echoed there).

    ``threads``: the job's CPU threads (Snakemake's ``threads``), given to PyTorch's intra-op pool.
    """
    Path(log_file).parent.mkdir(parents=True, exist_ok=True)
    error_path = Path(error_file(str(log_file)))
    error_path.unlink(missing_ok=True)      # a message of an earlier run of this job is not this run's
    console = logging.StreamHandler(sys.stderr)
    handlers = [logging.FileHandler(log_file, mode="w", encoding="utf-8"), console]
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        handlers=handlers, force=True)
    logging.getLogger("faiss").setLevel(logging.WARNING)
    quiet_third_party()
    logger = logging.getLogger("dpr_pipeline")
    if threads:
        import torch

        torch.set_num_threads(threads)
    try:
        yield logger
    except BaseException as error:
        logging.getLogger().removeHandler(console)
        logger.error("failed:\n%s", traceback.format_exc())
        if not isinstance(error, Exception):      # Ctrl-C, sys.exit: nothing to report
            raise
        write_job_error(error_path, error)
        if not isinstance(error, PipelineError):
            raise
        print(job_error_line(error), file=sys.stderr, flush=True)
        raise SystemExit(1) from None
