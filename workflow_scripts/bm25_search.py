import _library  # noqa: F401  (puts src/ on the path)
from dpr_pipeline.bm25 import search
from dpr_pipeline.workflow import logged

with logged(snakemake.log[0]):
    p = snakemake.params.bm25
    search(snakemake.input.index, snakemake.input.queries, snakemake.output[0], depth=snakemake.params.depth,
           k1=p["k1"], b=p["b"], fields=p["fields"], threads=snakemake.threads,
           ignore_identical_ids=snakemake.params.ignore_identical_ids, java_heap=p["java_heap"])
