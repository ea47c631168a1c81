"""The folders a run reads from, when snakemake is started in one folder and works in another.

Three folders take part: the checkout (the Snakefile's folder, ``workflow.basedir``), where the bundled
``config.yaml`` is read from wherever snakemake runs; the folder snakemake was started in (its run directory), from
which a relative ``--configfile`` is read; and the working directory (the run directory, or ``--directory``), from
which every relative path *inside* the config is read (a dataset's ``path``, a ``plm`` folder) and where
``results/`` is written (docs/datasets.md, "Running from another folder").

* :func:`working_directory_config`: a ``config.yaml`` of the working directory that is not the bundled one, which
  the Snakefile reads after the bundled one (Snakemake's convention: a workflow's ``configfile:`` is read from the
  working directory) and before each ``--configfile``, naming it in the log.
* :func:`missing_raw_files`: the message for Snakemake's ``MissingInputException`` when the missing files are a
  dataset's raw files under a relative ``path``: where they were looked for, where they are if the run
  directory has them (``--directory`` moved the working directory away from them), and the fix.
"""

from __future__ import annotations

import filecmp
import os
from pathlib import Path

CONFIG_NAME = "config.yaml"


def _same_file(a: Path, b: Path) -> bool:
    """The same file, a link to it, or a copy of it byte for byte (a copy of the bundled config says nothing new)."""
    try:
        return a.resolve() == b.resolve() or filecmp.cmp(a, b, shallow=False)
    except OSError:
        return False


def working_directory_config(basedir: str | Path, workdir: str | Path) -> Path | None:
    """The working directory's own ``config.yaml``, read after the bundled one (and before each --configfile), as
    Snakemake reads a workflow's ``configfile:`` there; None where there is none, or where it is the bundled file
    or a copy of it (nothing to add)."""
    here = Path(workdir, CONFIG_NAME)
    if not here.is_file() or _same_file(here, Path(basedir, CONFIG_NAME)):
        return None
    return here


def _affected_files(message: str) -> list[str]:
    """The files Snakemake lists under ``affected files:`` in a ``MissingInputException``'s message."""
    if "affected files:" not in message:
        return []
    block = message.split("affected files:", 1)[1]
    files = []
    for line in block.splitlines()[1:]:
        if not line.startswith("        ") or not line.strip():
            break
        files.append(line.strip().split(" ")[0])
    return files


def missing_raw_files(message: str, datasets: dict, workdir: str | Path, rundir: str | Path,
                      basedir: str | Path | None = None) -> str | None:
    """The project's message for a ``MissingInputException`` (its ``message``) whose first missing file lies under
    a dataset's relative ``path``, or None (Snakemake's own message stands). Where the folder the path names is in
    ``rundir`` (--directory moved the working directory away from it) or in the checkout ``basedir`` (the bundled
    data, run from another folder), the message says so and the fix is its absolute path."""
    workdir = Path(workdir).resolve()
    elsewhere = [(Path(rundir).resolve(), "the folder snakemake was started in (--directory moved the working "
                                          "directory)")]
    if basedir is not None:
        elsewhere.append((Path(basedir).resolve(), "the workflow's checkout"))
    for missing in _affected_files(message):
        for name, dataset in datasets.items():
            path = dataset.get("path") if isinstance(dataset, dict) else None
            if not isinstance(path, str) or os.path.isabs(path):
                continue
            if Path(os.path.normpath(path)) not in (Path(os.path.normpath(missing)), *Path(missing).parents):
                continue
            where = (f"{missing}: a raw file of dataset {name!r} (`path: {path}`) is missing from the working "
                     f"directory {workdir}, which every relative path in the config is read from")
            for folder, what in elsewhere:
                if folder != workdir and (folder / path).exists():
                    return (f"{where}; the folder is {folder / path}, in {what}. Fix: write the dataset's "
                            f"path as an absolute path (`datasets: {{{name}: {{path: {folder / path}}}}}` in your "
                            f"--configfile), or run snakemake in {folder} without --directory (docs/datasets.md, "
                            "Running from another folder)")
            return (f"{where}. Fix: put the dataset's files there, or set the dataset's `path` to the folder that "
                    "holds them (an absolute path is read from anywhere; docs/datasets.md, Running from another "
                    "folder)")
    return None
