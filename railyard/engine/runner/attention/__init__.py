"""Paged attention: one interface (`AttentionBackend`), a torch reference backend and a Triton one."""

from railyard.engine.runner.attention.metadata import AttentionMetadata

__all__ = ["AttentionMetadata", "get_backend"]


def get_backend(name: str, device: str):
    """The backend class for a name ("auto" picks Triton on CUDA when it is importable)."""
    if name == "auto":
        name = "torch"
        if device.startswith("cuda"):
            try:
                import triton  # noqa: F401

                name = "triton"
            except ImportError:
                pass
    if name == "torch":
        from railyard.engine.runner.attention.torch_backend import TorchAttentionBackend

        return TorchAttentionBackend
    if name == "triton":
        from railyard.engine.runner.attention.triton_backend import TritonAttentionBackend

        return TritonAttentionBackend
    raise ValueError(f"unknown attention backend {name!r}")
