"""Draft-model speculative decoding (--draft-model) on the tiny models: the tiny model drafting
for itself (every draft accepted), a random-weight draft with the same tokenizer (nearly every
draft rejected), and a draft model beside prompt lookup all give greedy output token-identical
to plain decoding, alone and batched, on a prompt-cache hit and a miss; sampling with a seed
is reproducible."""

import random

import pytest

from mlxcel_py.config import resolve
from mlxcel_py.engine import Request, SamplingParams, build_engine

from test_speculative import copy_prompt, greedy, prompt, run
from config_helpers import flags_for
from tiny import tiny_model


@pytest.fixture(scope="module")
def lm():
    return tiny_model()


@pytest.fixture(scope="module")
def stranger():
    return tiny_model(seed=1)  # same vocabulary, other random weights: its drafts are rarely the target's


def engine_for(lm, draft, parallel=4, ngram=None, **kw):
    cfg = resolve("serve", flags_for("serve", parallel=parallel, lookup_ngram=ngram, **kw), env={}).engine
    engine = build_engine(cfg, lm, draft=draft)
    # The draft gate would stop a self-draft once it measures its cost (it must), making the counts
    # below depend on the machine's timing; it has its own exact tests (tests/test_drafting.py).
    engine.scheduler.gate = None
    return engine


def requests_for(lm):
    rng = random.Random(5)
    free = tuple(rng.randrange(5, 300) for _ in range(19))
    return [greedy("copy", copy_prompt(lm), 40), greedy("a", prompt(30, 1), 36), greedy("b", free, 29)]


@pytest.mark.parametrize("parallel", [1, 4])
def test_self_drafting_is_token_identical_and_accepts_drafts(lm, parallel):
    requests = requests_for(lm)
    plain = run(engine_for(lm, None, parallel), requests)
    spec = run(engine_for(lm, lm, parallel, draft_max=6), requests)
    for rid in plain:
        assert spec[rid][0] == plain[rid][0], rid
        timings = spec[rid][1].timings
        assert timings.draft_n > 0 and timings.draft_n_accepted == timings.draft_n, rid  # its own greedy choice


@pytest.mark.parametrize("parallel", [1, 4])
def test_a_random_draft_is_rejected_and_changes_nothing(lm, stranger, parallel):
    requests = requests_for(lm)
    plain = run(engine_for(lm, None, parallel), requests)
    spec = run(engine_for(lm, stranger, parallel, draft_max=4), requests)
    drafted = accepted = 0
    for rid in plain:
        assert spec[rid][0] == plain[rid][0], rid
        drafted += spec[rid][1].timings.draft_n
        accepted += spec[rid][1].timings.draft_n_accepted
    assert drafted > 0 and accepted < drafted / 2


def test_lookup_and_draft_model_together(lm, stranger):
    requests = requests_for(lm)
    plain = run(engine_for(lm, None, 4), requests)
    for draft in (lm, stranger):
        spec = run(engine_for(lm, draft, 4, ngram=3, draft_max=8), requests)
        assert {rid: toks for rid, (toks, _) in spec.items()} == {rid: toks for rid, (toks, _) in plain.items()}
        assert spec["copy"][1].timings.draft_n_accepted > 0


def test_a_prompt_cache_hit_drafts_like_the_miss(lm):
    first = greedy("first", copy_prompt(lm), 24)
    again = greedy("again", copy_prompt(lm) + (5, 6, 7), 40)
    miss = run(engine_for(lm, None, 1), [again])
    engine = engine_for(lm, lm, 1, cache_min_prefix=8)
    run(engine, [first])
    hit = run(engine, [again])
    assert hit["again"][1].usage.cached_tokens > 0
    assert hit["again"][0] == miss["again"][0]
    assert hit["again"][1].timings.draft_n_accepted == hit["again"][1].timings.draft_n > 0


