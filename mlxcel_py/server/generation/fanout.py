"""Several engine requests answered as one response: llama-server's several prompts in one
/completion, OpenAI's `n` choices. Each is an independent engine request, submitted together
(in order, so a later one can adopt the prompt-cache snapshot an earlier one's prefill left);
a `GenerationGroup` merges their events, tagged with their index, behind the interface the
stream and the collector use (`scope`, `events`, `cut_error`, `close`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, Generic, Optional, Sequence, TypeVar

import anyio
from starlette.requests import Request
from starlette.types import Receive

from ...engine import Finished, Request as EngineRequest, TokenDelta, TokenLogprobs
from ..http.body import read_body
from ..http.errors import APIError
from ..runtime import routed, runtime
from .submit import Generation, failure, submit, watched

if TYPE_CHECKING:
    from ..runtime import Runtime

R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class PreparedGroup(Generic[R]):
    """Parsed, validated, tokenized requests answered as one response: each engine request with
    its reply's labels (one of each for a plain request)."""

    jobs: tuple[EngineRequest, ...]
    replies: tuple[R, ...]
    stream: bool


@dataclass(frozen=True, slots=True)
class Indexed:
    """One member's engine event."""

    index: int
    event: Any


class GenerationGroup:
    """Submitted requests answered together: one cancel scope (a cut of any member ends the
    response), their events merged in arrival order, all aborted unless finished on close."""

    def __init__(self, members: Sequence[Generation]):
        self.members = list(members)
        self.scope = anyio.CancelScope()
        for gen in self.members:  # Generation.cut cancels its scope: make it this one
            gen.scope = self.scope

    @property
    def cut_error(self) -> Optional[APIError]:
        return next((g.cut_error for g in self.members if g.cut_error is not None), None)

    async def events(self) -> AsyncIterator[Indexed]:
        streams = [gen.events() for gen in self.members]
        pending = {asyncio.ensure_future(s.__anext__()): i for i, s in enumerate(streams)}
        try:
            while pending:
                done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in sorted(done, key=pending.get):
                    i = pending.pop(task)
                    try:
                        event = task.result()
                    except StopAsyncIteration:
                        continue
                    pending[asyncio.ensure_future(streams[i].__anext__())] = i
                    yield Indexed(i, event)
        finally:
            for task in pending:
                task.cancel()

    def close(self) -> None:
        for gen in self.members:
            gen.close()


def copy_of(job: EngineRequest, i: int) -> EngineRequest:
    """The i-th copy of `job` (an n > 1 choice): its own id and, when seeded, the seed + i, so a
    seeded request's choices differ and the first is the n = 1 reply."""
    seed = job.sampling.seed
    sampling = job.sampling if seed is None or i == 0 else dataclasses.replace(job.sampling, seed=(seed + i) % 2**63)
    return dataclasses.replace(job, request_id=f"{job.request_id}-{i}" if i else job.request_id, sampling=sampling)


def shared_prefix(job: EngineRequest) -> EngineRequest:
    """`job` snapshotting its prompt less the last token, so the next member adopts the prefill
    (a chat prompt already snapshots at its history boundary)."""
    if job.history_boundary is not None or len(job.prompt_ids) < 2 or not job.cache_prompt:
        return job
    return dataclasses.replace(job, history_boundary=len(job.prompt_ids) - 1)


async def start_all(request: Request, prepare: Callable[["Runtime", bytes], PreparedGroup[R]], param: str
                    ) -> tuple[PreparedGroup[R], Optional[list[Generation]]]:
    """`start` for a group: read the body, prepare it off the loop, submit every job in order."""
    arrived = time.perf_counter()
    raw = await read_body(request, runtime(request).max_body_bytes)
    async with routed(request, raw) as rt:
        prepared = await rt.off_loop(prepare, rt, raw)
        del raw
        return prepared, await submit_all(request, rt, prepared.jobs, arrived, param)


async def submit_all(request: Request, rt: "Runtime", jobs: Sequence[EngineRequest], arrived: float,
                     param: str) -> Optional[list[Generation]]:
    """Submit every job, in order; None if the client left. A refusal aborts the ones submitted."""
    members: list[Generation] = []
    try:
        for job in jobs:
            gen = await submit(request, rt, job, arrived, param)
            if gen is None:
                break
            members.append(gen)
    except BaseException:
        for gen in members:
            gen.close()
        raise
    if len(members) < len(jobs):
        for gen in members:
            gen.close()
        return None
    return members


@dataclass(frozen=True, slots=True)
class MemberReply:
    """One member's whole reply: its events in order (the dialect assembles them)."""

    events: tuple[Any, ...]

    @property
    def finished(self) -> Finished:
        return self.events[-1]

    @property
    def text(self) -> str:
        return "".join(e.text for e in self.events if isinstance(e, (TokenDelta, Finished)))

    @property
    def token_ids(self) -> tuple[int, ...]:
        return tuple(e.token_id for e in self.events if isinstance(e, TokenDelta))

    @property
    def logprobs(self) -> tuple[Optional[TokenLogprobs], ...]:
        return tuple(e.logprobs for e in self.events if isinstance(e, TokenDelta))


async def collect_all(receive: Receive, group: GenerationGroup) -> Optional[list[MemberReply]]:
    """Every member's whole reply, by index; None if the client left. A cut or an engine
    failure is raised as the error the route answers with."""
    events: list[list[Any]] = [[] for _ in group.members]

    async def work() -> None:
        with group.scope:
            async for item in group.events():
                events[item.index].append(item.event)

    await watched(receive, group, work)  # type: ignore[arg-type]  # a group closes like a Generation
    if group.cut_error is not None:
        raise group.cut_error
    if not all(e and isinstance(e[-1], Finished) for e in events):
        return None
    for member in events:
        if member[-1].finish_reason not in ("stop", "length"):
            raise failure(member[-1])
    return [MemberReply(tuple(e)) for e in events]
