"""Artifacts are checked when read, and written atomically."""

import pandas as pd
import pytest

from dpr_pipeline.atomic_writes import atomic_output
from dpr_pipeline.data.schemas import read_artifact, read_negatives_table, write_artifact
from dpr_pipeline.data.trec_runs import read_trec_run
from dpr_pipeline.errors import DataError


def test_wrong_type_names_file_and_column(tmp_path):
    pd.DataFrame({"query_id": ["q"], "doc_id": ["d"], "relevance": ["high"]}).to_parquet(tmp_path / "q.parquet")
    with pytest.raises(DataError, match=r"q\.parquet: column 'relevance' is (large_)?string, the qrels artifact needs int32"):
        read_artifact(tmp_path / "q.parquet", "qrels")


def test_duplicate_key_names_row(tmp_path):
    pd.DataFrame({"query_id": ["a", "b", "a"], "text": ["x", "y", "z"]}).to_parquet(tmp_path / "q.parquet")
    with pytest.raises(DataError, match=r"row 3: duplicate query_id \(a\)"):
        read_artifact(tmp_path / "q.parquet", "queries")


def test_negatives_need_positives(tmp_path):
    frame = pd.DataFrame({"query_id": ["a"], "positive_ids": [[]], "positive_scores": [[]],
                          "negative_ids": [["n"]], "negative_scores": [[1.0]]})
    with pytest.raises(DataError, match="row 1: a query without positives"):
        write_artifact(frame, tmp_path / "neg.parquet", "negatives")
    assert list(tmp_path.iterdir()) == []


def test_atomic_output_leaves_nothing_on_error(tmp_path):
    with pytest.raises(RuntimeError):
        with atomic_output(tmp_path / "out.txt") as tmp:
            tmp.write_text("half")
            raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_run_file_with_bad_score(tmp_path):
    (tmp_path / "r.trec").write_text("q1 Q0 d1 1 1.5 t\nq1 Q0 d2 2 nan? t\n")
    with pytest.raises(DataError, match=r"r\.trec, line 2: .*score 'nan\?'"):
        read_trec_run(tmp_path / "r.trec")


@pytest.mark.parametrize("rows", [
    [("q1", ["d1"], [0.0], ["d2"], [0.0]), ("q1", ["d2"], [0.0], [], [])],           # a repeated query
    [("q1", ["d1"], [0.0], ["d2"], [0.0]), (" ", ["d2"], [0.0], [], [])],            # an empty query id
    [("q1", ["d1"], [0.0], ["d2"], [0.0]), ("q2", [], [], ["d1"], [0.0])],           # no positive
    [("q1", ["d1"], [0.0], ["d2"], [0.0]), ("q2", ["d2"], [0.0], ["d1"], [])],       # ids without scores
])
def test_a_negatives_table_is_checked_as_the_frame_is(tmp_path, rows):
    """The training jobs read negatives as an Arrow table (no Python string per id): the same errors, rows and
    fixes as the DataFrame reader."""
    path = tmp_path / "negatives.parquet"
    pd.DataFrame(rows, columns=["query_id", "positive_ids", "positive_scores", "negative_ids", "negative_scores"]) \
        .to_parquet(path)
    with pytest.raises(DataError) as frame_error:
        read_artifact(path, "negatives")
    with pytest.raises(DataError) as table_error:
        read_negatives_table(path)
    assert str(table_error.value) == str(frame_error.value) and table_error.value.row == 2


def test_a_slice_of_a_negatives_table_reads_its_row_groups_and_names_the_files_row(tmp_path):
    """A denoising scores job reads its slice of the pool (``rows``): the rows asked for, whichever row groups hold
    them, and a bad row named by its row in the file."""
    path = tmp_path / "pool.parquet"
    frame = pd.DataFrame({"query_id": [f"q{i}" for i in range(23)], "positive_ids": [[f"p{i}"] for i in range(23)],
                          "positive_scores": [[1.0]] * 23, "negative_ids": [[f"n{i}", f"m{i}"] for i in range(23)],
                          "negative_scores": [[0.5, 0.2]] * 23})
    write_artifact(frame, path, "negatives", row_group_size=5)          # groups of rows 0-4, 5-9, ... 20-22
    for start, stop in [(0, 5), (3, 12), (11, 23), (7, 7), (22, 23)]:
        rows = read_negatives_table(path, slice(start, stop))
        assert rows.column("query_id").to_pylist() == [f"q{i}" for i in range(start, stop)]
    frame.at[13, "negative_scores"] = [0.5]                                   # row 14 of the file
    frame.to_parquet(path, row_group_size=5)
    with pytest.raises(DataError, match="ids and scores of different lengths") as error:
        read_negatives_table(path, slice(11, 17))
    assert error.value.row == 14
