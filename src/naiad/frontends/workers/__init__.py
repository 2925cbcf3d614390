"""Frontend worker processes: the HTTP and gRPC protocol work of `--frontend-processes N` runs in N processes
that hand decoded requests to the one core process (see docs/architecture.md, "Frontend processes")."""
