"""A new stage, a new pre-training method and a new dataset format, each added as docs/architecture.md ("Where to
add things") says one is: its declaration in its registry (done here, at run time) and its name in the schema
(:func:`edit_schema`, on a copy of the repository). tests/test_additions.py adds them in its own process, and

    python tests/scripts/additions.py COPY [dag_plan.py arguments]

prints the plan of COPY's workflow (COPY's ``scripts/dag_plan.py``) with the three added, so that the test can
check that nothing else (no rule, no adapter, no other module) had to change for the workflow to take them up.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterator

#: The stage: a third bi-encoder round on Retriever₂'s mined negatives (docs/architecture.md's worked example).
STAGE = "retriever3"
#: The method: MLM under a name of its own (its loss is ``mlm``'s).
METHOD = "toy_mlm"
#: The format: a corpus ``docs.tsv`` (id, title, text), ``queries.<split>.tsv`` (id, text) and
#: ``qrels.<split>.tsv`` (query id, doc id, grade), no header lines.
FORMAT = "toy_tsv"


class Patch:
    """``setattr``/``setitem`` that stay (for the plan's own process; a test passes pytest's ``monkeypatch``)."""

    @staticmethod
    def setattr(target, name, value):
        setattr(target, name, value)

    @staticmethod
    def setitem(mapping, key, value):
        mapping[key] = value


def add_stage(patch) -> None:
    """``retriever3`` in ``stages.CHAIN`` after ``retriever2``, as its one line in stages.py would put it (and in the
    tables computed from the chain when stages.py is imported)."""
    from dpr_pipeline.evaluation import seed_spread
    from dpr_pipeline import stages

    declared = stages.Stage(STAGE, "Retriever₃", stages.BIENCODER, STAGE, "retriever", trainer="train_retriever",
                            below="retriever2", fed_by="retriever2", starts_from=("retriever2",),
                            loss="Retriever₃ (Retriever₂'s mined negatives): contrastive loss, Eq. 3",
                            card_negatives="Retriever₂'s mined hard negatives (`mining.retriever2`)")
    chain = list(stages.CHAIN)
    chain.insert(chain.index(stages.stage("retriever2")) + 1, declared)
    patch.setattr(stages, "CHAIN", tuple(chain))
    patch.setitem(stages.STAGE_LABELS, STAGE, declared.label)
    patch.setitem(stages.STAGE_BELOW, STAGE, declared.below)
    patch.setitem(seed_spread.SEEDED_STAGES, STAGE, declared.block)


def add_method(patch) -> None:
    """``toy_mlm`` in ``METHODS``, as its declaration in pretraining/methods.py would put it."""
    from dpr_pipeline.pretraining import methods

    patch.setitem(methods.METHODS, METHOD, methods.PretrainingMethod(METHOD, methods._mlm))


def toy_format():
    """The format's class, as it would be written in data/readers.py."""
    from dpr_pipeline.data.readers import DatasetFormat
    from dpr_pipeline.data.records import Document, Judgement, Location, Query, as_relevance
    from dpr_pipeline.data.text_files import iter_tsv, resolve_file

    class ToyTsvFormat(DatasetFormat):
        name = FORMAT

        def corpus_names(self, root: Path) -> dict[str, str]:
            return {"corpus": "docs.tsv"}

        def split_names(self, root: Path, split: str) -> dict[str, str]:
            return {"queries": f"queries.{split}.tsv", "qrels": f"qrels.{split}.tsv"}

        def documents(self, root: Path) -> Iterator[Document]:
            path = resolve_file(self.corpus_paths(root)["corpus"], "toy documents")
            for line, (doc_id, title, text) in iter_tsv(path, ("id", "title", "text")):
                yield Document(Location(path, line), doc_id, title, text)

        def queries(self, root: Path, split: str, renamed: dict | None = None) -> Iterator[Query]:
            path = resolve_file(self.split_paths(root, split, renamed)["queries"], f"toy queries of {split!r}")
            for line, (qid, text) in iter_tsv(path, ("qid", "text")):
                yield Query(Location(path, line), qid, text)

        def judgements(self, root: Path, split: str, renamed: dict | None = None) -> Iterator[Judgement]:
            path = resolve_file(self.split_paths(root, split, renamed)["qrels"], f"toy qrels of {split!r}")
            for line, (qid, doc_id, grade) in iter_tsv(path, ("qid", "doc_id", "relevance")):
                where = Location(path, line)
                yield Judgement(where, qid, doc_id, as_relevance(grade, where))

    return ToyTsvFormat()


