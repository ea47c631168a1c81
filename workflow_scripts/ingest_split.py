import _hub_offline  # noqa: F401  (the Hub offline before transformers loads)
from dpr_pipeline.data.ingest import ingest_split, read_ingestion_counts
from dpr_pipeline.orchestration.job_log import logged
from dpr_pipeline.orchestration.manifests import write_job_manifest

with logged(snakemake.log[0]):
    ingest_split(snakemake.params.format, snakemake.params.root, snakemake.params.raw_split,
                 snakemake.input.corpus, snakemake.output.queries, snakemake.output.qrels,
                 unknown_qrels_ids=snakemake.params.unknown_qrels_ids,
                 files=snakemake.params.files, evaluation=snakemake.params.evaluation,
                 train_queries=getattr(snakemake.input, "train_queries", None),
                 allow_overlap=snakemake.params.allow_overlap, min_relevance=snakemake.params.min_relevance,
                 carve=snakemake.params.carve)
    write_job_manifest(snakemake, "data", seed=None, report=read_ingestion_counts(snakemake.output.qrels))
