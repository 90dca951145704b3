"""Benchmark arms, and the server processes the tools start for them on loopback ports."""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Mapping, Optional, Sequence

import httpx

from ..errors import ConfigError

NAME_RE = re.compile(r"^[A-Za-z0-9_.+-]+$")


@dataclass(frozen=True, slots=True)
class Arm:
    """A named server configuration: extra `serve` flags for a server the tool starts, or the
    URL of one already running (a peer)."""

    name: str
    flags: tuple[str, ...] = ()
    url: Optional[str] = None

    @property
    def external(self) -> bool:
        return self.url is not None


def _split_named(text: str, option: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    name = name.strip()
    if not sep or not NAME_RE.match(name):
        raise ConfigError(f'{option} takes NAME=VALUE with a name of letters, digits and _.+- (got {text!r})', flag=option)
    return name, value


def parse_arm(text: str) -> Arm:
    """`NAME="server flags"` -> Arm; the flags are split like a shell would (may be empty)."""
    name, value = _split_named(text, "--arm")
    try:
        return Arm(name, tuple(shlex.split(value)))
    except ValueError as exc:
        raise ConfigError(f"--arm {name}: cannot split the flags {value!r}: {exc}", flag="--arm") from None


def parse_url_arm(text: str) -> Arm:
    """`NAME=http://host:port` -> an external Arm (the base URL, without /v1)."""
    name, value = _split_named(text, "--url")
    url = value.strip().rstrip("/")
    if not re.match(r"^https?://[^/\s]+", url):
        raise ConfigError(f"--url {name}: expected http://host:port (got {value!r})", flag="--url")
    return Arm(name, url=url.removesuffix("/v1"))


def budget_arm(budget_ms: int, name: str = "budget") -> Arm:
    """The ITL-budget arm: a server started with `--itl-budget-ms budget_ms`."""
    if isinstance(budget_ms, bool) or not isinstance(budget_ms, int) or budget_ms < 1:
        raise ConfigError(f"--itl-budget-ms must be a positive integer (got {budget_ms!r})", flag="--itl-budget-ms")
    return Arm(name, ("--itl-budget-ms", str(budget_ms)))


def parse_arms(arms: Sequence[str], urls: Sequence[str], extra: Sequence[Arm] = ()) -> list[Arm]:
    """All arms in the order given (--arm ones, --url ones, then `extra`); names must be unique."""
    out = [parse_arm(a) for a in arms] + [parse_url_arm(u) for u in urls] + list(extra)
    seen: set[str] = set()
    for arm in out:
        if arm.name in seen:
            raise ConfigError(f"arm name {arm.name!r} is given twice", flag="--arm")
        seen.add(arm.name)
    if not out:
        raise ConfigError("give at least one --arm NAME=\"flags\" or --url NAME=http://...", flag="--arm")
    return out


def null_arm(arms: Sequence[Arm], explicit: Optional[str] = None) -> Optional[Arm]:
    """The null arm: `explicit` by name, else the first arm whose flags repeat an earlier arm's."""
    if explicit is not None:
        for arm in arms:
            if arm.name == explicit:
                return arm
        raise ConfigError(f"--null {explicit!r} is not one of the arms ({', '.join(a.name for a in arms)})", flag="--null")
    seen = set()
    for arm in arms:
        key = (arm.flags, arm.url)
        if key in seen:
            return arm
        seen.add(key)
    return None


def free_port() -> int:
    """A loopback port that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True, slots=True)
class ServerSpec:
    """How to start one server process: argv, extra environment, and its loopback port."""

    name: str
    argv: tuple[str, ...]
    port: int
    env: Mapping[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def mlxcel_spec(arm: Arm, parallel: Optional[int], model: Optional[str], port: Optional[int] = None) -> ServerSpec:
    """`python -m mlxcel_py serve` for an arm: loopback, a free port, `--parallel`, then its flags."""
    port = port or free_port()
    argv = [sys.executable, "-m", "mlxcel_py", "serve", "--host", "127.0.0.1", "--port", str(port)]
    if parallel is not None:
        argv += ["--parallel", str(parallel)]
    if model:
        argv += ["--model", model]
    return ServerSpec(arm.name, tuple(argv + list(arm.flags)), port)


class ManagedServer:
    """A server process started for one arm; `with` starts it, waits for /health, and stops it."""

    def __init__(self, spec: ServerSpec, health_timeout_s: float = 300.0):
        self.spec, self.health_timeout_s = spec, health_timeout_s
        self.proc: Optional[subprocess.Popen] = None
        self.log_path = Path(tempfile.mkstemp(prefix=f"bench-{spec.name}-", suffix=".log")[1])

    def __enter__(self) -> "ManagedServer":
        self.start()
        try:
            self.wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        env = {**os.environ, **self.spec.env}
        with open(self.log_path, "wb") as log:
            # Own session: stop() signals the server and anything it spawned, nothing else.
            self.proc = subprocess.Popen(self.spec.argv, stdout=log, stderr=subprocess.STDOUT, env=env,
                                         stdin=subprocess.DEVNULL, start_new_session=True)

    def wait_healthy(self) -> None:
        """Poll GET /health until 200; raise RuntimeError (with the log tail) if the process dies."""
        deadline = time.monotonic() + self.health_timeout_s
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"{self.spec.name}: server exited with {self.proc.returncode}\n{self.log_tail()}")
            try:
                if httpx.get(self.spec.url + "/health", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        raise RuntimeError(f"{self.spec.name}: /health not ready after {self.health_timeout_s:.0f}s\n{self.log_tail()}")

    def stop(self, grace_s: float = 15.0) -> None:
        """SIGTERM the server's process group, SIGKILL after `grace_s`; then drop its log."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log_path.unlink(missing_ok=True)

    def log_tail(self, num_lines: int = 20) -> str:
        if not self.log_path.exists():
            return ""
        lines = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(lines[-num_lines:])

    def describe(self) -> str:
        return shlex.join(self.spec.argv)


SpecFor = Callable[[Arm], ServerSpec]


@contextmanager
def arm_endpoint(arm: Arm, spec_for: SpecFor) -> Iterator[tuple[str, str]]:
    """(base URL, how it was started) of an arm: its --url, or a server started for it here."""
    if arm.url is not None:
        yield arm.url, f"external server at {arm.url}"
        return
    with ManagedServer(spec_for(arm)) as server:
        yield server.spec.url, server.describe()
