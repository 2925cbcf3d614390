"""Statistics, metrics and logging owned by a Server instance."""
