"""Where model files come from: local directories (cloud storage through fsspec later)."""
