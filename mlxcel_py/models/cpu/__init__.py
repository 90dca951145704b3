"""The CPU fast path's kernels (see docs/CPU_FAST_PATH.md and docs/ARCHITECTURE.md)."""
