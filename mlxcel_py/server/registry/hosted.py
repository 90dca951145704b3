"""One configured model as the registry keeps it: its Runtime (one engine while resident), its
state, who is using it, when it was last used, and what it takes in memory."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from ...serve_models import ModelEntry
    from ..runtime import Runtime

LOADED, LOADING, UNLOADED = "loaded", "loading", "unloaded"


@dataclass(eq=False)
class Hosted:
    """A configured model. `users`: requests between acquire and release (waiting for the load,
    being prepared); submitted ones are in `runtime.live` until their response ends."""

    entry: "ModelEntry"
    runtime: "Runtime"  # the same object across loads: its metrics and counters persist
    estimate: int = 0  # bytes expected from the files (models/footprint.py)
    measured: int = 0  # bytes the resident set grew by during the load
    state: str = UNLOADED
    users: int = 0
    last_used: float = field(default_factory=time.monotonic)
    loading: Optional[asyncio.Future] = None
    timer: Optional[asyncio.TimerHandle] = None  # the keep-alive unload
    expires_at: Optional[float] = None  # wall-clock time of that unload (Ollama's expires_at)
    error: Optional[str] = None  # why the last load failed (the next request retries it)

    @property
    def name(self) -> str:
        return self.entry.name

    @property
    def idle(self) -> bool:
        """Nothing in flight: no request waiting, being prepared, or generating."""
        return self.users == 0 and not self.runtime.live

    @property
    def memory(self) -> int:
        """What the budget counts: the larger of the estimate and the measured growth (a load
        into memory an earlier unload freed grows the resident set less than it takes)."""
        return max(self.estimate, self.measured)

    def touch(self) -> None:
        self.last_used = time.monotonic()
        self.cancel_timer()

    def cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.timer, self.expires_at = None, None

    def describe(self) -> dict:
        """The state /v1/models, /api/tags and /api/ps report."""
        out: dict = {"value": self.state, "memory_bytes": self.memory if self.state == LOADED else 0,
                     "estimated_bytes": self.estimate}
        if self.state == LOADED:
            out["measured_bytes"] = self.measured
        if self.error is not None:
            out["last_error"] = self.error
        return out
