"""Where model files come from: local directories and object storage (s3, gs, az) through fsspec."""
