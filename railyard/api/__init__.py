"""The OpenAI-compatible HTTP front: FastAPI app, streaming, Prometheus metrics, `railyard serve`."""
