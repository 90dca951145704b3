"""Sliding-window layers over the engine's rows (engine/runner/kv_rows.py): a slot keeps only the
positions its windowed layers read, with the tokens of the full cache, and the prompt cache serves a
snapshot's prefixes only as far back as those layers still hold (PREFIX_REACH)."""

import mmap
from pathlib import Path

import numpy as np
import pytest

from mlxcel_py.config import resolve
from mlxcel_py.engine import Request, SamplingParams, build_engine
from mlxcel_py.engine.core.events import Finished, TokenDelta
from mlxcel_py.engine.core.prompt_cache import PromptCache
from mlxcel_py.engine.core.step import Retire, Step
from mlxcel_py.engine.runner.kv_rows import PREFIX_REACH, RELEASE_STEP, WINDOW_SLACK, RowKV, floor_for
from mlxcel_py.engine.runner.model_runner import ModelRunner

from config_helpers import flags_for
from kv_models import prompt
from test_kv_rows import begin

WINDOW = 8  # the gemma3 fixture's (5 windowed layers, then a full one)


@pytest.fixture(scope="module")
def gemma():
    from mlxcel_py.models import load_model

    lm = load_model(str(Path(__file__).parent / "fixtures" / "gguf" / "gemma3-f16.gguf"), threads=1)
    assert lm.cpu_decode.spec.windows == (WINDOW,) * 5 + (0,)
    return lm


def test_the_floor_keeps_the_window_and_its_slack_in_whole_steps():
    assert floor_for(10_000, 0) == 0  # a full-attention layer keeps everything
    assert floor_for(WINDOW + WINDOW_SLACK + RELEASE_STEP - 1, WINDOW) == 0
    assert floor_for(WINDOW + WINDOW_SLACK + RELEASE_STEP, WINDOW) == RELEASE_STEP
    for length in range(0, 3000, 37):
        floor = floor_for(length, 512)
        assert floor % RELEASE_STEP == 0 and floor <= max(0, length - 512 - WINDOW_SLACK)
        assert length - floor < 512 + WINDOW_SLACK + RELEASE_STEP


def test_windowed_layers_give_their_pages_back_with_the_full_caches_tokens(gemma):
    """A 700-token prompt beside a short one, decoding past a release step: the windowed layers hold
    nothing below the floor (read as zeros after MADV_DONTNEED), the full layer everything, and
    every token equals the runner that keeps every position (mlx-lm's BatchKVCache)."""
    d = gemma.cpu_decode
    ours = ModelRunner(gemma.model, decode=d, verify=d.verify)
    theirs = ModelRunner(gemma.model, decode=d, verify=d.verify, kv_rows=False)
    got, want = [], []
    for runner, out in ((ours, got), (theirs, want)):
        out.append(begin(runner, 1, prompt(700, 1), chunk=256))
        out.append(begin(runner, 2, prompt(30, 2)))
        for i in range(RELEASE_STEP + 4):
            out.extend(runner.execute(Step(decode=(1, 2))).decoded)
        out.extend(runner.execute(Step(decode=(1, 2), drafts=((5, 6), (7,)))).decoded)
    assert got == want
    kv = ours._batch
    assert isinstance(kv, RowKV) and kv.windows == d.spec.windows
    slot, length = kv.slots[0], kv.lengths[0]
    floor = kv.floors[slot]
    assert floor == floor_for(length - 3, WINDOW) > 0  # raised as the row grew (the verify's width of 3)
    assert kv.keys[0][slot, :, floor:length].any()
    if hasattr(mmap, "MADV_REMOVE"):  # Linux: the pages are freed, and read as zeros
        assert not kv.keys[0][slot, :, :floor].any() and not kv.values[4][slot, :, :floor].any()
    assert kv.values[5][slot, :, :floor].all(axis=-1).any()  # the full-attention layer keeps every position
    assert kv.floors.get(kv.slots[1], 0) == 0  # the short row released nothing


def request(rid, ids, n=12):
    return Request(rid, tuple(ids), SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))


