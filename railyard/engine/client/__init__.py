"""The front's side of the engine: the EngineClient interface, its in-process and engine-process
implementations, and output processing (detokenization, stop strings)."""
