"""Joining the launcher's `mx.distributed` group, and this rank's runner over its shard.

The server's cluster (server/cluster.py) calls these through the engine's public API. MLX
is imported only when they run, so importing the engine still does not import it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional

if TYPE_CHECKING:
    from ...models import LoadedModel
    from ..core.step import Runner

log = logging.getLogger("mlxcel_py.distributed")


@dataclass(frozen=True, slots=True)
class JoinedGroup:
    """This process's membership: the link to the other ranks, and the watchdog that bounded the join."""

    link: Any  # distributed.link.Link: rank, size, group, handshake
    startup: Any  # distributed.link.Watchdog: bounds the load handshake next


def join_group(backend: str, timeout_s: float, on_stall: Callable[[str, float], None]) -> Optional[JoinedGroup]:
    """Join the group (`backend` "any" lets MLX pick); None when the world has one rank.

    `on_stall(what, seconds)` runs from the watchdog's thread when joining takes over
    `timeout_s` (a rank that never started); a RuntimeError from MLX passes through."""
    import mlx.core as mx

    from .link import Link, Watchdog

    watchdog = Watchdog(on_stall)
    with watchdog.guard(f"joining the {backend} group", timeout_s):
        group = mx.distributed.init(strict=backend != "any", backend=backend)
    if group.size() == 1:
        return None
    return JoinedGroup(Link(group), watchdog)


def leader_runner(loaded: "LoadedModel", link: Any, timeout_s: float) -> "Runner":
    """Rank 0's runner: it broadcasts every record before running it on its own shard."""
    from ..runner.constraints import compiler_for
    from .runners import LeaderRunner

    return LeaderRunner(loaded.model, link, timeout_s, compiler=compiler_for(loaded), kernels=loaded.cpu_kernels,
                        rank_head=loaded.rank_head)


def follow_leader(loaded: "LoadedModel", link: Any, timeout_s: float) -> Optional[str]:
    """Any other rank: execute rank 0's records until it stops (None) or is lost (why)."""
    from ..runner.constraints import compiler_for
    from .runners import ShardRunner, follow

    runner = ShardRunner(loaded.model, link, compiler_for(loaded), kernels=loaded.cpu_kernels,
                         rank_head=loaded.rank_head)
    return follow(runner, link, timeout_s)
