"""The built-in LLM backend (`backend: "transformers"`): Hugging Face causal LMs with in-flight batching."""
