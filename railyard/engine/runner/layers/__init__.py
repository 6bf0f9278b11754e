"""Building blocks of the decoder models (math only: no requests, no scheduling)."""
