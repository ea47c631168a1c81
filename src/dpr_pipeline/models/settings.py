"""The starting model's job settings, typed (:class:`~dpr_pipeline.job_settings.JobSettings`): the untrained
bi-encoder folder the chain's `start` stage writes; no torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from dpr_pipeline.job_settings import JobSettings


@dataclass(frozen=True, kw_only=True)
class StartingModelSettings(JobSettings):
    """The `starting_model` job: the plm as loaded, its pooling, lengths and prompts (None, not in the params:
    the plm's own)."""

    BLOCK: ClassVar[str] = "retriever"
    plm: str
    pooling: str
    query_max_length: int
    passage_max_length: int
    query_prompt: str | None = None
    passage_prompt: str | None = None
