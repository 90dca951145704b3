"""PrefillPlan arithmetic: resumed plan == suffix of the cold plan, cache hit == miss."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlxcel_py.engine.plan import (
    CONTENDED_PREFILL_CHUNK,
    DEFAULT_PREFILL_CHUNK,
    PlanCaps,
    PrefillChunkPolicy,
    PrefillPlan,
)

PADDED = PlanCaps(padded=True, align=True, tile=64)


def suffix(plan: PrefillPlan, cursor: int):
    return tuple(p for p in plan.pieces() if p.start >= cursor)


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
    cold = PrefillPlan.with_prefix(8192, 0, None, 512, PlanCaps())
    assert cold.ranges()[:2] == ((0, 512), (512, 1024))
    resumed = PrefillPlan.resume_at(8192, 0, None, 1024, 2048, PlanCaps())
    assert resumed.ranges() == ((1024, 3072), (3072, 5120), (5120, 7168), (7168, 8192))
    assert resumed.chunk() == 2048


def test_continuation_that_fits_one_chunk_still_reports_the_chunk():
    resumed = PrefillPlan.resume_at(3000, 0, None, 2048, 2048, PlanCaps())
    assert resumed.ranges() == ((2048, 3000),)
    assert resumed.chunk() == 2048
    assert resumed.adopted() == 0 and resumed.forwarded_len() == 3000


def test_chunk_zero_is_one_piece():
    plan = PrefillPlan.with_prefix(5000, 0, None, 0, PlanCaps())
    assert plan.ranges() == ((0, 5000),) and plan.chunk() is None
    assert PrefillPlan.resume_at(5000, 0, None, 0, 0, PlanCaps()).ranges() == ((0, 5000),)


def test_prompt_shorter_than_the_chunk_is_one_piece():
    plan = PrefillPlan.with_prefix(300, 0, None, 512, PlanCaps())
    assert plan.ranges() == ((0, 300),) and plan.chunk() is None
    assert plan.split_points() == ()
    (piece,) = plan.pieces()
    assert plan.is_terminal(piece) and piece.terminal


def test_embedding_input_is_never_split():
    caps = PlanCaps(token_input=False)
    assert PrefillPlan.with_prefix(5000, 0, None, 512, caps).ranges() == ((0, 5000),)
    resumed = PrefillPlan.resume_at(5000, 0, 1000, 1000, 512, caps)
    assert resumed.ranges() == ((1000, 5000),) and resumed.chunk() is None


@pytest.mark.parametrize("chunk", [0, 7, 512, 2048, 100_000])
@pytest.mark.parametrize("caps", [PlanCaps(), PADDED])
def test_boundary_segment_is_one_unpadded_piece(chunk, caps):
    plan = PrefillPlan.with_prefix(5000, 100, 3000, chunk, caps)
    first = plan.pieces()[0]
    assert (first.start, first.end, first.num_pad) == (100, 3000, 0)
    assert first.padded_len == 2900 and plan.ends_at_boundary(first) and not plan.is_terminal(first)
    assert plan.boundary() == 3000 and plan.adopted() == 100
    assert not any(plan.ends_at_boundary(p) for p in plan.pieces()[1:])


def test_boundary_outside_the_forwarded_range_is_ignored():
    assert PrefillPlan.with_prefix(1000, 500, 500, 512, PlanCaps()).boundary() is None
    assert PrefillPlan.with_prefix(1000, 0, 1000, 512, PlanCaps()).boundary() is None


def test_padding_rounds_up_to_the_tile():
    (piece,) = PrefillPlan.with_prefix(100, 0, None, 512, PADDED).pieces()
    assert (piece.length, piece.padded_len, piece.num_pad) == (100, 128, 28)
    # Padding needs both the model's support and the request for alignment.
    (plain,) = PrefillPlan.with_prefix(100, 0, None, 512, PlanCaps(padded=True)).pieces()
    assert plain.padded_len == 100


def test_adopted_is_clamped_and_a_full_hit_has_no_pieces():
    plan = PrefillPlan.with_prefix(100, 500, None, 512, PlanCaps())
    assert plan.pieces() == () and plan.adopted() == 100 and plan.forwarded_len() == 0
    assert PrefillPlan.resume_at(100, 0, None, 100, 512, PlanCaps()).pieces() == ()


def test_resume_before_the_adopted_prefix_is_with_prefix():
    cold = PrefillPlan.with_prefix(5000, 1000, 2000, 512, PADDED)
    assert PrefillPlan.resume_at(5000, 1000, 2000, 0, 512, PADDED) == cold
    assert PrefillPlan.resume_at(5000, 1000, 2000, 1000, 512, PADDED) == cold


@pytest.mark.parametrize(
    ("cursor", "message"), [(5001, "past the end"), (1500, "inside the history-boundary segment")]
)
def test_resume_rejects_bad_cursors(cursor, message):
    with pytest.raises(ValueError, match=message):
        PrefillPlan.resume_at(5000, 1000, 2000, cursor, 512, PlanCaps())


@pytest.mark.parametrize("bad", [{"prompt_len": -1}, {"adopted": -1}, {"chunk": -1}, {"boundary": -5}])
def test_negative_inputs_are_rejected(bad):
    args = {"prompt_len": 100, "adopted": 0, "boundary": None, "chunk": 512, "caps": PlanCaps()} | bad
    with pytest.raises(ValueError, match="must be a non-negative integer"):
        PrefillPlan.with_prefix(**args)


def test_cache_hit_reproduces_the_miss_only_from_a_split_point():
    cold = PrefillPlan.with_prefix(5000, 0, None, 2048, PADDED)
    assert cold.split_points() == (2048, 4096)
    hit = PrefillPlan.with_prefix(5000, 2048, None, 2048, PADDED)
    assert hit.reproduces(cold)
    near = PrefillPlan.with_prefix(5000, 2000, None, 2048, PADDED)
    assert not near.reproduces(cold)
    assert not hit.reproduces(PrefillPlan.with_prefix(5001, 0, None, 2048, PADDED))


def test_cache_hit_at_the_history_boundary_reproduces_the_miss():
    cold = PrefillPlan.with_prefix(5000, 0, 1500, 2048, PlanCaps())
    hit = PrefillPlan.with_prefix(5000, 1500, 1500, 2048, PlanCaps())
    assert hit.boundary() is None and hit.reproduces(cold)


@pytest.mark.parametrize("chunk", [512, 2048])
@pytest.mark.parametrize("boundary", [None, 1300])
@pytest.mark.parametrize("caps", [PlanCaps(), PADDED], ids=["unpadded", "padded"])
def test_resume_equals_the_cold_suffix_at_every_split_point(chunk, boundary, caps):
    cold = PrefillPlan.with_prefix(8000, 100, boundary, chunk, caps)
    assert cold.split_points()
    for cursor in (cold.adopted(), *cold.split_points(), cold.prompt_len):
        resumed = PrefillPlan.resume_at(8000, 100, boundary, cursor, chunk, caps)
        assert resumed.pieces() == suffix(cold, cursor)
        assert (resumed.adopted(), resumed.boundary(), resumed.forwarded_len()) == (
            cold.adopted(),
            cold.boundary(),
            cold.forwarded_len(),
        )


# --- properties ----------------------------------------------------------------

CHUNKS = st.sampled_from([0, 1, 7, 64, 512, 1000, 2048, 4096, 100_000])
CAPS = st.builds(
    PlanCaps,
    chunked=st.booleans(),
    padded=st.booleans(),
    align=st.booleans(),
    tile=st.sampled_from([1, 16, 64, 128]),
    token_input=st.booleans(),
)


@st.composite
def plans(draw):
    prompt_len = draw(st.integers(1, 20_000))
    adopted = draw(st.integers(0, prompt_len + 10))
    boundary = draw(st.none() | st.integers(0, prompt_len + 10))
    return prompt_len, adopted, boundary, draw(CHUNKS), draw(CAPS)


@settings(max_examples=300, deadline=None)
@given(plans())
def test_pieces_cover_the_forwarded_range_contiguously(args):
    prompt_len, adopted, boundary, chunk, caps = args
    plan = PrefillPlan.with_prefix(*args)
    pieces = plan.pieces()
    assert sum(p.length for p in pieces) == plan.forwarded_len() == prompt_len - min(adopted, prompt_len)
    starts = [plan.adopted()] + [p.end for p in pieces[:-1]]
    assert [p.start for p in pieces] == starts[: len(pieces)]
    assert all(p.length > 0 for p in pieces)
    if pieces:
        assert pieces[-1].end == prompt_len and plan.is_terminal(pieces[-1])
    for piece in pieces:
        capped = chunk == 0 or plan.chunk() is None or plan.ends_at_boundary(piece)
        assert capped or piece.length <= chunk
        padding = caps.align and caps.padded and not piece.ends_at_boundary
        assert piece.num_pad == piece.padded_len - piece.length >= 0
        assert piece.padded_len % caps.tile == 0 if padding else piece.num_pad == 0


@settings(max_examples=300, deadline=None)
@given(plans())
def test_resume_at_any_split_point_is_the_cold_suffix(args):
    prompt_len, adopted, boundary, chunk, caps = args
    cold = PrefillPlan.with_prefix(*args)
    for cursor in (0, cold.adopted(), *cold.split_points()[:50], prompt_len):
        resumed = PrefillPlan.resume_at(prompt_len, adopted, boundary, cursor, chunk, caps)
        assert resumed.pieces() == suffix(cold, cursor)
        assert resumed.forwarded_len() == cold.forwarded_len()


@settings(max_examples=200, deadline=None)
@given(plans(), CHUNKS, st.data())
def test_a_changed_chunk_mid_prefill_still_covers_the_rest(args, new_chunk, data):
    prompt_len, adopted, boundary, chunk, caps = args
    cold = PrefillPlan.with_prefix(*args)
    cursor = data.draw(st.sampled_from((cold.adopted(), *cold.split_points()[:50], prompt_len)))
    resumed = PrefillPlan.resume_at(prompt_len, adopted, boundary, cursor, new_chunk, caps)
    pieces = resumed.pieces()
    if cursor > cold.adopted():
        assert sum(p.length for p in pieces) == prompt_len - cursor
        assert all(new_chunk == 0 or resumed.chunk() is None or p.length <= new_chunk for p in pieces)
