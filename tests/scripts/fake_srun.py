"""Slurm's srun on one machine, for the tests: ``fake_srun.py --nodes=N [--option=value ...] COMMAND ...`` runs
COMMAND once per node asked (one task per node, as dpr_pipeline.training.nodes.srun_command asks), every "node"
being this machine, each task with the variables srun gives its tasks (the step's nodes, their count, the task's
node and rank; SLURM_JOB_ID from the environment; of the devices CUDA_VISIBLE_DEVICES lists, where set, the task's
node's share, as Slurm gives each node its own: ``--gres=gpu:G`` each). Like ``--kill-on-bad-exit``, the first task
to fail ends the others and its exit status is srun's; SIGTERM is passed on to every task. Each call appends its
arguments as a JSON line to the file FAKE_SRUN_LOG names, if set."""

import json
import os
import signal
import subprocess
import sys
import time


def main() -> int:
    args = sys.argv[1:]
    if os.environ.get("FAKE_SRUN_LOG"):
        with open(os.environ["FAKE_SRUN_LOG"], "a", encoding="utf-8") as log:
            log.write(json.dumps(args) + "\n")
    options = {}
    while args and args[0].startswith("--"):
        key, _, value = args.pop(0)[2:].partition("=")
        options[key] = value
    nodes = int(options["nodes"])
    step = {"SLURM_STEP_NODELIST": ",".join(["localhost"] * nodes), "SLURM_STEP_NUM_NODES": str(nodes),
            "SLURM_NNODES": str(nodes), "SLURM_STEP_NUM_TASKS": str(nodes)}
    devices = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d]
    per_node = int(options.get("gres", "gpu:0").split(":")[-1])

    def task_env(node: int) -> dict:
        env = {**os.environ, **step, "SLURM_NODEID": str(node), "SLURM_PROCID": str(node)}
        if devices:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(devices[node * per_node:(node + 1) * per_node])
        return env

    tasks = [subprocess.Popen(args, env=task_env(node)) for node in range(nodes)]
    signal.signal(signal.SIGTERM, lambda signum, frame: [task.send_signal(signum) for task in tasks])
    while True:
        codes = [task.poll() for task in tasks]
        failed = [code for code in codes if code not in (None, 0)]
        if failed:
            for task in tasks:
                if task.poll() is None:
                    task.kill()
            return failed[0]
        if all(code == 0 for code in codes):
            return 0
        time.sleep(0.1)


if __name__ == "__main__":
    sys.exit(main())
