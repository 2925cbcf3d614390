"""`naiad genai-perf` / `naiad perf --llm`: GenAI-Perf's LLM metrics against generate_stream and OpenAI endpoints."""
