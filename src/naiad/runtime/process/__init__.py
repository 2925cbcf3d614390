"""The process runtime: model instances in worker processes, with shared-memory tensors and restart on crash."""
