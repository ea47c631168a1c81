"""The passage store: the corpus's passage strings in one memory-mapped Arrow file (data/passage_store.py)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from conftest import write_beir

from dpr_pipeline.data.corpus_shards import passage_text
from dpr_pipeline.data.ingest import ingest_corpus
from dpr_pipeline.data.passage_store import PassageStore, write_passage_store
from dpr_pipeline.data.schemas import write_artifact
from dpr_pipeline.errors import DataError


def test_the_store_holds_every_passage_as_the_encoders_read_it(tmp_path):
    raw = write_beir(tmp_path / "raw")
    ingest_corpus("beir", raw, tmp_path / "corpus.parquet")
    assert write_passage_store(tmp_path / "corpus.parquet", tmp_path / "passages.arrow") == 4
    corpus = pd.read_parquet(tmp_path / "corpus.parquet")
    store = PassageStore.open(tmp_path / "passages.arrow")
    rows = store.rows_of(["d2", "007", "missing"])
    assert rows.tolist()[2] == -1
    assert store.passages(rows[:2]) == ["Dogs Dogs bark at the mail carrier.", "A document whose id looks like a number."]
    assert store.doc_ids(np.arange(len(store))) == corpus["doc_id"].tolist()
    assert store.passages(np.arange(len(store))) == [passage_text(t, x) for t, x in zip(corpus["title"], corpus["text"])]


def test_opening_the_store_maps_the_passages_instead_of_reading_them(tmp_path):
    """A process that opens the store allocates its doc ids only: the passage strings stay in the mapped file
    (the page cache, one copy per node), and a lookup copies the rows it asks for."""
    texts = [f"passage {i} " + "words " * 60 for i in range(9000)]     # three record batches of the file
    write_artifact(pd.DataFrame({"doc_id": [str(i) for i in range(9000)], "title": "", "text": texts}),
                   tmp_path / "corpus.parquet", "corpus")
    write_passage_store(tmp_path / "corpus.parquet", tmp_path / "passages.arrow")
    size = (tmp_path / "passages.arrow").stat().st_size
    before = pa.total_allocated_bytes()
    store = PassageStore.open(tmp_path / "passages.arrow")
    allocated = pa.total_allocated_bytes() - before
    assert size > 2_000_000 and allocated < 0.05 * size
    rows = [8999, 0, 4096, 4095, 8192, 1, 4096]
    assert store.passages(rows) == [texts[row] for row in rows] and store.doc_ids(rows) == [str(r) for r in rows]


def test_a_file_that_is_not_a_store_is_one_error_naming_it(tmp_path):
    (tmp_path / "passages.arrow").write_text("not arrow")
    with pytest.raises(DataError, match="passages.arrow: not a readable Arrow file") as err:
        PassageStore.open(tmp_path / "passages.arrow")
    assert "rerun the passage_store rule" in str(err.value)
    with pytest.raises(DataError, match="the passage store does not exist"):
        PassageStore.open(tmp_path / "missing.arrow")