def test_sampling_with_a_seed_is_reproducible(lm, stranger):
    requests = [Request("s", copy_prompt(lm), SamplingParams(max_tokens=30, ignore_eos=True, temperature=0.7,
                                                              seed=11))]
    one = run(engine_for(lm, stranger, 1), requests)["s"]
    two = run(engine_for(lm, stranger, 1), requests)["s"]
    assert one[0] == two[0] and len(one[0]) == 30
    assert one[1].timings.draft_n > 0


def test_an_aborted_row_leaves_the_draft_batch_in_step(lm):
    requests = requests_for(lm)
    engine = engine_for(lm, lm, 4, draft_max=4)
    for r in requests:
        engine.add_request(r)
    for _ in range(6):
        engine.step()
    engine.abort("a")
    out = {}
    for _ in range(5000):
        if not engine.has_work():
            break
        for e in engine.step():
            if getattr(e, "token_id", None) is not None:
                out.setdefault(e.request_id, []).append(e.token_id)
    plain = run(engine_for(lm, None, 4), [r for r in requests if r.request_id != "a"])
    for rid in ("copy", "b"):
        assert plain[rid][0][-len(out[rid]):] == out[rid]  # the tail after the abort equals plain decoding


def test_generate_with_a_draft_model_prints_the_plain_text(lm, monkeypatch):
    from typer.testing import CliRunner

    from mlxcel_py.cli.app import app

    monkeypatch.setattr("mlxcel_py.models.load_model", lambda spec, **kwargs: lm)
    monkeypatch.setattr("mlxcel_py.models.draft.load_model", lambda spec, **kwargs: lm)
    args = ["generate", "--model", "tiny.gguf", "--raw", "Hello world", "-n", "24"]
    plain = CliRunner().invoke(app, args)
    drafted = CliRunner().invoke(app, args + ["-md", "tiny.gguf", "--draft-max", "4"])
    assert plain.exit_code == drafted.exit_code == 0, drafted.output
    assert drafted.stdout == plain.stdout and plain.stdout.strip()


def test_a_draft_with_another_vocabulary_is_one_line_and_exit_1(lm, monkeypatch):
    from typer.testing import CliRunner

    from mlxcel_py.cli.app import app
    from gguf_fixtures import FIXTURES

    monkeypatch.setattr("mlxcel_py.models.load_model", lambda spec, **kwargs: lm)
    other = str(FIXTURES / "qwen2-f16.gguf")
    result = CliRunner().invoke(app, ["generate", "--model", "tiny.gguf", "-md", other, "--raw", "Hi", "-n", "2"])
    assert result.exit_code == 1
    line = result.stderr.strip()
    assert "\n" not in line and "--draft-model" in line and "another vocabulary" in line, line


def test_the_resolver_names_the_draft_flag_and_its_variable():
    from mlxcel_py.errors import ConfigError

    assert resolve("serve", env={"LLAMA_ARG_MODEL_DRAFT": "d.gguf"}).model.draft == "d.gguf"
    assert resolve("generate", flags_for("generate", draft_model="x.gguf"),
                   env={"LLAMA_ARG_MODEL_DRAFT": "d.gguf"}).model.draft == "x.gguf"
    with pytest.raises(ConfigError, match="--draft-model cannot be used with --distributed"):
        resolve("serve", flags_for("serve", draft_model="d.gguf", distributed="Tensor"),
                env={"OMPI_COMM_WORLD_SIZE": "2"})
    with pytest.raises(ConfigError, match="--draft-model must not be empty"):
        resolve("serve", flags_for("serve", draft_model=" "), env={})


def test_serve_loads_the_draft_after_the_target_and_a_missing_one_is_one_line(lm, monkeypatch):
    from typer.testing import CliRunner

    from mlxcel_py.cli.app import app

    monkeypatch.setattr("mlxcel_py.models.load_model", lambda spec, **kwargs: lm)
    result = CliRunner().invoke(app, ["serve", "--port", "0", "-md", "/nonexistent/draft.gguf"])
    assert result.exit_code == 1
    assert result.stderr.splitlines()[-1] == "error: model path not found: /nonexistent/draft.gguf"
