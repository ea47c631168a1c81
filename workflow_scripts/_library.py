"""Imported first by every script: makes ``src/`` importable where dpr_pipeline is not installed
(the rules' conda environments on a cluster). Snakemake puts this folder on the scripts' sys.path."""

import sys
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[1] / "src")
if SRC not in sys.path:
    sys.path.insert(0, SRC)
