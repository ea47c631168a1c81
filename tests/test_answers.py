"""DPR's answer matching (has_answer, match_type "string") on tricky cases, the same verdicts as Pyserini's copy of
DPR's function, and labelling a run's hits."""

import random
import unicodedata

import pandas as pd
import pytest
from conftest import REPO
from pyserini.eval.evaluate_dpr_retrieval import SimpleTokenizer
from pyserini.eval.evaluate_dpr_retrieval import has_answers as pyserini_has_answers

from dpr_pipeline.data.answers import has_answer, label_hits, read_passage_texts, tokenize
from dpr_pipeline.data.readers import read_answers, read_documents


def test_tokens_are_word_runs_and_single_symbols_lower_cased():
    assert tokenize("The U.S. won 3-2, didn't it?") == ["the", "u", ".", "s", ".", "won", "3", "-", "2", ",",
                                                        "didn", "'", "t", "it", "?"]


@pytest.mark.parametrize("answer, text, expected", [
    ("U.S.", "Troops of the U.S. landed.", True),                 # punctuation marks are tokens of their own
    ("U.S.", "Troops of the US landed.", False),                  # "US" is one token, "U.S." four
    ("US", "Troops of the U.S. landed.", False),
    ("U.S", "Troops of the U.S. landed.", True),                  # a prefix of the token sequence
    ("The Beatles", "Songs by Beatles and others.", False),        # articles are not stripped
    ("Beatles", "Songs by The Beatles and others.", True),
    ("the beatles", "Songs by The Beatles.", True),               # case does not matter
    ("Paris", "A Parisian cafe.", False),                         # whole tokens only: no substring of a word
    ("Paris", "Flights to Paris, France.", True),
    ("Paris, France", "Flights to Paris, France.", True),
    ("Paris France", "Flights to Paris, France.", False),         # the comma is a token
    ("1,000", "About 1,000 people.", True),
    ("1000", "About 1,000 people.", False),
    ("rock 'n' roll", "The rock 'n' roll era.", True),
    ("", "anything at all", False),                              # an empty answer never matches
    ("   ", "anything at all", False),
])
def test_has_answer_tricky_cases(answer, text, expected):
    assert has_answer([answer], text) is expected


def test_composed_and_decomposed_unicode_match_but_accents_count():
    composed = "Beyonc\u00e9"                      # é as one code point
    decomposed = "Beyonce\u0301"                   # e + combining acute accent
    assert composed != decomposed and unicodedata.normalize("NFD", composed) == decomposed
    assert has_answer([composed], f"A song by {decomposed} in 2008.")
    assert has_answer([decomposed], f"A song by {composed} in 2008.")
    assert not has_answer(["Beyonce"], f"A song by {composed}.")     # NFD keeps the accent: not ASCII-folded
    assert has_answer(["BEYONCÉ"], f"a song by {composed}.")
    assert has_answer(["Søren"], "Søren Kierkegaard wrote it.")


def test_any_answer_of_the_list_is_enough():
    assert has_answer(["Lisbon", "Paris"], "He moved to Paris.")
    assert not has_answer(["Lisbon", "Madrid"], "He moved to Paris.")
    assert not has_answer([], "He moved to Paris.")


def test_label_hits_reads_only_the_run_passages(tmp_path):
    corpus = tmp_path / "corpus.parquet"
    pd.DataFrame({"doc_id": ["1", "2", "3", "4"], "title": ["Paris", "", "", ""],
                  "text": ["A city in France.", "Paris is the capital.", "Parisian food.", "Unused."]}
                 ).to_parquet(corpus)
    run = pd.DataFrame({"query_id": ["q", "q", "q", "r", "z"], "doc_id": ["1", "2", "3", "2", "2"]})
    answers = pd.DataFrame({"query_id": ["q", "r"], "answers": [["Paris"], ["capital of France"]]})
    passages = read_passage_texts(str(corpus), run["doc_id"])
    assert set(passages) == {"1", "2", "3"}
    # doc 1: the title says Paris, the text does not (DPR matches text only); z has no answers.
    assert label_hits(run, answers, passages).tolist() == [False, True, False, False, False]


