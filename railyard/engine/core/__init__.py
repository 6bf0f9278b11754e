"""The engine core: the step loop (EngineCore), the process it runs in, and the messages it exchanges."""
