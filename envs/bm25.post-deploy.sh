#!/usr/bin/env bash
# Run by Snakemake in this conda env right after it is created (--sdm conda): the workflow's jobs import the
# dpr_pipeline package, so this checkout is installed into the env (editable: a later checkout's code is what runs).
# Snakemake runs it from the workflow's working directory, the repository root.
set -euo pipefail
if [ ! -f pyproject.toml ] || [ ! -d src/dpr_pipeline ]; then
    echo "post-deploy: $(pwd) is not the dpr_pipeline repository root; run snakemake from the checkout" >&2
    exit 1
fi
python -m pip install --no-deps -e .
