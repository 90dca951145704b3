"""Config helpers only the tests use."""

import mlxcel_py.config_chunk as config_module


def reset_prefill_chunk_override() -> None:
    """Forget the MLXCEL_PREFILL_CHUNK that config_chunk.py reads once per process."""
    config_module._override = config_module._UNREAD
