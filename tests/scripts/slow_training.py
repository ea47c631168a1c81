"""A two-process Retriever1 training whose optimizer steps each take longer (tests/scripts/slow_steps, which the
test puts on PYTHONPATH with SLOW_STEP_SECONDS), so that a test can signal it between two steps
(tests/test_training.py).

usage: slow_training.py SPEC.json    run_training("retriever1", 2, **SPEC) in this process, SPEC's "params" as the
                                     settings (BiEncoderSettings)
"""

import json
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

if __name__ == "__main__":
    from dpr_pipeline.training.launch import run_training
    from dpr_pipeline.training.settings import BiEncoderSettings

    logging.basicConfig(level=logging.INFO)
    spec = json.loads(Path(sys.argv[1]).read_text())
    run_training("retriever1", 2, **{key: value for key, value in spec.items() if key != "params"},
                 settings=BiEncoderSettings.from_params(spec["params"]))
