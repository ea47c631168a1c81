"""Pseudo-queries of the corpus: extra distillation data for a collection with few labelled queries
(``distill.pseudo_queries``; GPL, Wang et al. 2022, and the Inverse Cloze Task of Lee et al. 2019, with no query
generator).

Each of ``pseudo_queries`` passages, drawn without replacement (seeded), gives one query of its own text: a sentence
(``sentence``), its title (``title``) or a cropped span of words (``span``, Contriever's cropping), of
``pseudo_query_min_words``–``pseudo_query_max_words`` words (a sentence or title beyond the maximum keeps its first
words; one below the minimum gives no query, and the passage is passed over). The passage is the query's one
relevant passage (its qrels row); the first-stage retriever's top hits of the query are its candidates
(:func:`dpr_pipeline.retrieval.negatives.mine_hard_negatives`), and the teacher scores them all, so what the
student learns from a pseudo-query is the teacher's ranking of them, whatever the label.

:func:`write_training_groups` appends the pseudo-queries' groups and texts to the labelled ones: the files the
teacher scores and the student trains on.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Callable, ClassVar

import numpy as np
import pandas as pd

from dpr_pipeline.atomic_writes import atomic_outputs
from dpr_pipeline.data.schemas import read_artifact, write_artifact
from dpr_pipeline.errors import ConfigError, DataError
from dpr_pipeline.job_settings import JobSettings

LOG = logging.getLogger(__name__)

#: A pseudo-query's id: this prefix and its passage's id (checked not to be a labelled query's id).
ID_PREFIX = "pseudo:"

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[\"'(\[]?[A-Z0-9])")


def _words(text: str) -> list[str]:
    return text.split()


def sentence_query(title: str, text: str, rng: np.random.Generator, low: int, high: int) -> str | None:
    """One sentence of ``text`` (at least ``low`` words), drawn uniformly among them, its first ``high`` words."""
    sentences = [words for words in map(_words, _SENTENCE_END.split(text)) if len(words) >= low]
    if not sentences:
        return None
    return " ".join(sentences[rng.integers(len(sentences))][:high])


def title_query(title: str, text: str, rng: np.random.Generator, low: int, high: int) -> str | None:
    """The passage's title (at least ``low`` words), its first ``high`` words."""
    words = _words(title)
    return " ".join(words[:high]) if len(words) >= low else None


def span_query(title: str, text: str, rng: np.random.Generator, low: int, high: int) -> str | None:
    """A span of ``text``'s words of a length drawn uniformly from ``low``–``high`` (at most the text's), at a
    uniformly drawn start."""
    words = _words(text)
    if len(words) < low:
        return None
    length = int(rng.integers(low, min(high, len(words)) + 1))
    start = int(rng.integers(len(words) - length + 1))
    return " ".join(words[start:start + length])


#: ``distill.pseudo_query_source``: how a passage gives its query.
SOURCES: dict[str, Callable[[str, str, np.random.Generator, int, int], str | None]] = {
    "sentence": sentence_query, "title": title_query, "span": span_query}


@dataclass(frozen=True, kw_only=True)
class PseudoQuerySettings(JobSettings):
    """The pseudo-query job's settings (``distill.pseudo_*`` and the student's seed)."""

    BLOCK: ClassVar[str] = "distill"
    pseudo_queries: int  # passages drawn, one query each (0: none)
    pseudo_query_source: str  # a key of SOURCES
    pseudo_query_min_words: int
    pseudo_query_max_words: int
    seed: int

    def __post_init__(self):
        if self.pseudo_query_source not in SOURCES:
            raise ConfigError(f"stages.distill.pseudo_query_source: {self.pseudo_query_source!r} is not one of "
                              f"{', '.join(SOURCES)}. Fix: choose one of them")
        if not 1 <= self.pseudo_query_min_words <= self.pseudo_query_max_words:
            raise ConfigError(f"stages.distill.pseudo_query_min_words ({self.pseudo_query_min_words}) must be at "
                              f"least 1 and at most pseudo_query_max_words ({self.pseudo_query_max_words}). Fix: "
                              "lower the minimum or raise the maximum")


