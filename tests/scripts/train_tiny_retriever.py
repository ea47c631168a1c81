"""Train a tiny bi-encoder with the real trainer; tests/test_training.py runs it in a subprocess and kills it.

usage: train_tiny_retriever.py WORKDIR OUTPUT [--slow SECONDS]
WORKDIR holds model/ (a tiny BERT) and corpus/queries/negatives Parquet files (tests/test_training.py writes
them). Writes OUTPUT (a state dict) and OUTPUT.losses.jsonl (the loss log); checkpoints go to OUTPUT.checkpoints.
"""

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from dpr_pipeline.data.passage_store import PassageStore  # noqa: E402
from dpr_pipeline.data.schemas import read_negatives_table  # noqa: E402
from dpr_pipeline.models.embedding import load_text_encoder  # noqa: E402
from dpr_pipeline.models.loading import load_tokenizer  # noqa: E402
from dpr_pipeline.training.biencoder import BiEncoder, BiEncoderCollator, contrastive_step  # noqa: E402
from dpr_pipeline.training.distributed import Distributed  # noqa: E402
from dpr_pipeline.training.groups import QueryGroups, read_queries  # noqa: E402
from dpr_pipeline.training.schedule import TrainingSettings  # noqa: E402
from dpr_pipeline.training.trainer import train  # noqa: E402


class SlowGroups(QueryGroups):
    """Groups that take ``delay`` seconds each, so a test can kill the run between checkpoints."""

    delay = 0.0

    def example(self, index, epoch):
        time.sleep(self.delay)
        return super().example(index, epoch)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("workdir", type=Path)
    parser.add_argument("output", type=Path)
    parser.add_argument("--slow", type=float, default=0.0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist = Distributed()
    SlowGroups.delay = args.slow
    groups = SlowGroups(read_negatives_table(args.workdir / "negatives.parquet"),
                        PassageStore.open(args.workdir / "passages.arrow"), read_queries(args.workdir / "queries.parquet"),
                        negatives_per_query=2, seed=7)
    model_dir = str(args.workdir / "model")
    model = BiEncoder(load_text_encoder(model_dir))
    settings = TrainingSettings(learning_rate=1e-3, warmup_steps=2, batch_size=4, epochs=2, min_steps=0, seed=3,
                                save_steps=2, bf16=False)
    collate = BiEncoderCollator(load_tokenizer(model_dir), 16, 24)
    log = args.output.with_suffix(".losses.jsonl")
    train(model, groups, collate, contrastive_step(0.05), settings, args.output.with_suffix(".checkpoints"),
          cross_device_loss=True, loss_log=log, dist=dist)
    torch.save(model.encoder.state_dict(), args.output)


if __name__ == "__main__":
    main()
