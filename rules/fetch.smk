# Fetching public collections, the first jobs of the DAG (src/dpr_pipeline/data/fetch.py, docs/datasets.md "Fetching the
# public collections"). Per dataset that fetches something, rules named after it:
#   ir_datasets_<dataset>   format ir_datasets: the library downloads (md5-checked, cached in config fetch.cache)
#                           and the job writes corpus.parquet, queries_<split>.parquet, qrels_<split>.parquet
#                           into the dataset's path (the parquet layout ingestion reads)
#   download_<dataset>_<f>  one per `downloads` entry: url + md5/sha256 into the dataset's path
#   fetch_<dataset>         target of all of them and of the models its chain loads: `snakemake --cores 1
#                           fetch_msmarco` on a login node
# A file already in the dataset's path is used as it is: no job produces it, so none can remove it (data/fetch.py,
# missing_downloads). Ingestion (rules/data.smk) reads these files.
# Models given as Hugging Face Hub names, one job each, shared by the datasets naming them (models/hub_fetch.py)
#   fetch_model_<name>      the model's files + fetch_manifest.json (commit, sha256s) into fetch.models/<org>--<name>;
#                           the jobs that load it take that folder as an input and run with the Hub offline
from dpr_pipeline.data.fetch import (check_fetch_config, fetched_files, ir_datasets_ids, missing_downloads, missing_exports,
                                raw_inputs, raw_layout, rule_suffix, with_downloads)
from dpr_pipeline.layout import fetched_model_log
from dpr_pipeline.orchestration.hub_models import chain_models, missing_models

check_fetch_config(config)
FETCH = config["fetch"]


def fetch_resources(dataset):
    """mem_mb and runtime of a fetch job (config `resources.fetch`, per dataset too), growing with each retry up to
    what the cluster allows (retry_caps_of)."""
    first = job_resources(config, dataset, "fetch")
    return {
        "mem_mb": lambda wildcards, attempt: scaled(first["mem_mb"], attempt, retry_caps_of("fetch").mem_mb),
        "runtime": lambda wildcards, attempt: job_runtime(config, first["runtime"], attempt,
                                                          retry_caps_of("fetch").runtime),
        "gpu": 0,
        **cluster_resources(config, gpu_rule=False),
    }


for _name, _dataset in config["datasets"].items():
    _suffix = rule_suffix(_name)
    if _dataset["format"] == "ir_datasets" and missing_exports(_dataset):

        rule:
            name:
                f"ir_datasets_{_suffix}"
            output:
                **missing_exports(_dataset),
            params:
                dataset=_name,
                ids=ir_datasets_ids(_dataset),
                cache=FETCH["cache"],
            threads: job_resources(config, _name, "fetch")["threads"]
            resources:
                **fetch_resources(_name),
            retries: FETCH["retries"]
            localrule: FETCH["local"]
            log:
                log_file("fetch_ir_datasets", _name),
            benchmark:
                benchmark_file("fetch_ir_datasets", _name)
            conda:
                "../envs/data.yaml"
            script:
                "../workflow_scripts/fetch_ir_datasets.py"

    for _file, _spec in missing_downloads(_dataset).items():
        _file_suffix = rule_suffix(str(Path(_file).relative_to(_dataset["path"])))

        rule:
            name:
                f"download_{_suffix}_{_file_suffix}"
            output:
                _file,
            params:
                spec=_spec,
            threads: 1
            resources:
                **fetch_resources(_name),
            retries: FETCH["retries"]
            localrule: FETCH["local"]
            log:
                log_file(f"download_{_file_suffix}", _name),
            benchmark:
                benchmark_file(f"download_{_file_suffix}", _name)
            conda:
                "../envs/data.yaml"
            script:
                "../workflow_scripts/download_file.py"

    if fetched_files(_dataset) or chain_models(config, _name):

        rule:
            name:
                f"fetch_{_suffix}"
            input:
                fetched_files(_dataset) + chain_models(config, _name),
            localrule: True


for _folder, _model in missing_models(config).items():

    rule:
        name:
            f"fetch_model_{rule_suffix(Path(_folder).name)}"
        output:
            directory(_folder),
        params:
            repo_id=_model["repo_id"],
            revision=_model["revision"],
        threads: 1
        resources:
            **fetch_resources(_model["dataset"]),
        retries: FETCH["retries"]
        # always on the host Snakemake runs on (the login node under --profile slurm): compute nodes may have no
        # internet, and the jobs that load the model run with the Hub offline
        localrule: True
        log:
            fetched_model_log(_folder),
        benchmark:
            fetched_model_log(_folder, ".benchmark.tsv")
        conda:
            "../envs/data.yaml"
        script:
            "../workflow_scripts/fetch_model.py"
