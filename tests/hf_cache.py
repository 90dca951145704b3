"""Populate a Hugging Face hub cache folder the way huggingface_hub lays it out (no network).

Not a test module. The layout (docs: huggingface_hub "Manage your cache"):
`models--{org}--{name}/blobs/{sha256}`, `snapshots/{commit}/{file}` -> `../../blobs/{sha256}`,
`refs/{branch}` holding the commit hash. Tests check it with `scan_cache_dir()`."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def add_cached_repo(cache: Path, repo_id: str, files: dict[str, Path], branch: str = "main") -> str:
    """Put `files` (repo path -> local file) in the cache as one commit of `repo_id`; returns the commit."""
    root = cache / f"models--{repo_id.replace('/', '--')}"
    commit = hashlib.sha1(repr(sorted(files)).encode() + repo_id.encode()).hexdigest()
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    (root / "refs").mkdir(exist_ok=True)
    for name, source in files.items():
        data = source.read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        blob = root / "blobs" / digest
        blob.write_bytes(data)
        link = root / "snapshots" / commit / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (root / "refs" / branch).write_text(commit)
    return commit


def add_cached_dir(cache: Path, repo_id: str, folder: Path, branch: str = "main") -> str:
    """Every file of `folder` as one commit of `repo_id`."""
    files = {str(p.relative_to(folder)): p for p in sorted(folder.rglob("*")) if p.is_file()}
    return add_cached_repo(cache, repo_id, files, branch)
