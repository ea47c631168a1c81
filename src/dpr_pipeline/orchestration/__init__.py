"""What the Snakefile asks, at the top of the package's layers: the config and its stages' settings, job resources,
the Hub models a config names, a job's log, manifest, model card and training run, and the messages a failed run
shows. The stage registry and the paths sit at the bottom (:mod:`dpr_pipeline.stages`, :mod:`dpr_pipeline.layout`)."""
