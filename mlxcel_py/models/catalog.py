"""The models a user can name: the Hugging Face cache's repos and the bundled default model.

Plain Python (no MLX): `mlxcel-py models` lists these without loading anything."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from .loader import default_model_path
from ..errors import ModelLoadError


@dataclass(frozen=True, slots=True)
class ModelEntry:
    name: str  # what --model takes
    format: str  # "mlx", "gguf", "gguf, default", "other"
    size_bytes: int
    path: str
    files: tuple[str, ...] = ()  # GGUF file names in a repo (pick one with name:FILE)


def _repo_entry(repo) -> ModelEntry:
    files = {f.file_name for rev in repo.revisions for f in rev.files}
    paths = {str(f.file_path.relative_to(rev.snapshot_path)) for rev in repo.revisions for f in rev.files}
    ggufs = tuple(sorted(p for p in paths if p.endswith(".gguf")))
    if "config.json" in files and any(f.endswith(".safetensors") for f in files):
        kind = "mlx"
    elif ggufs:
        kind = "gguf"
    else:
        kind = "other"
    return ModelEntry(repo.repo_id, kind, repo.size_on_disk, str(repo.repo_path), ggufs)


def hub_models(cache_dir: Optional[str] = None) -> tuple[list[ModelEntry], Optional[str]]:
    """Model repos in the HF cache (HF_HUB_CACHE / HF_HOME); second value: why none could be read."""
    from huggingface_hub import constants, scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    folder = cache_dir or constants.HF_HUB_CACHE
    try:
        info = scan_cache_dir(folder)
    except CacheNotFound:
        return [], f"no Hugging Face cache at {folder}"
    repos = sorted((r for r in info.repos if r.repo_type == "model"), key=lambda r: r.repo_id.lower())
    return [_repo_entry(r) for r in repos], None


def default_entry() -> Optional[ModelEntry]:
    """The bundled default model, or None when it is not installed."""
    try:
        path = Path(default_model_path())
    except ModelLoadError:
        return None
    return ModelEntry(path.stem, "gguf, default", path.stat().st_size, str(path), (path.name,))
