"""The worker bridge over a fake-runner engine: sync and async delivery, abort, stop, crash."""

import asyncio

import pytest

from mlxcel_py.engine import EngineStoppedError, Finished, PromptTooLongError, QueueFullError, TokenDelta
from mlxcel_py.engine.core.worker import EngineWorker
from mlxcel_py.errors import RequestError

from fakes import make_engine, request

TIMEOUT = 10


def collect(handle):
    events = []
    while True:
        event = handle.get(timeout=TIMEOUT)
        events.append(event)
        if isinstance(event, Finished):
            return events


@pytest.fixture
def worker():
    engine, runner = make_engine(num_slots=2, slot_context=100_000)
    w = EngineWorker(engine).start()
    w.runner = runner
    yield w
    w.stop()


def test_events_arrive_in_order_and_end_with_finished(worker):
    events = collect(worker.submit(request("a", 5, max_tokens=3)))
    assert [type(e).__name__ for e in events] == ["PromptProgress", "TokenDelta", "TokenDelta", "TokenDelta", "Finished"]
    assert events[-1].finish_reason == "length"


def test_async_iteration_delivers_on_the_callers_loop(worker):
    async def main():
        handle = worker.submit(request("a", 5, max_tokens=2), loop=asyncio.get_running_loop())
        return [e async for e in handle]

    events = asyncio.run(asyncio.wait_for(main(), TIMEOUT))
    assert isinstance(events[-1], Finished) and sum(isinstance(e, TokenDelta) for e in events) == 2


def test_submit_rejects_what_can_never_run(worker):
    with pytest.raises(PromptTooLongError):
        worker.submit(request("big", 100_000))
    worker.submit(request("dup", 5, max_tokens=100000))
    with pytest.raises(RequestError, match="duplicate request id"):
        worker.submit(request("dup", 5))


def test_abort_ends_a_stream_and_stop_aborts_the_rest(worker):
    long = worker.submit(request("long", 5, max_tokens=100000))
    other = worker.submit(request("other", 5, max_tokens=100000))
    assert long.get(timeout=TIMEOUT) is not None
    long.abort()
    assert collect(long)[-1].finish_reason == "abort"
    worker.stop()
    assert collect(other)[-1].finish_reason == "abort"
    with pytest.raises(EngineStoppedError):
        worker.submit(request("late", 5))


def test_an_engine_crash_fails_every_request_instead_of_hanging(worker):
    execute = worker.runner.execute

    def boom(step):
        if step.decode:
            raise RuntimeError("kaboom")
        return execute(step)

    worker.runner.execute = boom
    events = collect(worker.submit(request("a", 5, max_tokens=10)))
    assert events[-1].finish_reason == "error" and "internal engine error" in events[-1].error
    assert not worker.alive or worker.stats() is not None


def test_prepared_only_once_the_engines_startup_work_is_done():
    import threading

    engine, _runner = make_engine(num_slots=1, slot_context=1000)
    release, began = threading.Event(), threading.Event()
    engine.prepare = lambda: (began.set(), release.wait(TIMEOUT))  # stands in for the calibration
    w = EngineWorker(engine).start()
    try:
        assert began.wait(TIMEOUT) and not w.prepared
        handle = w.submit(request("early", 5, max_tokens=2))  # waits in the inbox meanwhile
        release.set()
        assert isinstance(collect(handle)[-1], Finished) and w.prepared
    finally:
        w.stop()


def test_queue_depth_counts_requests_not_yet_seen_by_the_engine():
    engine, _ = make_engine(num_slots=1, slot_context=100_000, max_queue=2)
    w = EngineWorker(engine).start()
    try:
        first = w.submit(request("a", 5, max_tokens=100000))
        first.get(timeout=TIMEOUT)  # admitted: it holds the only slot from now on
        w.submit(request("b", 5))
        w.submit(request("c", 5))
        with pytest.raises(QueueFullError, match="busy"):
            w.submit(request("d", 5))
    finally:
        w.stop()


def test_a_burst_fills_the_free_slots_plus_the_queue():
    engine, _ = make_engine(num_slots=2, slot_context=100_000, max_queue=4)
    w = EngineWorker(engine)  # not started: nothing leaves the queue while the burst arrives
    accepted, refused = [], []
    for i in range(20):
        try:
            accepted.append(w.submit(request(f"r{i}", 5, max_tokens=2)))
        except QueueFullError as exc:
            refused.append(str(exc))
    assert len(accepted) == 6 and len(refused) == 14
    assert refused[0] == "the server is busy (4 requests waiting); retry later"
    w.start()
    assert all(collect(h)[-1].finish_reason == "length" for h in accepted)
    w.submit(request("after", 5, max_tokens=2))  # finished requests gave their places back
    w.stop()


class CountingLoop(asyncio.SelectorEventLoop):
    """An event loop that counts the wakeups other threads ask of it."""

    wakeups = 0

    def call_soon_threadsafe(self, callback, *args, **kwargs):
        self.wakeups += 1
        return super().call_soon_threadsafe(callback, *args, **kwargs)


def test_a_ticks_events_reach_one_loop_with_one_wakeup_in_engine_order():
    from mlxcel_py.engine.core.events import empty_finish

    engine, _ = make_engine(num_slots=3, slot_context=100_000)
    w = EngineWorker(engine)  # not started: the test hands it one tick's events itself
    loop = CountingLoop()
    try:
        handles = {rid: w.submit(request(rid, 5), loop=loop) for rid in ("a", "b")}
        plain = w.submit(request("c", 5))  # a handle read from a plain thread, in the same tick
        tick = [TokenDelta("a", 7, "x"), TokenDelta("b", 8, "y"), TokenDelta("c", 9, "z"),
                TokenDelta("a", 10, "w"), empty_finish("a", "length")]
        w._dispatch(tick)
        assert loop.wakeups == 1
        got = {rid: [] for rid in handles}

        async def read():
            for rid, handle in handles.items():
                while handle._async.qsize():
                    got[rid].append(await handle._async.get())

        loop.run_until_complete(read())
        assert got["a"] == [tick[0], tick[3], tick[4]] and got["b"] == [tick[1]]
        assert plain.get(timeout=TIMEOUT) == tick[2]
        assert set(w._handles) == {"b", "c"}  # a finished: its place is given back
    finally:
        loop.close()


def test_a_closed_loop_drops_its_events_and_the_others_still_arrive():
    engine, _ = make_engine(num_slots=2, slot_context=100_000)
    w = EngineWorker(engine)
    gone, live = CountingLoop(), CountingLoop()
    try:
        a = w.submit(request("a", 5), loop=gone)
        b = w.submit(request("b", 5), loop=live)
        gone.close()
        w._dispatch([TokenDelta("a", 1, "x"), TokenDelta("b", 2, "y")])
        assert live.run_until_complete(asyncio.wait_for(b._async.get(), TIMEOUT)) == TokenDelta("b", 2, "y")
        assert a._async.qsize() == 0
    finally:
        live.close()
