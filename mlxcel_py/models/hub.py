"""Hugging Face repo ids -> local paths, through huggingface_hub's cache.

`org/name[@revision][:selector]`: the selector names a GGUF file in the repo (`:x.gguf`)
or a quantization tag (`:Q4_K_M`, matched against the GGUF file names, as llama-server's
`-hf` does). The cache is asked first with no network call at all; a download (with
huggingface_hub's progress bars) is tried only when the files are missing and
HF_HUB_OFFLINE is not set."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..errors import ModelLoadError
from .gguf_split import with_parts

HUB_ID = re.compile(r"^(?P<repo>[\w.-]+/[\w.-]+)(?:@(?P<revision>[\w./-]+?))?(?::(?P<selector>[^:/]+))?$")
DEFAULT_TAG = "Q4_K_M"  # llama-server -hf's default when a GGUF repo is named without a tag
# What mlx-lm downloads for a model directory (mlx_lm.utils.DEFAULT_ALLOW_PATTERNS).
MLX_PATTERNS = ["*.json", "model*.safetensors", "*.py", "tokenizer.model", "*.tiktoken", "tiktoken.model",
                "*.txt", "*.jsonl", "*.jinja"]


@dataclass(frozen=True, slots=True)
class HubId:
    repo: str
    revision: Optional[str]
    selector: Optional[str]  # a .gguf file name or a quantization tag

    def __str__(self) -> str:
        rev = f"@{self.revision}" if self.revision else ""
        return f"{self.repo}{rev}{':' + self.selector if self.selector else ''}"


def parse_hub_id(spec: str) -> Optional[HubId]:
    """The parts of `org/name[@rev][:selector]`, or None when `spec` is not shaped like one."""
    match = HUB_ID.match(spec)
    if match is None or spec.startswith((".", "~")):
        return None
    return HubId(match["repo"], match["revision"], match["selector"])


def _offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def _missing(hub: HubId, reason: str) -> ModelLoadError:
    from huggingface_hub import constants

    if _offline():
        how = f"it is not in the Hugging Face cache ({constants.HF_HUB_CACHE}) and HF_HUB_OFFLINE is set"
    else:
        how = reason
    rev = f" --revision {hub.revision}" if hub.revision else ""
    return ModelLoadError(f"model {str(hub)!r} not found: {how}; get it with `hf download {hub.repo}{rev}`")


def _call(hub: HubId, fn, *args, **kwargs) -> Path:
    """Run a huggingface_hub call: cache only first, then (if allowed) with the network."""
    from huggingface_hub import errors

    try:
        return Path(fn(*args, revision=hub.revision, local_files_only=True, **kwargs))
    except (errors.LocalEntryNotFoundError, errors.EntryNotFoundError, FileNotFoundError):
        if _offline():
            raise _missing(hub, "") from None
    try:
        return Path(fn(*args, revision=hub.revision, **kwargs))
    except errors.RepositoryNotFoundError:
        raise _missing(hub, "no such repo on the Hugging Face Hub (private ones need `hf auth login`)") from None
    except errors.RevisionNotFoundError:
        raise _missing(hub, f"no revision {hub.revision!r} on the Hugging Face Hub") from None
    except (errors.EntryNotFoundError, errors.LocalEntryNotFoundError, errors.HfHubHTTPError, OSError) as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise _missing(hub, f"cannot download it ({reason})") from None


def _gguf_names(hub: HubId) -> list[str]:
    """GGUF files of the repo: from the cached snapshot, or the Hub's listing when online."""
    from huggingface_hub import HfApi, snapshot_download

    try:
        folder = Path(snapshot_download(hub.repo, revision=hub.revision, local_files_only=True, allow_patterns=[]))
        cached = sorted(str(p.relative_to(folder)) for p in folder.rglob("*.gguf"))
    except Exception:  # noqa: BLE001 - any cache miss: fall through to the listing
        cached = []
    if cached or _offline():
        return cached
    try:
        return sorted(f for f in HfApi().list_repo_files(hub.repo, revision=hub.revision) if f.endswith(".gguf"))
    except Exception as exc:  # noqa: BLE001 - network, auth, missing repo: all one message
        raise _missing(hub, f"cannot list it on the Hugging Face Hub ({type(exc).__name__})") from None


def _pick_gguf(hub: HubId, names: list[str], tag: str) -> list[str]:
    """The file for `tag`, or every part of a split one (llama.cpp's -0000i-of-0000N), the first first."""
    pattern = re.compile(rf"(^|[-._/]){re.escape(tag)}(-\d{{5}}-of-\d{{5}})?\.gguf$", re.IGNORECASE)
    found = sorted(n for n in names if pattern.search(n))
    if len(found) == 1:
        return found
    if not found:
        have = ", ".join(names) or "none"
        raise ModelLoadError(
            f"no GGUF file for tag {tag!r} in {hub.repo} (GGUF files: {have}; pick one with {hub.repo}:FILE.gguf)"
        )
    if with_parts(found[0]) == found:
        return found
    raise ModelLoadError(f"more than one GGUF file for tag {tag!r} in {hub.repo}: {', '.join(found)}; "
                         f"pick one with {hub.repo}:FILE.gguf")


def _gguf_file(hub: HubId) -> Path:
    from huggingface_hub import hf_hub_download

    selector = hub.selector or DEFAULT_TAG
    if selector.lower().endswith(".gguf"):
        names = with_parts(selector)
    else:
        names = _gguf_names(hub)
        names = names if hub.selector is None and len(names) == 1 else _pick_gguf(hub, names, selector)
    paths = [_call(hub, hf_hub_download, hub.repo, name) for name in names]  # a split's parts land side by side
    return paths[0]


def _has_config(hub: HubId) -> bool:
    from huggingface_hub import errors, hf_hub_download

    try:
        hf_hub_download(hub.repo, "config.json", revision=hub.revision, local_files_only=True)
        return True
    except (errors.LocalEntryNotFoundError, errors.EntryNotFoundError, FileNotFoundError):
        return False


def resolve_hub_id(hub: HubId) -> Path:
    """A local mlx-lm directory or .gguf file for `hub`; raises ModelLoadError naming the id."""
    from huggingface_hub import snapshot_download

    if hub.selector is not None:
        return _gguf_file(hub)
    if _has_config(hub):
        return _call(hub, snapshot_download, hub.repo, allow_patterns=MLX_PATTERNS)
    if _gguf_names(hub):
        return _gguf_file(hub)
    return _call(hub, snapshot_download, hub.repo, allow_patterns=MLX_PATTERNS)
