"""Prefill arithmetic: a resumed prefill == the suffix of the cold one, cache hit == miss.

The scheduler asks `next_piece` for one piece per tick; iterating it at a fixed chunk is
the whole plan, so plans are compared here as lists of pieces.
"""

from __future__ import annotations

from typing import Optional

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlxcel_py.engine.chunking.fixed import CONTENDED_PREFILL_CHUNK, DEFAULT_PREFILL_CHUNK, PrefillChunkPolicy
from mlxcel_py.engine.chunking.pieces import Piece, next_piece


def plan(prompt_len: int, adopted: int, boundary: Optional[int], chunk: int, cursor: int = 0,
         unsplit: tuple[tuple[int, int], ...] = ()) -> list[Piece]:
    """Every piece from `cursor` at a fixed chunk, as the scheduler would run them."""
    pieces = []
    while (piece := next_piece(prompt_len, adopted, boundary, cursor, chunk, unsplit)) is not None:
        pieces.append(piece)
        cursor = piece.end
    return pieces


def ranges(pieces: list[Piece]) -> list[tuple[int, int]]:
    return [(p.start, p.end) for p in pieces]


def split_points(pieces: list[Piece]) -> list[int]:
    """Where a prefill can stop and resume: the starts of every piece after the first."""
    return [p.start for p in pieces[1:]]


def reproduces(hit: list[Piece], adopted: int, cold: list[Piece]) -> bool:
    """A cache hit forwards exactly the cold plan's pieces after its prefix (so its KV and logits
    are bit-identical to the miss's) when it starts at one of the cold plan's piece starts."""
    if adopted and adopted not in [p.start for p in cold]:
        return False
    return [(p.start, p.end, p.terminal) for p in hit] == [(p.start, p.end, p.terminal) for p in cold if p.start >= adopted]


# --- the chunk policy ---------------------------------------------------------


def test_policy_default_is_alone_2048_contended_512():
    policy = PrefillChunkPolicy.resolve(None)
    assert (policy.alone, policy.contended) == (DEFAULT_PREFILL_CHUNK, CONTENDED_PREFILL_CHUNK) == (2048, 512)
    assert policy.chunk(others_decoding=False) == 2048
    assert policy.chunk(others_decoding=True) == 512
    assert policy.describe() == "alone=2048 contended=512"


@pytest.mark.parametrize("explicit", [1024, 0])
def test_policy_explicit_pins_both_states(explicit):
    policy = PrefillChunkPolicy.resolve(explicit)
    assert policy.chunk(False) == policy.chunk(True) == explicit
    assert policy.describe() == f"explicit={explicit} (alone and contended)"


def test_policy_rejects_negative():
    with pytest.raises(ValueError, match="alone must be a non-negative integer"):
        PrefillChunkPolicy(-1, 512)


# --- examples -----------------------------------------------------------------


def test_resume_with_a_larger_chunk_recuts_from_the_cursor():
    assert ranges(plan(8192, 0, None, 512))[:2] == [(0, 512), (512, 1024)]
    assert ranges(plan(8192, 0, None, 2048, cursor=1024)) == [(1024, 3072), (3072, 5120), (5120, 7168), (7168, 8192)]


def test_continuation_that_fits_one_chunk_is_one_terminal_piece():
    assert next_piece(3000, 0, None, 2048, 2048) == Piece(2048, 3000, False, True)


def test_an_unsplit_range_is_never_cut():
    # a 16-token image at [5, 21) under pieces of 7: the piece before stops at it, the image is one piece
    assert ranges(plan(40, 0, None, 7, unsplit=((5, 21),))) == [(0, 5), (5, 21), (21, 28), (28, 35), (35, 40)]
    # two images: one longer than the chunk runs whole, one inside a piece is left alone; a cursor (an adopted
    # prefix) inside an image runs to its end
    assert ranges(plan(60, 0, None, 10, unsplit=((8, 30), (33, 38)))) == [(0, 8), (8, 30), (30, 40), (40, 50),
                                                                        (50, 60)]
    assert ranges(plan(40, 12, None, 4, unsplit=((5, 21),))) == [(12, 21), (21, 25), (25, 29), (29, 33),
                                                                (33, 37), (37, 40)]
    assert plan(21, 0, None, 7, unsplit=((5, 21),))[-1] == Piece(5, 21, False, True)


def test_chunk_zero_is_one_piece():
    assert ranges(plan(5000, 0, None, 0)) == [(0, 5000)]
    assert ranges(plan(5000, 0, None, 0, cursor=1000)) == [(1000, 5000)]


def test_prompt_shorter_than_the_chunk_is_one_piece():
    (piece,) = plan(300, 0, None, 512)
    assert (piece.start, piece.end, piece.terminal) == (0, 300, True)


@pytest.mark.parametrize("chunk", [0, 7, 512, 2048, 100_000])
def test_boundary_segment_is_one_piece(chunk):
    pieces = plan(5000, 100, 3000, chunk)
    first = pieces[0]
    assert (first.start, first.end, first.ends_at_boundary, first.terminal) == (100, 3000, True, False)
    assert not any(p.ends_at_boundary for p in pieces[1:])
    assert pieces[-1].end == 5000 and pieces[-1].terminal


