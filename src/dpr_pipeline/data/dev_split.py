"""The dev split of a dataset (``datasets.<name>.dev_split``): where settings and checkpoints are chosen.

Either an existing split of the collection (``dev_split: dev``: MS MARCO's dev.small) or a seeded part of the
train queries carved off at ingestion (``dev_split: {fraction: 0.1}`` or ``{count: 80}``, optional ``name``,
default ``dev``, and ``seed``). A carved split is read from the train split's raw files: the ``train`` job keeps
the queries that are not carved, the dev job those that are, so the two are disjoint by construction. Queries with
identical text (whitespace collapsed) fall on the same side, so the leakage check that every evaluation split
passes (``ingest.check_overlap``) holds for the carve too. Which queries are carved depends only on the query ids,
their texts and the seed, never on file order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import numpy as np

DEFAULT_NAME = "dev"
DEFAULT_SEED = 42


@dataclass(frozen=True)
class DevSplit:
    """A dataset's dev split: ``name``; ``source``, the train split it is carved from (None: an existing split)."""

    name: str
    source: str | None = None
    fraction: float | None = None
    count: int | None = None
    seed: int = DEFAULT_SEED

    @property
    def carved(self) -> bool:
        return self.fraction is not None or self.count is not None

    def size(self, available: int) -> int:
        """How many of ``available`` train queries the dev split takes: at least one, and one fewer than all."""
        wanted = self.count if self.count is not None else round(self.fraction * available)
        return min(max(1, wanted), available - 1)

    def record(self) -> dict:
        """What the ingestion manifest records of the carve."""
        return {"name": self.name, "carved_from": self.source, "fraction": self.fraction, "count": self.count,
                "seed": self.seed}


def dev_split_of(dataset: dict) -> DevSplit | None:
    """The dataset's dev split as its config entry declares it, or None without ``dev_split``."""
    entry = dataset.get("dev_split")
    if entry is None:
        return None
    if isinstance(entry, str):
        return DevSplit(name=entry)
    return DevSplit(name=entry.get("name", DEFAULT_NAME), source=dataset.get("train_split"),
                    fraction=entry.get("fraction"), count=entry.get("count"), seed=entry.get("seed", DEFAULT_SEED))


def carve_of(dataset: dict, split: str) -> dict | None:
    """For the ingestion of ``split``: ``{"side": "dev" | "train", **the carve}`` when the dataset carves its dev
    split and ``split`` is one of its two sides, else None."""
    dev = dev_split_of(dataset)
    if dev is None or not dev.carved or split not in (dev.name, dev.source):
        return None
    return {"side": "dev" if split == dev.name else "train", **dev.record()}


def source_split(dataset: dict, split: str) -> str:
    """The split whose raw files the ingestion of ``split`` reads: the train split for a carved dev split."""
    dev = dev_split_of(dataset)
    return dev.source if dev is not None and dev.carved and split == dev.name else split


def normal_text(text: str) -> str:
    """A query's text with its whitespace collapsed: what "identical text" means for the carve and for the
    leakage check (``ingest.check_overlap``), which must agree."""
    return " ".join(text.split())


def carved_query_ids(query_ids: Iterable[str], texts: Iterable[str], dev: DevSplit) -> set[str]:
    """The ids of the queries ``dev`` carves off: a seeded draw of whole groups of identical text (whitespace
    collapsed) until the split's size is reached. Independent of the order of the input."""
    groups: dict[str, list[str]] = {}
    for query_id, text in zip(query_ids, texts):
        groups.setdefault(normal_text(text), []).append(query_id)
    if len(groups) < 2:
        raise ValueError(f"the train split has {len(groups)} distinct queries: too few to carve a dev split from")
    ordered = sorted((sorted(ids) for ids in groups.values()), key=lambda ids: ids[0])
    total = sum(len(ids) for ids in ordered)
    size = dev.size(total)
    chosen: set[str] = set()
    for index in np.random.default_rng(dev.seed).permutation(len(ordered)):
        if len(chosen) >= size:
            break
        if len(chosen) + len(ordered[index]) < total:  # never all of train
            chosen.update(ordered[index])
    return chosen
