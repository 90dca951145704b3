"""The non-streaming path of every dialect: collect a submitted request's whole reply while
its client is watched. A client that leaves aborts it (None); a server-side cut or an engine
failure is raised as the error the route answers with.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from starlette.types import Receive

from ...engine import Finished, TokenDelta, TokenLogprobs
from .assembler import Assembler, Part
from .submit import Generation, failure, watched


@dataclass(frozen=True, slots=True)
class WholeReply:
    """A whole reply: its text, the generated token ids, how it finished, and the assembler's parts."""

    text: str
    token_ids: tuple[int, ...]
    finished: Finished
    parts: tuple[Part, ...] = ()  # empty unless an Assembler was given
    logprobs: tuple[Optional[TokenLogprobs], ...] = ()  # each generated token's, when asked


async def collect(receive: Receive, gen: Generation, assembler: Optional[Assembler] = None) -> Optional[WholeReply]:
    """The whole reply, fed through `assembler` when given; None if the client left."""
    texts: list[str] = []
    ids: list[int] = []
    logprobs: list[Optional[TokenLogprobs]] = []
    parts: list[Part] = []
    done: list[Finished] = []

    async def work() -> None:
        with gen.scope:
            async for event in gen.events():
                if assembler is not None:
                    parts.extend(assembler.feed(event))
                if isinstance(event, TokenDelta):
                    texts.append(event.text)
                    ids.append(event.token_id)
                    logprobs.append(event.logprobs)
                elif isinstance(event, Finished):
                    texts.append(event.text)
                    done.append(event)
                    return
            raise RuntimeError("the event stream ended without Finished")

    await watched(receive, gen, work)
    if gen.cut_error is not None:
        raise gen.cut_error
    if not done:
        return None
    if done[0].finish_reason not in ("stop", "length"):
        raise failure(done[0])
    return WholeReply("".join(texts), tuple(ids), done[0], tuple(parts), tuple(logprobs))
