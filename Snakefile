# dpr_pipeline: the SimLM dense-retrieval training pipeline (https://arxiv.org/abs/2207.02578) as a workflow.
# Run `snakemake` for the datasets in the config's run_datasets (default [scifact]), or name a target, e.g.
#   snakemake results/scifact/distill/metrics.json
import os

from snakemake.utils import min_version

min_version("9.0")


# The bundled config.yaml, the one next to this Snakefile wherever snakemake runs (`-s <checkout>/Snakefile` from
# another folder, `--directory`), is read first; then a config.yaml of the working directory, where there is one
# that differs (rules/common.smk: Snakemake reads a workflow's `configfile:` there); each --configfile extends them
BUNDLED_CONFIG = os.path.join(workflow.basedir, "config.yaml")


configfile: os.path.relpath(BUNDLED_CONFIG) if os.path.samefile(workflow.basedir, os.getcwd()) else BUNDLED_CONFIG


report: "report/workflow.rst"


include: "rules/common.smk"
include: "rules/inputs.smk"
include: "rules/report_inputs.smk"
include: "rules/fetch.smk"
include: "rules/data.smk"
include: "rules/bm25.smk"
include: "rules/pretrain.smk"
include: "rules/retriever.smk"
include: "rules/reranker.smk"
include: "rules/distill.smk"
include: "rules/evaluate.smk"
include: "rules/release.smk"
include: "rules/report.smk"
include: "rules/transfer.smk"


# A training job leaves its checkpoint folder marked finished (a time limit after its training is then no failure):
# the run removes those of completed jobs as it ends, and as it starts (rules/common.smk, onstart); never in a dry
# run (src/dpr_pipeline/orchestration/checkpoints.py)
onsuccess:
    remove_finished_trainings()


onerror:
    remove_finished_trainings()
    # the failed jobs' messages (file, line, fix) become the run's last lines (rules/common.smk, LAST_LINES)
    if failed_jobs():
        LAST_LINES.report = run_errors.failed_jobs_report(failed_jobs(), log)


rule all:
    input:
        final_targets(),
    default_target: True


# Deleting a file reruns the job that writes it and what is built on it, for any target
# (src/dpr_pipeline/orchestration/deleted_inputs.py); after the last rule
rerun_deleted_inputs(workflow)
