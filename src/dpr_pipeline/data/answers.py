"""Answer-based relevance (Natural Questions and the other DPR open-domain QA sets).

A passage is relevant to a question when it *contains an answer*, as DPR decides it
(``dpr/data/qa_validation.py``, ``has_answer`` with ``match_type="string"``), which the SimLM paper uses for
NQ (Table 4, §B):

* text and answer are NFD-normalised (``unicodedata.normalize("NFD", ...)``), so a composed "é" and an
  "e" followed by a combining accent are the same;
* both are tokenised by DPR's ``SimpleTokenizer``: a token is a run of letters, digits and combining marks
  (``[\\p{L}\\p{N}\\p{M}]+``) or any single other character that is not a separator or control character
  (``[^\\p{Z}\\p{C}]``), so punctuation marks are tokens of their own ("U.S." -> ``u . s .``);
* tokens are lower-cased and an answer matches when its token sequence occurs contiguously in the passage's
  tokens. Matching is on whole tokens: "Paris" does not match "Parisian". Articles are *not* removed ("The
  Beatles" does not match a passage that only says "Beatles"; "Beatles" matches "The Beatles"), as in DPR's
  retrieval accuracy (SQuAD's article-stripping belongs to the reader's exact match).

Only the passage text is matched, not its title (DPR's ``has_answer`` sees ``text`` alone).

**Why this module and not Pyserini's copy.** The pinned Pyserini ships the same function
(``pyserini.eval.evaluate_dpr_retrieval.has_answers`` with DrQA's ``SimpleTokenizer``); importing that module starts
no JVM. It is not used here for three reasons:

* the jobs that match answers run in ``envs/eval.yaml`` (``evaluate``) and ``envs/data.yaml`` (``bm25_negatives``,
  ``mine_hard_negatives``), which do not hold Pyserini; its pip requirements (pyjnius, spacy, onnxruntime, nmslib,
  lightgbm, scikit-learn, transformers, sentencepiece) would come into both for these few lines;
* ``has_answers`` tokenises the passage again on every call, while :func:`label_hits` tokenises each passage once
  for all the hits that retrieve it (NQ mining labels about 6M hits): 17x faster on 20k hits of 200 passages;
* an answer with no tokens (only format or control characters, e.g. a zero-width space) matches *every* passage
  in DPR and Pyserini (an empty slice equals the empty answer); here it matches none.

``tests/test_answers.py`` checks that both give the same verdict on the NQ fixtures, on adversarial strings
(accents, combining marks, punctuation, case, multi-token answers, answers at the ends of the text, other scripts)
and on random strings, apart from that one documented difference. DPR's ``regex`` match type (CuratedTREC) is not
offered by this pipeline.
"""

from __future__ import annotations

import unicodedata
from functools import lru_cache
from typing import Iterable, Sequence

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import regex

from dpr_pipeline.data.schemas import open_parquet

_TOKEN = regex.compile(r"[\p{L}\p{N}\p{M}]+|[^\p{Z}\p{C}]", flags=regex.IGNORECASE | regex.UNICODE | regex.MULTILINE)


def normalize(text: str) -> str:
    """DPR's normalisation before tokenising: Unicode NFD."""
    return unicodedata.normalize("NFD", text)


def tokenize(text: str) -> list[str]:
    """DPR's SimpleTokenizer on NFD-normalised text, lower-cased (what ``has_answer`` compares)."""
    return [match.group().lower() for match in _TOKEN.finditer(normalize(text))]


@lru_cache(maxsize=65536)
def _answer_tokens(answer: str) -> tuple[str, ...]:
    return tuple(tokenize(answer))


def contains_tokens(tokens: Sequence[str], needle: Sequence[str]) -> bool:
    """Whether ``needle`` occurs as a contiguous run of ``tokens`` (an empty needle never matches)."""
    size = len(needle)
    if size == 0:
        return False
    first = needle[0]
    for start in range(len(tokens) - size + 1):
        if tokens[start] == first and tuple(tokens[start:start + size]) == tuple(needle):
            return True
    return False


def has_answer(answers: Iterable[str], text: str) -> bool:
    """DPR's string match: does ``text`` contain any of ``answers`` (token sequences, see the module doc)?"""
    tokens = tokenize(text)
    return any(contains_tokens(tokens, _answer_tokens(answer)) for answer in answers)


def read_passage_texts(corpus: str, doc_ids: Iterable[str]) -> dict[str, str]:
    """``{doc_id: text}`` for the given ids only, read from the corpus artifact batch by batch."""
    wanted = pd.unique(pd.Series(list(doc_ids), dtype=object))
    texts: dict[str, str] = {}
    if len(wanted) == 0:
        return texts
    wanted_array = pa.array(wanted, type=pa.string())
    for batch in open_parquet(corpus, "corpus artifact").iter_batches(columns=["doc_id", "text"], batch_size=262144):
        keep = pc.is_in(batch.column(0), value_set=wanted_array)
        if pc.any(keep).as_py():
            chosen = batch.filter(keep)
            texts.update(zip(chosen.column(0).to_pylist(), chosen.column(1).to_pylist()))
    return texts


_TOKEN_CACHE_PASSAGES = 100_000


def label_hits(run: pd.DataFrame, answers: pd.DataFrame, passages: dict[str, str]) -> pd.Series:
    """Per hit of ``run`` (columns query_id, doc_id), whether its passage contains one of the query's answers.

    ``answers``: the answers artifact (query_id, answers); ``passages``: ``{doc_id: text}`` covering the run
    (:func:`read_passage_texts`). A query without answers, or a passage not in ``passages``, is False.
    """
    answers_of = dict(zip(answers["query_id"], answers["answers"]))
    token_cache: dict[str, list[str]] = {}

    def label(query_id: str, doc_id: str) -> bool:
        wanted = answers_of.get(query_id)
        if wanted is None or len(wanted) == 0 or doc_id not in passages:
            return False
        tokens = token_cache.get(doc_id)
        if tokens is None:
            if len(token_cache) >= _TOKEN_CACHE_PASSAGES:  # bounded: NQ mining labels ~6M hits
                token_cache.clear()
            tokens = token_cache[doc_id] = tokenize(passages[doc_id])
        return any(contains_tokens(tokens, _answer_tokens(answer)) for answer in wanted)

    return pd.Series([label(q, d) for q, d in zip(run["query_id"], run["doc_id"])], index=run.index, dtype=bool)
