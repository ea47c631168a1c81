"""Deleting a file reruns the job that writes it and every job built on it, whatever the target.

Snakemake (9.27; ``tests/test_snakemake_behaviour.py`` fails once a release changes it) leaves a deleted
intermediate file missing while the requested target is up to date: it checks a job's inputs only when the job
itself has to run (snakemake/snakemake#1978; no ``--rerun-triggers`` covers it), so ``rm -r
results/scifact/retriever2`` followed by ``snakemake results/scifact/summary.json`` would say "Nothing to be done".
:func:`rerun_deleted_inputs` gives every rule an input function that adds no file and, while the main Snakemake
process builds its plan, marks as forced each input of a job whose own outputs all exist but that input does not:
the job that writes it reruns (as ``--forcerun <file>`` would make it), and Snakemake reruns what depends on it.
Nothing upstream reruns, and a job outside the target's plan is never looked at.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any


def deleted_inputs(inputs: Iterable[str], outputs: Iterable[str]) -> list[str]:
    """The ``inputs`` of a job that no longer exist, where all its ``outputs`` exist (else none: a job with a
    missing output reruns anyway and takes its missing inputs' jobs with it)."""
    if not all(os.path.exists(path) for path in outputs):
        return []
    return sorted({str(path) for path in inputs if not os.path.exists(path)})


def rerun_deleted_inputs(workflow: Any) -> None:
    """Adds :func:`_marker` to every rule of ``workflow`` (Snakemake's ``workflow`` object; call it once, after
    the last rule)."""
    for rule in workflow.rules:
        rule.set_input(_marker(workflow, rule))


def _marker(workflow: Any, rule: Any):
    """An input function of ``rule`` that returns no file; in the main process, while the plan is built, it adds
    the job's :func:`deleted_inputs` to the plan's forced files."""
    expanding = set()

    def mark(wildcards) -> list[str]:
        key = tuple(sorted(wildcards.items()))
        dag = getattr(workflow, "dag", None)
        if not workflow.is_main_process or dag is None or key in expanding:
            return []
        expanding.add(key)  # expand_input calls this function again: it returns nothing then
        try:
            inputs = rule.expand_input(dict(wildcards.items()))[0]
        finally:
            expanding.discard(key)
        dag.forcefiles.update(deleted_inputs(inputs, rule.expand_output(dict(wildcards.items()))[0]))
        return []

    return mark
