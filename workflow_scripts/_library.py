"""Imported first by every script: the workflow always runs its own ``src/``.

Snakemake's script preamble *appends* its search paths to ``sys.path``, and an installed ``dpr_pipeline`` (another
checkout's editable install, an older wheel) sits in site-packages before them; so the checkout's ``src/`` is put
at the **front** of ``sys.path`` (moved there when it is already present further back), and a ``dpr_pipeline``
imported from elsewhere before this module ran is forgotten so that the next import takes the checkout's.
The job manifest records which file the package was imported from (``software.dpr_pipeline_file``).

Every job runs with the Hugging Face Hub offline (``HF_HUB_OFFLINE=1``, ``TRANSFORMERS_OFFLINE=1``, set before
any script imports transformers): the models they load were fetched into folders by the fetch jobs
(``dpr_pipeline.model_fetch``), so a missing file fails at once instead of reaching for the network, as it would
on a compute node without internet. The fetch job itself calls :func:`hub_as_started` first.
"""

import os
import sys
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[1] / "src")


def put_first(path: str = SRC) -> None:
    """``path`` at ``sys.path[0]`` (every other occurrence removed); modules of ``dpr_pipeline`` loaded from
    anywhere else are dropped from ``sys.modules``."""
    sys.path[:] = [path] + [p for p in sys.path if Path(p or ".").resolve() != Path(path).resolve()]
    for name in [n for n in sys.modules if n == "dpr_pipeline" or n.startswith("dpr_pipeline.")]:
        origin = getattr(sys.modules[name], "__file__", None) or ""
        if not Path(origin).resolve().is_relative_to(Path(path).resolve()):
            del sys.modules[name]


put_first()


from dpr_pipeline.model_refs import OFFLINE_VARIABLES  # noqa: E402  (light: imports no Hugging Face library)

#: The variables as the job was started with them (restored by :func:`hub_as_started`).
STARTED_WITH = {name: os.environ.get(name) for name in OFFLINE_VARIABLES}


def hub_offline() -> None:
    """Put the Hugging Face libraries offline in this process (before they are imported)."""
    os.environ.update({name: "1" for name in OFFLINE_VARIABLES})


def hub_as_started() -> None:
    """The job's own setting back (for the fetch job, which downloads from the Hub; before huggingface_hub is
    imported, which reads it then)."""
    for name, value in STARTED_WITH.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


hub_offline()
