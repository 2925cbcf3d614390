"""Schedulers: how queued requests become executions on a model's instances."""
