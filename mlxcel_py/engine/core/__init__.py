"""The engine's pure-Python core: `Engine` (one tick), the scheduler, sequences, the `Step` records
and the `Runner` Protocol, requests, events, stats, the prompt-cache index, detokenization, the worker.

No MLX here: the core drives any `Runner` (engine/runner/ in production, fakes in tests)."""
