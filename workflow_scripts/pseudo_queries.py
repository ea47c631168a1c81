import _hub_offline  # noqa: F401  (the Hub offline before transformers loads)
from dpr_pipeline.data.pseudo_queries import PseudoQuerySettings, write_pseudo_queries
from dpr_pipeline.orchestration.job_log import logged

with logged(snakemake.log[0]):
    write_pseudo_queries(snakemake.input[0], snakemake.output.queries, snakemake.output.qrels,
                         PseudoQuerySettings.from_params(snakemake.params.pseudo))
