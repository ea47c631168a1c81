"""Run a stage's training function in one process, or in ``processes`` processes under ``torchrun`` (one per GPU).

The Snakemake rules call ``run_training``; with ``processes > 1`` it starts
``torchrun --standalone --nproc_per_node N -m dpr_pipeline.training.launch SPEC`` where SPEC is a JSON file
naming the function and its arguments, and every process calls the function (DDP with cross-device negatives).
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable


def run_training(function: Callable, processes: int, **kwargs) -> None:
    """``function(**kwargs)`` here, or in ``processes`` torchrun processes (kwargs must be JSON values)."""
    if processes <= 1:
        function(**kwargs)
        return
    spec = {"function": f"{function.__module__}:{function.__qualname__}", "kwargs": kwargs}
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as out:
        json.dump(spec, out, default=str)
    src = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")]))}
    try:
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                        str(processes), "-m", "dpr_pipeline.training.launch", out.name], check=True, env=env)
    finally:
        os.unlink(out.name)


def main() -> None:
    import logging

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    spec = json.loads(Path(sys.argv[1]).read_text())
    module, name = spec["function"].split(":")
    getattr(importlib.import_module(module), name)(**spec["kwargs"])


if __name__ == "__main__":
    main()
