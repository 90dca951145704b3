"""Model loading for the commands: BLAS preload first, a rich status while loading, one-line errors."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console

from ..config import AppConfig
from ..errors import MlxcelError
from .common import fail

if TYPE_CHECKING:
    from ..models import LoadedModel


def load_or_exit(cfg: AppConfig, console: Console | None = None) -> "LoadedModel":
    """Preload the BLAS, then load the model under a status spinner; exit 1 on a load error."""
    from ..models.cpu.blas import preload_blas

    try:
        preload_blas(cfg.blas)
    except MlxcelError as exc:
        fail(str(exc))
    from ..models import load_model  # imports mlx.core: only after the preload

    console = console or Console(stderr=True)
    try:
        with console.status("Loading model...") as status:
            loaded = load_model(cfg.model.path, on_progress=lambda msg: status.update(msg), threads=cfg.model.threads,
                                cpu_weights=cfg.model.cpu_weights, lora=cfg.model.lora, lora_fuse=cfg.model.lora_fuse)
    except MlxcelError as exc:  # ModelLoadError
        fail(str(exc))
    if not loaded.generates:
        fail(f"{cfg.command}: {loaded.no_text()} (serve it with `mlxcel-py serve`)")
    return loaded


def load_draft_or_exit(cfg: AppConfig, target: "LoadedModel", console: Console | None = None) -> "LoadedModel | None":
    """The --draft-model (None when not asked); exit 1 when it cannot load or draft for `target`."""
    if cfg.model.draft is None:
        return None
    from ..models import load_draft

    console = console or Console(stderr=True)
    try:
        with console.status("Loading the draft model...") as status:
            return load_draft(cfg.model.draft, target, on_progress=lambda msg: status.update(msg),
                              threads=cfg.model.threads, cpu_weights=cfg.model.cpu_weights)
    except MlxcelError as exc:
        fail(str(exc))
