"""A training function for torchrun's workers whose optimizer steps each take longer, so that a test can signal a
multi-process run between two steps (tests/test_training.py): importable by the workers, as run_training names
the function by module and name (the test puts tests/scripts on their PYTHONPATH).

usage: slow_training.py SPEC.json    run_training(train_biencoder_slowly, 2, **SPEC) in this process, SPEC's
                                     "params" as the settings (BiEncoderSettings)
"""

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))


def train_biencoder_slowly(seconds_per_step: float, **kwargs) -> None:
    """train_biencoder with every optimizer step ``seconds_per_step`` longer."""
    from dpr_pipeline.training import trainer
    from dpr_pipeline.training.biencoder import train_biencoder

    step = trainer._optimizer_step

    def slow_step(*args, **kw):
        time.sleep(seconds_per_step)
        return step(*args, **kw)

    trainer._optimizer_step = slow_step
    train_biencoder(**kwargs)


if __name__ == "__main__":
    import logging

    from slow_training import train_biencoder_slowly as by_its_module_name  # not __main__'s, for the workers

    from dpr_pipeline.training.launch import run_training
    from dpr_pipeline.training.settings import BiEncoderSettings

    logging.basicConfig(level=logging.INFO)
    spec = json.loads(Path(sys.argv[1]).read_text())
    run_training(by_its_module_name, 2, **{key: value for key, value in spec.items() if key != "params"},
                 settings=BiEncoderSettings.from_params(spec["params"]))
