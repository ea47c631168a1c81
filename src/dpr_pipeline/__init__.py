"""dpr_pipeline: the SimLM dense-retrieval training pipeline as plain, tested functions.

The Snakemake rules in ``rules/`` call these functions through the thin adapters in ``workflow_scripts/``.
"""

__version__ = "0.3.0"
