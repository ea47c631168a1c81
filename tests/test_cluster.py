"""Portable job resources (config `resources`, per dataset, attempt-scaled) and shard-bounded teacher reads."""

import pandas as pd
import yaml

from conftest import REPO, write_beir
from dpr_pipeline.cluster import job_resources, processes_for, scaled
from dpr_pipeline.teacher_scores import read_passages
from dpr_pipeline.data.ingest import ingest_corpus

CONFIG = yaml.safe_load((REPO / "config.yaml").read_text())


def test_resources_merge_default_rule_and_dataset():
    assert job_resources(CONFIG, "scifact", "train_retriever") == {"threads": 8, "mem_mb": 4000, "runtime": 60}
    assert job_resources(CONFIG, "scifact", "evaluate") == {"threads": 1, "mem_mb": 4000, "runtime": 60}
    msmarco = job_resources(CONFIG, "msmarco", "train_reranker")
    assert msmarco == {"threads": 32, "mem_mb": 256000, "runtime": 2880}
    assert job_resources(CONFIG, "msmarco", "plot_metrics") == {"threads": 4, "mem_mb": 16000, "runtime": 120}


def test_retries_scale_memory_and_runtime_and_gpus_give_processes():
    assert [scaled(2000, attempt) for attempt in (1, 2, 3)] == [2000, 4000, 6000]
    assert [processes_for(gpus) for gpus in (None, 0, 1, 4)] == [1, 1, 1, 4]


def test_teacher_shards_read_only_their_passages(tmp_path):
    raw = write_beir(tmp_path / "raw")
    ingest_corpus("beir", raw, tmp_path / "corpus.parquet")
    passages = read_passages(tmp_path / "corpus.parquet", {"d2", "007", "missing"})
    assert passages == {"d2": "Dogs Dogs bark at the mail carrier.", "007": "A document whose id looks like a number."}
    assert len(pd.read_parquet(tmp_path / "corpus.parquet")) == 4
