"""Embeddings through the providers' batch APIs: persisted jobs, resume, failure policy, metrics."""

from memory_pipeline.batching.engine import BatchEmbedder, BatchMetrics, BatchOptions, BatchOutcome
from memory_pipeline.batching.jobs import FAILURE_LIMIT, JobStore, store_path

__all__ = ["BatchEmbedder", "BatchMetrics", "BatchOptions", "BatchOutcome", "FAILURE_LIMIT", "JobStore", "store_path"]
