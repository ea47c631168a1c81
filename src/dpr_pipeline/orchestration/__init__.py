"""What the Snakefile asks: the config and its stages' settings, paths, the stage registry, job resources, the Hub
models a config names, a job's log, manifest and training run, and the messages a failed run shows."""
