"""`make gpu-check`: what a user runs on a new GPU node before a week-long run, in one report.

1. The node: torch and CUDA versions, each visible GPU's name and memory, bf16 support, faiss's GPU count.
2. The `gpu` tests (`pytest -m gpu`): bf16 autocast, CUDA RNG state, faiss-gpu, the trainers on CUDA.
3. The benchmarks at the paper's shapes: passage encoding (benchmarks/encode_throughput.py: passages/s and MFU),
   a pre-training step (pretrain_throughput.py, SimLM: tokens/s and MFU) and a Retriever₁ step
   (finetune_throughput.py, Table 13: tokens/s and MFU).

Writes ``--output`` (markdown) and the same as JSON next to it; exits 1 when there is no CUDA device (unless
``--allow-cpu``), a test fails or a benchmark fails. ``--smoke`` shrinks every benchmark to seconds (what the
project's own test runs on a CPU); the figures of a smoke run mean nothing.

    make gpu-check                      # = python scripts/gpu_check.py --output gpu_check/report.md
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Each benchmark: its script and arguments (the paper's shapes, bf16 on a GPU), and the smoke run's instead.
BENCHMARKS = {
    "encode": ("encode_throughput.py", ["--bf16", "--skip-memory"],
               ["--skip-memory", "--passages", "16", "--repeats", "1", "--max-length", "32"]),
    "pretrain": ("pretrain_throughput.py", ["--methods", "simlm", "--batch-size", "64", "--max-length", "144"],
                 ["--methods", "simlm", "--batch-size", "2", "--max-length", "32", "--repeats", "1", "--no-bf16"]),
    "finetune": ("finetune_throughput.py", ["--bf16"],
                 ["--queries", "2", "--group", "2", "--layers", "1", "--hidden", "64", "--passage-length", "32",
                  "--steps", "1"]),
}


def node() -> dict:
    import torch

    info = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "gpus": [{"name": torch.cuda.get_device_name(i),
                      "memory_gb": round(torch.cuda.get_device_properties(i).total_memory / 2**30, 1)}
                     for i in range(torch.cuda.device_count())],
            "bf16": torch.cuda.is_available() and torch.cuda.is_bf16_supported()}
    try:
        import faiss
        info["faiss_gpus"] = faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0
    except ImportError:
        info["faiss_gpus"] = None
    return info


def gpu_tests(folder: Path) -> dict:
    junit = folder / "gpu_tests.xml"
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "gpu", "--continue-on-collection-errors",
                           f"--junitxml={junit}", "tests"],
                          cwd=REPO, capture_output=True, text=True)
    (folder / "gpu_tests.log").write_text(done.stdout + done.stderr)
    suite = ElementTree.parse(junit).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    counts = {key: int(suite.get(key, 0)) for key in ("tests", "failures", "errors", "skipped")}
    return {**counts, "passed": counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"],
            "seconds": round(time.monotonic() - started, 1), "ok": done.returncode == 0}


def benchmark(name: str, folder: Path, smoke: bool) -> dict:
    script, arguments, smoke_arguments = BENCHMARKS[name]
    output = folder / f"{name}.json"
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / script),
                           *(smoke_arguments if smoke else arguments), "--output", str(output)],
                          cwd=REPO, capture_output=True, text=True)
    (folder / f"{name}.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0 or not output.exists():
        return {"ok": False, "log": str(folder / f"{name}.log")}
    result = json.loads(output.read_text())
    if name == "pretrain":
        result = {**result, **result["methods"]["simlm"]}
    elif name == "encode":
        result = result["throughput"]
    throughput = result.get("passages_per_s", {}).get("encode_texts") if name == "encode" else result["tokens_per_s"]
    return {"ok": True, "throughput": throughput, "unit": "passages/s" if name == "encode" else "tokens/s",
            "mfu": result.get("mfu"), "bf16": result.get("bf16")}


def report(results: dict) -> str:
    n = results["node"]
    gpus = ", ".join(f"{g['name']} ({g['memory_gb']} GB)" for g in n["gpus"]) or "none (CPU)"
    t = results["tests"]
    lines = [f"# GPU check ({results['date']})", "",
             f"* GPUs: {gpus}; bf16: {n['bf16']}; faiss GPUs: {n['faiss_gpus']}",
             f"* torch {n['torch']} (CUDA {n['cuda']}), Python {n['python']}",
             f"* `pytest -m gpu`: {t['passed']} passed, {t['failures'] + t['errors']} failed, {t['skipped']} skipped "
             f"({t['seconds']} s; gpu_tests.log)", "",
             "| benchmark | throughput | MFU | bf16 |", "| --- | ---: | ---: | --- |"]
    for name, b in results["benchmarks"].items():
        if not b["ok"]:
            lines.append(f"| {name} | failed: {b['log']} | | |")
            continue
        mfu = f"{b['mfu']:.1%}" if b["mfu"] is not None else "n/a (CPU)"
        lines.append(f"| {name} | {b['throughput']:,.0f} {b['unit']} | {mfu} | {b['bf16']} |")
    if results["smoke"]:
        lines += ["", "Smoke run (`--smoke`): tiny shapes, the figures mean nothing."]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", type=Path, default=REPO / "gpu_check" / "report.md")
    parser.add_argument("--allow-cpu", action="store_true", help="run where torch sees no CUDA device")
    parser.add_argument("--smoke", action="store_true", help="tiny benchmark shapes (seconds; figures meaningless)")
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available() and not args.allow_cpu:
        print("gpu-check: torch sees no CUDA device on this node (check the job's GPUs, CUDA_VISIBLE_DEVICES and "
              "that torch is a CUDA build). Fix: run it inside a GPU job, e.g. srun --gpus=1 make gpu-check",
              file=sys.stderr)
        return 1
    folder = args.output.parent
    folder.mkdir(parents=True, exist_ok=True)
    results = {"date": time.strftime("%Y-%m-%d %H:%M"), "smoke": args.smoke, "node": node(),
               "tests": gpu_tests(folder),
               "benchmarks": {name: benchmark(name, folder, args.smoke) for name in BENCHMARKS}}
    args.output.write_text(report(results))
    args.output.with_suffix(".json").write_text(json.dumps(results, indent=1) + "\n")
    print(args.output.read_text())
    return 0 if results["tests"]["ok"] and all(b["ok"] for b in results["benchmarks"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
