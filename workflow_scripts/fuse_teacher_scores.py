from dpr_pipeline.orchestration.job_log import logged
from dpr_pipeline.reranking.score_fusion import mixing_weight, write_fused_teacher_scores

with logged(snakemake.log[0]) as log:
    weight = mixing_weight(snakemake.params.fusion["weight"])
    bounded = write_fused_teacher_scores(snakemake.input.teacher, snakemake.input.first_stage, snakemake.output[0],
                                         weight=weight)
    log.info("teacher scores fused with the first stage's at re-ranker weight %s; %d positives the first stage did "
             "not retrieve took its lowest score of their query", weight, bounded)