def pseudo_queries(corpus: pd.DataFrame, settings: PseudoQuerySettings) -> pd.DataFrame:
    """``settings.pseudo_queries`` queries ``(query_id, doc_id, text)`` of the ``corpus`` rows (doc_id, title,
    text), the passages visited in a seeded random order until that many gave one. Depends only on the corpus's
    rows as a set and the settings, never on the file's order."""
    source = SOURCES[settings.pseudo_query_source]
    rng = np.random.default_rng(settings.seed)
    ordered = corpus.sort_values("doc_id", kind="stable")
    doc_ids, titles, texts = (ordered[column].to_numpy() for column in ("doc_id", "title", "text"))
    rows = []
    for index in rng.permutation(len(ordered)):
        doc_id = doc_ids[index]
        query = source(titles[index] or "", texts[index] or "", rng, settings.pseudo_query_min_words,
                       settings.pseudo_query_max_words)
        if query is not None:
            rows.append((f"{ID_PREFIX}{doc_id}", doc_id, query))
            if len(rows) == settings.pseudo_queries:
                break
    return pd.DataFrame(rows, columns=["query_id", "doc_id", "text"])


def write_pseudo_queries(corpus_path: str, queries_path: str, qrels_path: str,
                         settings: PseudoQuerySettings) -> int:
    """The pseudo-queries of the corpus artifact at ``corpus_path`` (:func:`pseudo_queries`) as a queries artifact
    and a qrels artifact (each query's passage, relevance 1); the number written. Too few passages giving a query
    is a :class:`~dpr_pipeline.errors.ConfigError` naming the counts and the fix, and writes nothing."""
    corpus = read_artifact(corpus_path, "corpus")
    queries = pseudo_queries(corpus, settings)
    if len(queries) < settings.pseudo_queries:
        raise ConfigError(
            f"stages.distill.pseudo_queries: {settings.pseudo_queries} asked, but only {len(queries)} of the "
            f"{len(corpus)} passages of {corpus_path} give a {settings.pseudo_query_source} of at least "
            f"{settings.pseudo_query_min_words} words. Fix: lower pseudo_queries or pseudo_query_min_words, or "
            "choose another pseudo_query_source")
    qrels = pd.DataFrame({"query_id": queries["query_id"], "doc_id": queries["doc_id"], "relevance": 1})
    with atomic_outputs(queries_path, qrels_path) as (queries_tmp, qrels_tmp):
        write_artifact(queries[["query_id", "text"]], queries_tmp, "queries")
        write_artifact(qrels, qrels_tmp, "qrels")
    LOG.info("%d pseudo-queries (%s, %d–%d words, seed %d) of %s", len(queries), settings.pseudo_query_source,
             settings.pseudo_query_min_words, settings.pseudo_query_max_words, settings.seed, corpus_path)
    return len(queries)


def write_training_groups(negatives_path: str, queries_path: str, pseudo_negatives_path: str,
                          pseudo_queries_path: str, groups_path: str, texts_path: str) -> tuple[int, int]:
    """The labelled queries' groups (``negatives_path``) and texts (``queries_path``) with the pseudo-queries'
    appended, written to ``groups_path`` and ``texts_path``; the numbers of labelled and pseudo groups. A
    pseudo-query id that is also a labelled query's is a :class:`~dpr_pipeline.errors.DataError` naming it and its
    row, and writes nothing."""
    groups = [read_artifact(negatives_path, "negatives"), read_artifact(pseudo_negatives_path, "negatives")]
    texts = [read_artifact(queries_path, "queries"), read_artifact(pseudo_queries_path, "queries")]
    clash = np.flatnonzero(texts[0]["query_id"].isin(texts[1]["query_id"]))
    if len(clash):
        raise DataError(queries_path, f"query id {texts[0]['query_id'].iloc[clash[0]]!r} is also a pseudo-query's "
                                      f"id (they are '{ID_PREFIX}<doc_id>')",
                        "rename the labelled query, or turn pseudo-queries off (distill.pseudo_queries: 0)",
                        row=int(clash[0]) + 1)
    with atomic_outputs(groups_path, texts_path) as (groups_tmp, texts_tmp):
        write_artifact(pd.concat(groups, ignore_index=True), groups_tmp, "negatives")
        write_artifact(pd.concat(texts, ignore_index=True), texts_tmp, "queries")
    return len(groups[0]), len(groups[1])