def test_boundary_outside_the_forwarded_range_is_ignored():
    assert not plan(1000, 500, 500, 512)[0].ends_at_boundary
    assert not any(p.ends_at_boundary for p in plan(1000, 0, 1000, 512))


def test_adopted_is_clamped_and_a_full_hit_has_no_pieces():
    assert plan(100, 500, None, 512) == []
    assert next_piece(100, 0, None, 100, 512) is None


def test_a_cursor_before_the_adopted_prefix_starts_at_it():
    cold = plan(5000, 1000, 2000, 512)
    assert plan(5000, 1000, 2000, 512, cursor=0) == cold
    assert cold[0] == Piece(1000, 2000, True, False)


@pytest.mark.parametrize(("cursor", "message"), [(5001, "past the end"), (1500, "inside the history-boundary segment")])
def test_resume_rejects_bad_cursors(cursor, message):
    with pytest.raises(ValueError, match=message):
        next_piece(5000, 1000, 2000, cursor, 512)


@pytest.mark.parametrize("bad", [{"prompt_len": -1}, {"adopted": -1}, {"chunk": -1}, {"boundary": -5}, {"cursor": -1}])
def test_negative_inputs_are_rejected(bad):
    args = {"prompt_len": 100, "adopted": 0, "boundary": None, "cursor": 0, "chunk": 512} | bad
    with pytest.raises(ValueError, match="must be a non-negative integer"):
        next_piece(**args)


def test_cache_hit_reproduces_the_miss_only_from_a_split_point():
    cold = plan(5000, 0, None, 2048)
    assert split_points(cold) == [2048, 4096]
    assert reproduces(plan(5000, 2048, None, 2048), 2048, cold)
    assert not reproduces(plan(5000, 2000, None, 2048), 2000, cold)
    assert not reproduces(plan(5000, 2048, None, 2048), 2048, plan(5001, 0, None, 2048))


def test_cache_hit_at_the_history_boundary_reproduces_the_miss():
    cold = plan(5000, 0, 1500, 2048)
    hit = plan(5000, 1500, 1500, 2048)
    assert not hit[0].ends_at_boundary and reproduces(hit, 1500, cold)


@pytest.mark.parametrize("chunk", [512, 2048])
@pytest.mark.parametrize("boundary", [None, 1300])
def test_resume_equals_the_cold_suffix_at_every_split_point(chunk, boundary):
    cold = plan(8000, 100, boundary, chunk)
    assert split_points(cold)
    for cursor in (100, *split_points(cold), 8000):
        assert plan(8000, 100, boundary, chunk, cursor=cursor) == [p for p in cold if p.start >= cursor]


# --- properties ----------------------------------------------------------------

CHUNKS = st.sampled_from([0, 1, 7, 64, 512, 1000, 2048, 4096, 100_000])


@st.composite
def prompts(draw):
    prompt_len = draw(st.integers(1, 20_000))
    adopted = draw(st.integers(0, prompt_len + 10))
    boundary = draw(st.none() | st.integers(0, prompt_len + 10))
    return prompt_len, adopted, boundary, draw(CHUNKS)


@settings(max_examples=300, deadline=None)
@given(prompts())
def test_pieces_cover_the_forwarded_range_contiguously(args):
    prompt_len, adopted, boundary, chunk = args
    pieces = plan(*args)
    start = min(adopted, prompt_len)
    assert sum(p.length for p in pieces) == prompt_len - start
    assert [p.start for p in pieces] == ([start] + [p.end for p in pieces[:-1]])[: len(pieces)]
    assert all(p.length > 0 for p in pieces)
    assert [p.terminal for p in pieces] == [p.end == prompt_len for p in pieces]
    for piece in pieces:
        assert chunk == 0 or piece.ends_at_boundary or piece.length <= chunk


@settings(max_examples=300, deadline=None)
@given(prompts())
def test_resume_at_any_split_point_is_the_cold_suffix(args):
    prompt_len, adopted, boundary, chunk = args
    cold = plan(*args)
    for cursor in (0, min(adopted, prompt_len), *split_points(cold)[:50], prompt_len):
        assert plan(*args, cursor=cursor) == [p for p in cold if p.start >= cursor]


@settings(max_examples=200, deadline=None)
@given(prompts(), CHUNKS, st.data())
def test_a_changed_chunk_mid_prefill_still_covers_the_rest(args, new_chunk, data):
    prompt_len, adopted, boundary, chunk = args
    cold = plan(*args)
    start = min(adopted, prompt_len)
    cursor = data.draw(st.sampled_from((start, *split_points(cold)[:50], prompt_len)))
    pieces = plan(prompt_len, adopted, boundary, new_chunk, cursor=cursor)
    if cursor > start:
        assert sum(p.length for p in pieces) == prompt_len - cursor
        assert all(new_chunk == 0 or p.length <= new_chunk for p in pieces)
