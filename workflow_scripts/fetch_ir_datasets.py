import contextlib

import _hub_offline  # noqa: F401  (the Hub offline before transformers loads)
from dpr_pipeline.data.ir_datasets_export import ProgressToLog, export_ir_datasets
from dpr_pipeline.orchestration.job_log import logged

with logged(snakemake.log[0]) as logger, contextlib.redirect_stderr(ProgressToLog(logger)):
    # ir_datasets' download progress bars (stderr) become log lines, one every 30 s
    export_ir_datasets(snakemake.params.dataset, dict(snakemake.params.ids), dict(snakemake.output.items()),
                       snakemake.params.cache)
