"""OpenAI's `n` > 1: one engine request per choice (generation/fanout.py), answered as one
response whose `choices` carry their `index`. Usage counts the prompt once and every choice's
completion tokens, as OpenAI's; streamed, each choice's chunks carry its index, and the usage
chunk and [DONE] come once, after the last choice finishes.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from ...engine import Finished
from ..generation.assembler import Assembler
from ..generation.fanout import Indexed, MemberReply, PreparedGroup, copy_of, shared_prefix
from ..generation.prepared import Prepared
from ..generation.stream import sse
from ..generation.usage import timings_json
from ..http.errors import APIError
from .shapes import CUT_REASON, DONE, OpenAIFramer, Reply, assembled_json, bug_frames, chunk, ended_frames, usage_json


def fan_out(prepared: Prepared[Reply]) -> PreparedGroup[Reply]:
    """n copies of the request, the first one snapshotting the prompt for the others to adopt."""
    n = prepared.reply.choices
    if n == 1:
        return PreparedGroup((prepared.job,), (prepared.reply,), prepared.stream)
    first = shared_prefix(prepared.job)
    jobs = tuple(copy_of(first, i) for i in range(n))
    replies = tuple(dataclasses.replace(prepared.reply, index=i) for i in range(n))
    return PreparedGroup(jobs, replies, prepared.stream)


def usage_of(reply: Reply, finishes: Sequence[Finished]) -> dict:
    """The prompt once (the first choice's cache hit), every choice's completion tokens."""
    usage = usage_json(finishes[0], reply.shape.hide_output)
    completion = sum(usage_json(f, reply.shape.hide_output)["completion_tokens"] for f in finishes)
    return {**usage, "completion_tokens": completion, "total_tokens": usage["prompt_tokens"] + completion}


def whole_json(replies: Sequence[Reply], members: Sequence[MemberReply]) -> dict:
    """The non-streaming body: one choice per member, in index order."""
    bodies = []
    for reply, member in zip(replies, members):
        assembler = Assembler(reply.shape)
        parts = [part for event in member.events for part in assembler.feed(event)]
        finish = assembler.finish_reason(member.finished.finish_reason)
        bodies.append(assembled_json(reply, parts, member.finished, finish))
    body = bodies[0]
    body["choices"] = [b["choices"][0] for b in bodies]
    body["usage"] = usage_of(replies[0], [m.finished for m in members])
    return body


class ChoicesFramer:
    """The frames of n choices' streams in one (a `Framer` of Indexed events)."""

    def __init__(self, replies: Sequence[Reply]):
        self.reply = replies[0]
        self.framers = [OpenAIFramer(dataclasses.replace(r, include_usage=False)) for r in replies]
        self.finished: dict[int, Finished] = {}

    def opening(self) -> list[str]:
        return [frame for framer in self.framers for frame in framer.opening()]

    def frames(self, item: Indexed) -> list[str]:
        frames = self.framers[item.index].frames(item.event)
        if isinstance(item.event, Finished):
            self.finished[item.index] = item.event
            if len(self.finished) == len(self.framers) and self.reply.include_usage:
                ordered = [self.finished[i] for i in range(len(self.framers))]
                frames.append(sse(chunk(self.reply, [], usage=usage_of(self.reply, ordered),
                                        timings=timings_json(item.event))))
        return frames

    def cut(self, error: APIError) -> list[str]:
        open_ = [framer.reply for i, framer in enumerate(self.framers) if i not in self.finished]
        ends = [sse(chunk(r, [{"index": r.index, **_finish(r, CUT_REASON)}])) for r in open_]
        return ends + ended_frames(self.reply, CUT_REASON, error)[1:]

    def bug(self) -> list[str]:
        return bug_frames()

    def closing(self) -> list[str]:
        return [DONE]


def _finish(reply: Reply, reason: str) -> dict[str, Any]:
    if reply.kind == "completion":
        return {"text": "", "logprobs": None, "finish_reason": reason}
    return {"delta": {}, "logprobs": None, "finish_reason": reason}
