"""Start-up: its timings, the embedded tiny model, and what railyard keeps on disk between starts."""