def add_format(patch) -> None:
    """``toy_tsv`` in ``FORMATS``, as its registry entry in data/readers.py would put it."""
    from dpr_pipeline.data import readers

    patch.setitem(readers.FORMATS, FORMAT, toy_format())


def write_toy_dataset(root: Path) -> Path:
    """A small dataset in the toy format: four documents, train and test queries and qrels."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "docs.tsv").write_text("d1\tCats\tCats purr when they are content.\nd2\tDogs\tDogs bark at the mail.\n"
                                   "d3\tBirds\tBirds sing in the morning.\nd4\t\tA document without a title.\n")
    for split, rows in {"train": [("q1", "why do cats purr", "d1"), ("q2", "dogs barking", "d2")],
                        "test": [("q3", "morning bird song", "d3")]}.items():
        (root / f"queries.{split}.tsv").write_text("".join(f"{q}\t{text}\n" for q, text, _ in rows))
        (root / f"qrels.{split}.tsv").write_text("".join(f"{q}\t{d}\t1\n" for q, _, d in rows))
    return root


#: (what the schema says, what it says with the additions): the names in the enums a test checks against the
#: registries (the format enum; the methods' lists; the transfer stages, chain stages and ablation rows).
SCHEMA_EDITS = [
    ("enum: [beir, msmarco, parquet, dpr, ir_datasets]", f"enum: [beir, msmarco, parquet, dpr, ir_datasets, {FORMAT}]"),
    ("cocondenser, cdmae, seed_encoder]", f"cocondenser, cdmae, seed_encoder, {METHOD}]"),
    ("enum: [start, retriever1, retriever2, reranker,", f"enum: [start, retriever1, retriever2, {STAGE}, reranker,"),
    # its own block over the shared `retriever`, at the top level and in a dataset's overrides
    ("      reranker: {$ref: \"#/$defs/reranker\", default: {}}",
     f"      {STAGE}: {{type: object, default: {{}}, description: \"Retriever₃'s own settings over retriever's\"}}\n"
     "      reranker: {$ref: \"#/$defs/reranker\", default: {}}"),
    ("          reranker: {type: object, description: \"any keys of stages.reranker\"}",
     f"          {STAGE}: {{type: object, description: \"any keys of stages.{STAGE}\"}}\n"
     "          reranker: {type: object, description: \"any keys of stages.reranker\"}"),
    ("ablation/cocondenser, ablation/cdmae, ablation/seed_encoder]",
     f"ablation/cocondenser, ablation/cdmae, ablation/seed_encoder, ablation/{METHOD}]"),
]


def edit_schema(text: str) -> str:
    """The schema with the three names where docs/architecture.md says they go (each edit must apply)."""
    for old, new in SCHEMA_EDITS:
        count = text.count(old)
        assert count >= 1, f"schemas/config.schema.yaml no longer holds {old!r}: update tests/scripts/additions.py"
        text = text.replace(old, new)
    return text


def main(argv: list[str]) -> None:
    copy, args = Path(argv[0]).resolve(), argv[1:]
    sys.path.insert(0, str(copy / "src"))
    add_stage(Patch), add_method(Patch), add_format(Patch)
    sys.path.insert(0, str(copy / "scripts"))
    import dag_plan

    dag_plan.main(args)


if __name__ == "__main__":
    main(sys.argv[1:])
