"""Evaluation: classification top-1/5 (and, from their owners, zero-shot and retrieval)."""
