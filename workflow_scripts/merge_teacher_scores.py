import _library  # noqa: F401  (puts src/ on the path)
from dpr_pipeline.teacher_scores import merge_teacher_shards
from dpr_pipeline.workflow import logged

with logged(snakemake.log[0]):
    merge_teacher_shards(snakemake.input, snakemake.output[0])
