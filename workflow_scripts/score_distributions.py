import _library  # noqa: F401  (puts src/ on the path)
from dpr_pipeline.plots import plot_score_distributions
from dpr_pipeline.workflow import logged

with logged(snakemake.log[0]):
    inputs = snakemake.input
    panels = {  # panel title: (negatives file, what its scores are)
        "BM25 negatives (they train Retriever₁)": (inputs.bm25, "BM25 score"),
        "Retriever₁'s mined negatives (they train Retriever₂)": (inputs.retriever1, "Retriever₁ cosine similarity"),
        "Retriever₂'s mined negatives (they train the re-ranker)": (inputs.retriever2, "Retriever₂ cosine similarity"),
        "Teacher scores of the same Retriever₂ negatives (distillation targets)":
            (inputs.teacher, "teacher θ (re-ranker logit)"),
    }
    plot_score_distributions({name: path for name, (path, _) in panels.items()}, snakemake.output[0],
                             f"{snakemake.wildcards.dataset}: scores of train positives vs hard negatives",
                             score_names={name: label for name, (_, label) in panels.items()})
