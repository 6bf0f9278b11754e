"""The step loop's bookkeeping: sequences, KV blocks and the scheduler. No torch, no model."""
