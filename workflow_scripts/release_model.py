import _hub_offline  # noqa: F401  (the Hub offline before transformers loads)
from dpr_pipeline.orchestration.card import write_release
from dpr_pipeline.models.onnx_export import sample_pairs, sample_texts
from dpr_pipeline.reranking.score_fusion import mixing_weight
from dpr_pipeline.orchestration.job_log import logged

with logged(snakemake.log[0], snakemake.threads):
    fusion_weight = snakemake.params.fusion_weight  # stage_settings.fusion's weight; None: a bi-encoder
    export = None
    if snakemake.params.export and "sample_run" in snakemake.input.keys():  # release.export, a re-ranker: its
        export = {"formats": list(snakemake.params.export),                  # copies checked on its run's top pairs
                  "pairs": sample_pairs(snakemake.input.sample_run, snakemake.input.sample_queries,
                                        snakemake.input.sample_corpus)}
    elif snakemake.params.export:                   # a bi-encoder's on the dataset's queries and passages
        queries, passages = sample_texts(snakemake.input.sample_queries, snakemake.input.sample_corpus,
                                         snakemake.input.get("sample_qrels"))
        export = {"formats": list(snakemake.params.export), "queries": queries, "passages": passages}
    write_release(snakemake.input.model, snakemake.input.manifest, snakemake.input.metrics, snakemake.output[0],
                  fusion_weight=None if fusion_weight is None else mixing_weight(fusion_weight), export=export)
