"""mlxcel-py: local LLM serving on MLX."""

__version__ = "0.1.0"