# ------------------------------------------------------------------------------------ against Pyserini's
# The pinned Pyserini's copy of DPR's has_answer (pure Python: importing it starts no JVM). answers.py keeps its
# own (its docstring says why); these tests hold the two to the same verdicts.
PYSERINI_TOKENIZER = SimpleTokenizer()
NQ = REPO / "tests" / "data" / "nq"


def pyserini_verdict(answers, text) -> bool:
    return pyserini_has_answers(text, answers, PYSERINI_TOKENIZER, regex=False)


def test_agrees_with_pyserini_on_every_question_and_passage_of_the_nq_fixtures():
    passages = {d.doc_id: d.text for d in read_documents("dpr", NQ)}
    questions = [q for split, name in (("train", "biencoder-nq-train.json"), ("test", "nq-test.qa.csv"))
                 for q in read_answers(NQ, split, {"queries": name})]
    pairs = [(q.query_id, q.answers, doc_id, text) for q in questions for doc_id, text in passages.items()]
    ours = [has_answer(answers, text) for _, answers, _, text in pairs]
    assert ours == [pyserini_verdict(answers, text) for _, answers, _, text in pairs]
    assert 0 < sum(ours) < len(pairs) // 10  # both verdicts occur: the comparison can tell the two apart
    run = pd.DataFrame({"query_id": [f"{i}" for i in range(len(pairs))], "doc_id": [p[2] for p in pairs]})
    answers = pd.DataFrame({"query_id": run["query_id"], "answers": [p[1] for p in pairs]})
    assert label_hits(run, answers, passages).tolist() == ours


