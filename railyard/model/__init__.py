"""The torch-free description of a model every layer reads: the engine builds from it, the roofline
counts FLOPs and bytes from it, the planner sizes weights and KV cache from it."""
