"""The retrieval jobs' settings, typed (:class:`~dpr_pipeline.job_settings.JobSettings`): the corpus encoding, the
dense index and search, BM25, and the mining of hard negatives; no torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from dpr_pipeline.job_settings import JobSettings
from dpr_pipeline.retrieval.negative_filters import NegativeFilters


@dataclass(frozen=True, kw_only=True)
class EncodeCorpusSettings(JobSettings):
    """A corpus encoding job (`encode_corpus`): the stage's passage length and bf16, the corpus side's shards,
    batch size and vector dtype (a transfer's: the target's)."""

    BLOCK: ClassVar[str] = "retriever"
    passage_max_length: int | None  # None: the model's own (a transfer target without transfer_max_length)
    bf16: bool
    encode_shards: int
    encode_batch_size: int
    embedding_dtype: str


@dataclass(frozen=True, kw_only=True)
class DenseIndexSettings(JobSettings):
    """An index job (`build_index`): the faiss index (`retriever.index`)."""

    BLOCK: ClassVar[str] = "retriever"
    index: dict


@dataclass(frozen=True, kw_only=True)
class DenseSearchSettings(JobSettings):
    """A dense search job (`dense_search`): the stage's query length and bf16, the encoding batch size and the
    index's search settings (its depth is a param of its own: it depends on the split)."""

    BLOCK: ClassVar[str] = "retriever"
    query_max_length: int | None  # None: the model's own (a transfer target without transfer_max_length)
    bf16: bool
    encode_batch_size: int
    index: dict

    @property
    def hnsw_ef_search(self) -> int | None:
        """The HNSW search breadth, for an hnsw index only."""
        return self.index["hnsw_ef_search"] if self.index["kind"] == "hnsw" else None

    @property
    def ivf_nprobe(self) -> int | None:
        """The inverted lists searched per query, for an ivfpq index only."""
        return self.index["ivf_nprobe"] if self.index["kind"] == "ivfpq" else None


@dataclass(frozen=True, kw_only=True)
class BM25Settings(JobSettings):
    """The BM25 jobs' (`bm25`: the index, the search)."""

    BLOCK: ClassVar[str] = "bm25"
    fields: str
    k1: float
    b: float
    depth: int
    threads: int
    java_heap: str


@dataclass(frozen=True, kw_only=True)
class MiningSettings(JobSettings):
    """A mining job's (`mining.<stage>`): the sample (depth, keep, seed) and its filters (off where absent)."""

    BLOCK: ClassVar[str] = "mining"
    depth: int
    keep: int
    seed: int
    relative_margin: float | None = None
    absolute_margin: float | None = None
    max_score: float | None = None
    range_min: int | None = None
    denoise: dict | None = None

    def filters(self, setting: str) -> NegativeFilters:
        """The filters that are on, their errors naming ``setting`` (``mining.<stage>``)."""
        return NegativeFilters.from_settings(self.as_params(), setting)
