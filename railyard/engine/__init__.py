"""Layer 3, the engine: paged KV cache, continuous batching, model execution (vLLM's role)."""
