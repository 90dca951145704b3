"""mlx-lm's tool-call parsers for a tokenizer: which one the model uses and the module that
parses its calls. Kept here, with the other mlx-lm readers, so tool_calls/ never imports mlx-lm."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any, Optional

from .vocab import hf_tokenizer

DEFAULT_PARSER = "json_tools"  # Hermes `<tool_call>` JSON, for models mlx-lm knows no parser for


def tool_parser_name(tokenizer: Any) -> Optional[str]:
    """mlx-lm's parser for this tokenizer: set at load (mlx-lm dirs) or inferred as mlx-lm's load does."""
    parse = getattr(tokenizer, "tool_parser", None)
    if parse is not None:
        return parse.__module__.rsplit(".", 1)[-1]
    from mlx_lm.tokenizer_utils import _infer_tool_parser  # what mlx_lm.load runs; GGUF loads skip it

    try:
        return _infer_tool_parser(hf_tokenizer(tokenizer))
    except Exception:  # noqa: BLE001 - inference is best effort; the default format always works
        return None


def tool_parser_module(name: str) -> ModuleType:
    """mlx-lm's parser module `name`: `tool_call_start`, `tool_call_end` and `parse_tool_call`."""
    return importlib.import_module(f"mlx_lm.tool_parsers.{name}")
