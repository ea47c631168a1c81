"""Imported first by every workflow script: the Hugging Face Hub offline in the job.

Every job runs with the Hub offline (``HF_HUB_OFFLINE=1``, ``TRANSFORMERS_OFFLINE=1``, set before any script imports
transformers): the models they load were fetched into folders by the fetch jobs
(:mod:`dpr_pipeline.models.hub_fetch`), so a missing file fails at once instead of reaching for the network, as it
would on a compute node without internet. The fetch job itself calls :func:`hub_as_started` first.

The scripts import ``dpr_pipeline`` as installed in the environment the job runs in (``make install``: this
checkout, editable; under ``--sdm conda``, each env's post-deploy script installs it); the job manifest records
which file it was imported from (``software.dpr_pipeline_file``).
"""

import os

from dpr_pipeline.models.refs import OFFLINE_VARIABLES  # light: imports no Hugging Face library

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
