"""The cross-encoder scoring jobs' settings, typed (:class:`~dpr_pipeline.job_settings.JobSettings`): re-ranking a
run, scoring the teacher's pairs, scoring a mined pool for denoising; no torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from dpr_pipeline.job_settings import JobSettings


@dataclass(frozen=True, kw_only=True)
class RerankSettings(JobSettings):
    """A re-ranking job (`rerank`): its depth, the pairs' length, the scoring batch and bf16."""

    BLOCK: ClassVar[str] = "reranker"
    rerank_depth: int
    max_length: int
    score_batch_size: int
    bf16: bool


@dataclass(frozen=True, kw_only=True)
class TeacherScoreSettings(JobSettings):
    """A teacher-scores job (`teacher_scores_shard`): the shards, the pairs' length, the scoring batch and bf16
    (which pairs: the student's draws, a param of their own)."""

    BLOCK: ClassVar[str] = "reranker"
    teacher_shards: int
    max_length: int
    score_batch_size: int
    bf16: bool


@dataclass(frozen=True, kw_only=True)
class DenoiseScoringSettings(JobSettings):
    """A denoising scores' job (`denoise_scores`): the cross-encoder as loaded, its pairs' length, batch, bf16 and
    the number of shards (not the thresholds: the mining job reads them)."""

    BLOCK: ClassVar[str] = "mining"
    model: str
    max_length: int
    batch_size: int
    bf16: bool
    shards: int
