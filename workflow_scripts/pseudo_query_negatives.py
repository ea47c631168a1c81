import _hub_offline  # noqa: F401  (the Hub offline before transformers loads)
from dpr_pipeline.data.pseudo_queries import write_training_groups
from dpr_pipeline.retrieval.negatives import mine_hard_negatives
from dpr_pipeline.retrieval.settings import MiningSettings
from dpr_pipeline.orchestration.job_log import logged
from dpr_pipeline.stages import stage

with logged(snakemake.log[0]) as log:
    settings = MiningSettings.from_params(snakemake.params.mining)
    mine_hard_negatives(snakemake.input.run, snakemake.input.qrels, snakemake.output.negatives,
                        depth=settings.depth, keep=settings.keep, seed=settings.seed, source="pseudo_queries",
                        corpus=snakemake.input.corpus, filters=settings.filters(f"mining.{stage('distill').fed_by}"),
                        queries=snakemake.input.queries)
    labelled, pseudo = write_training_groups(snakemake.input.negatives, snakemake.input.train_queries,
                                             snakemake.output.negatives, snakemake.input.queries,
                                             snakemake.output.groups, snakemake.output.texts)
    log.info("the student's groups: %d labelled queries' and %d pseudo-queries'", labelled, pseudo)
