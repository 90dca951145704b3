"""How long each prefill piece is: the `ChunkPolicy` Protocol and what it reads (`TickState`),
the fixed alone/contended policy, the ITL-budget policy with its cost model, calibration and
probe, and the arithmetic that cuts a prompt into pieces. Plain Python and numpy: no MLX."""