ADVERSARIAL = [
    # accents and combining marks: NFD on both sides, accents kept
    (["Beyonc\u00e9"], "A song by Beyonce\u0301 in 2008."),
    (["Beyonce\u0301"], "A song by Beyonc\u00e9 in 2008."),
    (["Beyonce"], "A song by Beyonc\u00e9."),
    (["BEYONC\u00c9"], "a song by beyonc\u00e9."),
    (["Sa\u0301o Paulo"], "Flights to S\u00e3o Paulo."),                  # another accent than the text's
    (["S\u00e3o Paulo"], "Flights to Sa\u0303o Paulo."),
    (["e\u0301"], "caf\u00e9"),                                          # a letter plus its mark, inside a word
    (["\u0301"], "caf\u00e9"),                                           # a lone combining mark as the answer
    (["Ha\u0308user"], "Die H\u00e4user am See."),
    (["\ud55c\uad6d"], "\ud55c\uad6d\uc758 \uc218\ub3c4"),              # Hangul: NFD splits into jamo
    (["\u00c5ngstr\u00f6m"], "one \u212bngstr\u00f6m"),                 # the Angstrom sign decomposes like \u00c5
    (["\ufb01sh"], "a fish"),                                           # a ligature: NFD leaves it
    # case
    (["PARIS"], "flights to paris"),
    (["Stra\u00dfe"], "STRASSE 5"),                                     # lower() does not fold \u00df
    (["\u0130stanbul"], "istanbul"),                                    # dotted capital I lowers to i + mark
    (["\u03a3\u039f\u03a6\u0399\u0391"], "\u03c3\u03bf\u03c6\u03b9\u03b1"),
    (["\u03c3"], "\u03bb\u03cc\u03b3\u03bf\u03c2"),                     # final sigma is another letter
    # punctuation and symbols: each a token of its own
    (["U.S."], "Troops of the U.S. landed."),
    (["US"], "Troops of the U.S. landed."),
    (["U.S"], "the U.S.A."),
    (["rock 'n' roll"], "the rock \u2019n\u2019 roll era"),           # a straight quote is not a curly one
    (["rock \u2019n\u2019 roll"], "the rock \u2019n\u2019 roll era"),
    (["1,000"], "About 1,000 people."),
    (["1000"], "About 1,000 people."),
    (["3-2"], "won 3\u20132"),                                           # hyphen versus en dash
    (["C++"], "written in C++ and C"),
    (["$5"], "it costs $5."),
    (["\U0001f600"], "happy \U0001f600 face"),
    (["Paris, France"], "Paris,France"),
    (["Paris France"], "Paris, France"),
    # whitespace and invisible characters: separators and controls are not tokens
    (["New York"], "New\u00a0York"),                                     # no-break space
    (["New York"], "New\tYork\nCity"),
    (["foobar"], "foo\u200bbar"),                                         # zero-width space splits the word
    (["foo bar"], "foo\u200bbar"),
    (["foo bar"], "foo\u00adbar"),                                         # soft hyphen (Cf)
    # words, numbers and other scripts
    (["Paris"], "A Parisian cafe."),
    (["4"], "route 44"),
    (["\u00b2"], "x\u00b2"),                                               # a superscript digit joins the word
    (["\u0664\u0662"], "the answer is \u0664\u0662"),                   # Arabic-Indic digits
    (["\u5317\u4eac"], "\u6211\u4f4f\u5728\u5317\u4eac"),               # CJK: one run of letters, no substring
    (["\u5317\u4eac"], "\u6211\u4f4f\u5728 \u5317\u4eac"),
    # multi-token answers and the ends of the text
    (["the Beatles"], "Songs by the Beatles"),
    (["Songs by"], "Songs by the Beatles"),
    (["Songs by the Beatles"], "Songs by the Beatles"),
    (["Songs by the Beatles ."], "Songs by the Beatles"),                 # longer than the text
    (["Beatles and"], "Songs by the Beatles"),
    (["x"], "x"),
    (["x"], ""),
    (["Lisbon", "Madrid", "Paris"], "He moved to Paris."),
    (["Lisbon", "Madrid"], "He moved to Paris."),
]


@pytest.mark.parametrize("answers, text", ADVERSARIAL)
def test_agrees_with_pyserini_on_adversarial_strings(answers, text):
    assert has_answer(answers, text) is pyserini_verdict(answers, text)


def test_the_adversarial_cases_hold_both_verdicts():
    verdicts = [has_answer(answers, text) for answers, text in ADVERSARIAL]
    assert 15 < sum(verdicts) < len(verdicts) - 15


def test_agrees_with_pyserini_on_random_strings():
    """Random texts over letters, accents, marks, digits, punctuation, spaces and invisible characters; the answers
    are pieces of the text (so many match) or random strings."""
    rng = random.Random(25)
    alphabet = list("aAbBeE\u00e9\u00c9\u0301\u0308\u00df\u0130\u03c3\u03a3\u5317 1,.-'\u2019\u00a0\t\u200b\u00ad\u00b2"
                    "\u0664\U0001f600")
    matched = 0
    for _ in range(3000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        start = rng.randint(0, len(text))
        piece = text[start:start + rng.randint(1, 8)]
        other = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 6)))
        for answer in (piece, other):
            if not tokenize(answer):
                continue  # the one documented difference (below)
            ours = has_answer([answer], text)
            assert ours is pyserini_verdict([answer], text), (answer, text)
            matched += ours
    assert matched > 1000


@pytest.mark.parametrize("answer", ["", "\u200b", "\u00ad\u2060", "\t"])
def test_an_answer_without_tokens_matches_nothing_where_dpr_and_pyserini_match_everything(answer):
    """The one difference (answers.py says why): DPR's loop compares the empty token list with an empty slice."""
    assert tokenize(answer) == []
    assert pyserini_verdict([answer], "Any passage at all.") is True
    assert has_answer([answer], "Any passage at all.") is False
