"""The OpenAI-compatible frontend: /v1/models, /v1/completions, /v1/chat/completions over the Server facade."""
