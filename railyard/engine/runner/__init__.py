"""The model runner: turns a scheduled step into tensors, runs the model (eager, CUDA graphs, tensor
parallel) and samples."""
