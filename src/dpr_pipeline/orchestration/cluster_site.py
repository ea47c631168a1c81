"""The site file: the Slurm cluster described once (the config's ``cluster`` block), outside git, and read by every
run, so that ``snakemake --profile slurm <target>`` needs no ``--configfile`` (docs/cluster.md).

Which file (:func:`site_path`): the one ``$DPR_PIPELINE_SITE`` names, else ``site.yaml`` in the working directory
(the repository root, where the cluster command runs); a relative path is read from the working directory. It
holds the ``cluster`` block and nothing else, checked against the schema's ``cluster`` part as it is read
(:func:`read_site`: one error naming the file, the key and the fix).

Precedence: rules/common.smk reads it with Snakemake's own ``workflow.configfile``, after the bundled config.yaml
and the working directory's, so every ``--configfile`` and ``--config`` still extends it: a cluster key given on
the command line wins, and the log names it (:func:`site_overrides`).

``make site`` proposes one from what the cluster says (:mod:`dpr_pipeline.orchestration.site_probe`); each fix of
a cluster key in the preflight's lines names it (:func:`site_label`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

from dpr_pipeline.errors import ConfigError
from dpr_pipeline.orchestration.config import SCHEMA_PATH, read_yaml, validate_block

SITE_ENV = "DPR_PIPELINE_SITE"
SITE_NAME = "site.yaml"


def site_path() -> Path:
    """Where the site file is: ``$DPR_PIPELINE_SITE``, else ``site.yaml`` (relative to the working directory)."""
    return Path(os.environ.get(SITE_ENV) or SITE_NAME)


def site_file() -> Path | None:
    """The site file a run reads; None where there is none. ``$DPR_PIPELINE_SITE`` naming no file is an error."""
    path = site_path()
    if path.is_file():
        return path
    if os.environ.get(SITE_ENV):
        raise ConfigError(f"{SITE_ENV}={path}: no such file (the site file, holding the config's cluster block). "
                          f"Fix: point {SITE_ENV} at your site file, write one there with `make site`, or unset "
                          f"{SITE_ENV} to read {SITE_NAME}")
    return None


def site_label() -> str:
    """The site file as a fix names it: its path, and how to make it where there is none yet."""
    path = site_path()
    return str(path) if path.is_file() else f"{path} (none yet: `make site` writes one)"


def read_site(path: str | Path, schema_path: str | Path = SCHEMA_PATH) -> dict:
    """The site file's ``{"cluster": {...}}`` (a file of comments only, or an empty ``cluster:``, holds no keys),
    checked against the schema's ``cluster`` part; anything else is a ConfigError naming the file, the key and the
    fix."""
    site = read_yaml(path) or {}
    fix = "Fix: write `cluster:` and its keys there (`make site` proposes them)"
    if not isinstance(site, dict):
        raise ConfigError(f"{path}: the site file is a {type(site).__name__}, not the `cluster` block. {fix}")
    for key in site:
        if key != "cluster":
            raise ConfigError(f"{path}: key {key}: a site file holds the config's `cluster` block only. Fix: move "
                              f"{key} to config.yaml (or a config file given with --configfile)")
    cluster = site.get("cluster") or {}
    try:
        validate_block(cluster, "cluster", schema_path)
    except ConfigError as error:
        raise ConfigError(f"{path}: {error}") from None
    return {"cluster": cluster}


def site_overrides(site: Mapping, command_line: Mapping) -> list[str]:
    """The site file's cluster keys that the command line (``--configfile``, ``--config``) sets too, and so wins."""
    given = command_line.get("cluster")
    return [f"cluster.{key}" for key in site["cluster"] if isinstance(given, Mapping) and key in given]