def run(built, req) -> tuple[list[int], int]:
    built.add_request(req)
    tokens, cached = [], None
    for _ in range(2000):
        if not built.has_work():
            break
        for e in built.step():
            if isinstance(e, TokenDelta):
                tokens.append(e.token_id)
            elif isinstance(e, Finished):
                cached = e.usage.cached_tokens
    assert cached is not None, "the request did not finish"
    return tokens, cached


def engine(gemma):
    return build_engine(resolve("serve", flags_for("serve", parallel=2), env={}).engine, gemma)


def test_a_hit_within_the_reach_equals_the_miss_and_a_shorter_prefix_recomputes(gemma):
    """The next turn over the whole first conversation is a hit whose windowed positions are all
    there, with a cold engine's tokens; a prompt sharing only the first 600 of the snapshot's ~712
    tokens is past the reach: not served from it (recomputed), with a cold engine's tokens too."""
    warm = engine(gemma)
    assert warm.runner.prefix_reach == PREFIX_REACH
    first = prompt(700, 1)
    answer, _ = run(warm, request("a", first))
    turn = (*first, *answer, *prompt(20, 2))
    hit = run(warm, request("b", turn))
    assert hit[1] >= len(first) + len(answer) - 1
    assert hit[0] == run(engine(gemma), request("b", turn))[0]
    branch = (*first[:600], *prompt(30, 3))
    miss = run(warm, request("c", branch))
    assert miss[1] == 0
    assert miss[0] == run(engine(gemma), request("c", branch))[0]


def test_the_prompt_cache_serves_a_snapshot_only_within_its_reach():
    cache = PromptCache(1 << 30, 8, 1, 4, reach=64)
    sid = cache.insert(tuple(range(1000)))
    assert cache.lookup(tuple(range(1000)) + (7,)).length == 1000
    assert cache.lookup(tuple(range(936)) + (7,)).length == 936  # 64 short of the snapshot
    assert cache.lookup(tuple(range(935)) + (7,)) is None
    assert PromptCache(1 << 30, 8, 1, 4).lookup is not None and sid == 1
    unlimited = PromptCache(1 << 30, 8, 1, 4)
    unlimited.insert(tuple(range(1000)))
    assert unlimited.lookup(tuple(range(10)) + (7,)).length == 10


def test_a_saved_and_restored_windowed_slot_continues_token_exactly(gemma, tmp_path):
    """A slot file of a 700-token row holds zeros below its windowed layers' floor; restored into
    another engine, the continuation adopts it (within the reach) with the original's tokens."""
    import os

    from mlxcel_py.engine.core.slots import SlotAction

    def act(built, action):
        path = tmp_path / "w.bin"
        return built.slot_action(SlotAction(action, 0, os.path.basename(path), str(path)))

    def make():
        return build_engine(resolve("serve", flags_for("serve", parallel=1, cache_min_prefix=8), env={}).engine, gemma)

    first_engine = make()
    p = prompt(700, 4)
    first, _ = run(first_engine, request("a", p, 16))
    assert act(first_engine, "save").n_tokens == 700 + 15
    fresh = make()
    assert act(fresh, "restore").n_tokens == 715
    follow = run(fresh, request("b", (*p, *first[:8]), 8))
    assert follow == (first[8:16], 700 + 7)


def test_the_kv_accounting_counts_the_window_once_a_slot(gemma):
    """Bytes per token over the full layer; the five windowed layers' up to their positions a slot."""
    kv = engine(gemma).stats().kv
    per_layer = 2 * 2 * 16 * 4  # K and V, 2 KV heads of 16, float32
    assert (kv.bytes_per_token, kv.window_bytes_per_token) == (per_layer, 5 * per_layer)
    assert kv.window_positions == WINDOW + WINDOW_SLACK + RELEASE_STEP
    assert kv.slot_bytes(100) == 100 * 6 * per_layer
    assert kv.slot_bytes(10_000) == 10_000 * per_layer + kv.window_positions * 5 * per_layer
