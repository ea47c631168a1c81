"""Every optimizer step of this interpreter's trainings ``$SLOW_STEP_SECONDS`` longer, so that a test can signal a
multi-process run between two steps (tests/test_training.py): this folder on PYTHONPATH reaches torchrun's workers,
which run the stage's trainer as the registry names it (dpr_pipeline.training.launch), through Python's start-up
(``import sitecustomize``)."""

import os
import time

if os.environ.get("SLOW_STEP_SECONDS"):
    from dpr_pipeline.training import trainer

    step = trainer._optimizer_step

    def slow_step(*args, **kwargs):
        time.sleep(float(os.environ["SLOW_STEP_SECONDS"]))
        return step(*args, **kwargs)

    trainer._optimizer_step = slow_step
