"""Model definitions (math only) and their loading from HF-format checkpoints."""
