"""config.resolve: flags + environment -> AppConfig, and the errors users see."""

from __future__ import annotations

import logging

import pytest
import typer

from mlxcel_py.cli.common import fail, resolve_or_exit
from mlxcel_py.config import (
    ConfigError,
    ResolvedChunk,
    prefill_chunk_override,
    resolve,
    resolve_prefill_chunk_size,
    startup_summary,
)
from mlxcel_py.engine import MAX_TOKENS_LIMIT
from mlxcel_py.engine.chunking.fixed import PrefillChunkPolicy
from mlxcel_py.errors import ConfigError
from mlxcel_py.logs import setup_logging

from config_helpers import flags_for, reset_prefill_chunk_override


@pytest.fixture(autouse=True)
def _fresh_override():
    reset_prefill_chunk_override()
    yield
    reset_prefill_chunk_override()


def policy_of(cfg) -> tuple[int, int]:
    return cfg.engine.policy.alone, cfg.engine.policy.contended


# --- the prefill chunk ------------------------------------------------------------


def test_no_flag_gives_the_two_state_policy():
    cfg = resolve("serve", env={})
    assert cfg.chunk == ResolvedChunk(None, False, "default")
    assert cfg.engine.policy == PrefillChunkPolicy(2048, 512)
    assert "prefill_chunk_size alone=2048 contended=512" in startup_summary(cfg)


def test_explicit_2048_conflicting_with_batch_size_is_explicit_and_warns(caplog):
    with caplog.at_level(logging.WARNING, logger="mlxcel_py.config"):
        cfg = resolve("serve", flags_for("serve", prefill_chunk_size=2048, batch_size=1024), env={})
    assert cfg.chunk.explicit == 2048 and cfg.chunk.conflict
    assert policy_of(cfg) == (2048, 2048)
    assert [r.getMessage() for r in caplog.records] == [
        "--prefill-chunk-size 2048 and --batch-size 1024 differ; using 2048"
    ]


def test_equal_flag_and_batch_size_is_no_conflict():
    assert resolve_prefill_chunk_size(1024, 1024, {}) == ResolvedChunk(1024, False, "--prefill-chunk-size")


def test_batch_size_alone_is_the_chunk():
    cfg = resolve("serve", flags_for("serve", batch_size=1024), env={})
    assert policy_of(cfg) == (1024, 1024)
    assert "prefill_chunk_size explicit=1024 (alone and contended) via --batch-size" in startup_summary(cfg)


def test_llama_arg_batch_acts_as_batch_size():
    cfg = resolve("serve", env={"LLAMA_ARG_BATCH": "256"})
    assert cfg.chunk == ResolvedChunk(256, False, "LLAMA_ARG_BATCH") and policy_of(cfg) == (256, 256)


def test_llama_arg_batch_conflicts_with_the_flag(caplog):
    with caplog.at_level(logging.WARNING, logger="mlxcel_py.config"):
        chunk = resolve_prefill_chunk_size(512, None, {"LLAMA_ARG_BATCH": "256"})
    assert chunk == ResolvedChunk(512, True, "--prefill-chunk-size")
    assert "LLAMA_ARG_BATCH 256" in caplog.text


def test_garbage_llama_arg_batch_is_an_error():
    with pytest.raises(ConfigError, match=r"LLAMA_ARG_BATCH must be a non-negative integer \(got 'x'\)"):
        resolve_prefill_chunk_size(None, None, {"LLAMA_ARG_BATCH": "x"})


def test_mlxcel_prefill_chunk_overrides_both_states(monkeypatch):
    monkeypatch.setenv("MLXCEL_PREFILL_CHUNK", "1024")
    reset_prefill_chunk_override()
    cfg = resolve("serve")
    assert cfg.chunk == ResolvedChunk(1024, False, "MLXCEL_PREFILL_CHUNK")
    assert policy_of(cfg) == (1024, 1024)


def test_flag_beats_the_env_override(monkeypatch):
    monkeypatch.setenv("MLXCEL_PREFILL_CHUNK", "1024")
    monkeypatch.setenv("LLAMA_ARG_BATCH", "256")
    assert policy_of(resolve("serve", flags_for("serve", prefill_chunk_size=4096))) == (4096, 4096)
    assert policy_of(resolve("serve")) == (256, 256)  # LLAMA_ARG_BATCH is --batch-size


def test_override_tolerates_whitespace(monkeypatch):
    monkeypatch.setenv("MLXCEL_PREFILL_CHUNK", " 1024 ")
    assert prefill_chunk_override() == 1024


def test_zero_pins_both_states_to_no_chunking(monkeypatch):
    monkeypatch.setenv("MLXCEL_PREFILL_CHUNK", "0")
    assert policy_of(resolve("serve")) == (0, 0)
    assert policy_of(resolve("serve", flags_for("serve", prefill_chunk_size=0), env={})) == (0, 0)


@pytest.mark.parametrize("raw", ["abc", "-5", "1.5", "+3", "12x"])
def test_garbage_override_warns_once_and_counts_as_unset(monkeypatch, caplog, raw):
    monkeypatch.setenv("MLXCEL_PREFILL_CHUNK", raw)
    with caplog.at_level(logging.WARNING, logger="mlxcel_py.config"):
        assert prefill_chunk_override() is None
        assert policy_of(resolve("serve")) == (2048, 512)
    assert len(caplog.records) == 1
    assert repr(raw) in caplog.records[0].getMessage()


def test_override_is_read_once_per_process(monkeypatch):
    monkeypatch.setenv("MLXCEL_PREFILL_CHUNK", "300")
    assert prefill_chunk_override() == 300
    monkeypatch.setenv("MLXCEL_PREFILL_CHUNK", "400")
    assert prefill_chunk_override() == 300
    reset_prefill_chunk_override()
    assert prefill_chunk_override() == 400


def test_unset_or_empty_override_is_the_default(monkeypatch, caplog):
    assert prefill_chunk_override() is None and policy_of(resolve("serve")) == (2048, 512)
    monkeypatch.setenv("MLXCEL_PREFILL_CHUNK", "  ")
    reset_prefill_chunk_override()
    assert prefill_chunk_override() is None and not caplog.records


# --- per-command defaults ---------------------------------------------------------


def test_serve_defaults_are_llama_servers():
    cfg = resolve("serve", env={})
    s = cfg.sampling
    assert (s.temperature, s.top_k, s.top_p, s.min_p, s.repetition_penalty) == (0.8, 40, 0.95, 0.05, 1.0)
    assert s.max_tokens == MAX_TOKENS_LIMIT and s.seed is None
    assert (cfg.engine.num_slots, cfg.engine.ctx_size, cfg.engine.max_queue) == (4, None, 64)
    assert cfg.server is not None and (cfg.server.host, cfg.server.port, cfg.server.api_key) == ("127.0.0.1", 8080, None)
    assert cfg.model.path is None and cfg.blas == "auto" and cfg.engine.prompt_cache.enabled


@pytest.mark.parametrize(("command", "max_tokens"), [("run", 4096), ("generate", 256)])
def test_run_and_generate_are_one_greedy_slot(command, max_tokens):
    cfg = resolve(command, flags_for(command, parallel=1), env={"LLAMA_ARG_N_PARALLEL": "8"})
    s = cfg.sampling
    assert (s.temperature, s.top_k, s.top_p, s.min_p) == (0.0, 0, 1.0, 0.0) and s.greedy
    assert s.max_tokens == max_tokens
    assert cfg.engine.num_slots == 1 and cfg.server is None


def test_bench_is_like_serve():
    cfg = resolve("bench", env={})
    assert cfg.engine.num_slots == 4 and cfg.sampling.temperature == 0.8 and cfg.server is not None


def test_serve_reads_llama_server_env():
    env = {
        "LLAMA_ARG_N_PARALLEL": "8",
        "LLAMA_ARG_CTX_SIZE": "8192",
        "LLAMA_ARG_HOST": "0.0.0.0",
        "LLAMA_ARG_PORT": "9000",
        "MLXCEL_API_KEY": "secret",
        "MLXCEL_BLAS": "off",
    }
    cfg = resolve("serve", env=env)
    assert (cfg.engine.num_slots, cfg.engine.ctx_size) == (8, 8192)
    assert (cfg.server.host, cfg.server.port, cfg.server.api_key) == ("0.0.0.0", 9000, "secret")
    assert cfg.blas == "off"
    flags = resolve("serve", flags_for("serve", parallel=2, ctx_size=1024, host="::1", port=0, api_key="k"), env=env)
    assert (flags.engine.num_slots, flags.engine.ctx_size) == (2, 1024)
    assert (flags.server.host, flags.server.port, flags.server.api_key) == ("::1", 0, "k")


def test_flags_override_sampling_defaults():
    cfg = resolve("generate", flags_for("generate", temp=0.7, top_p=0.9, top_k=20, min_p=0.1, repeat_penalty=1.1,
                                        seed=3, max_tokens=9))
    s = cfg.sampling
    assert (s.temperature, s.top_p, s.top_k, s.min_p, s.repetition_penalty, s.seed, s.max_tokens) == (
        0.7, 0.9, 20, 0.1, 1.1, 3, 9,
    )


def test_prompt_cache_settings():
    cfg = resolve("serve", flags_for("serve", prompt_cache=False, cache_max_bytes=0, cache_max_entries=2,
                                     cache_min_prefix=8), env={})
    cache = cfg.engine.prompt_cache
    assert (cache.enabled, cache.max_bytes, cache.max_entries, cache.min_prefix) == (False, 0, 2, 8)


# --- the ITL budget ---------------------------------------------------------------


@pytest.mark.parametrize("command", ["serve", "run", "generate", "bench"])
def test_itl_budget_is_off_by_default_and_resolved_from_flag_or_env(command):
    assert resolve(command, env={}).engine.itl_budget_ms is None
    assert resolve(command, flags_for(command, itl_budget_ms=300), env={}).engine.itl_budget_ms == 300
    assert resolve(command, env={"MLXCEL_ITL_BUDGET_MS": " 250 "}).engine.itl_budget_ms == 250
    assert resolve(command, flags_for(command, itl_budget_ms=300),
                   env={"MLXCEL_ITL_BUDGET_MS": "250"}).engine.itl_budget_ms == 300
    assert resolve(command, env={"MLXCEL_ITL_BUDGET_MS": ""}).engine.itl_budget_ms is None


def test_itl_budget_keeps_the_two_state_policy_as_the_fallback_and_warns_nothing(caplog):
    with caplog.at_level(logging.WARNING, logger="mlxcel_py.config"):
        cfg = resolve("serve", flags_for("serve", itl_budget_ms=300), env={})
    # The engine starts on 2048/512 and switches to the budget policy once calibrated.
    assert cfg.engine.policy == PrefillChunkPolicy(2048, 512) and cfg.chunk.explicit is None
    assert "itl_budget_ms 300" in startup_summary(cfg)
    assert "itl_budget_ms off" in startup_summary(resolve("serve", env={}))
    assert caplog.records == []


@pytest.mark.parametrize(
    ("kwargs", "env", "warning"),
    [
        ({"prefill_chunk_size": 512, "itl_budget_ms": 300}, {},
         "--itl-budget-ms 300 is ignored: --prefill-chunk-size pins the prefill chunk to 512"),
        ({"batch_size": 1024}, {"MLXCEL_ITL_BUDGET_MS": "300"},
         "MLXCEL_ITL_BUDGET_MS 300 is ignored: --batch-size pins the prefill chunk to 1024"),
        ({"itl_budget_ms": 300}, {"LLAMA_ARG_BATCH": "256"},
         "--itl-budget-ms 300 is ignored: LLAMA_ARG_BATCH pins the prefill chunk to 256"),
        ({"itl_budget_ms": 300}, {"MLXCEL_PREFILL_CHUNK": "0"},
         "--itl-budget-ms 300 is ignored: MLXCEL_PREFILL_CHUNK pins the prefill chunk to 0"),
    ],
)
def test_an_explicit_chunk_wins_over_the_budget_with_a_warning(caplog, kwargs, env, warning):
    with caplog.at_level(logging.WARNING, logger="mlxcel_py.config"):
        cfg = resolve("serve", flags_for("serve", **kwargs), env=env)
    assert cfg.engine.itl_budget_ms is None and cfg.chunk.explicit is not None
    assert policy_of(cfg) == (cfg.chunk.explicit, cfg.chunk.explicit)
    assert [r.getMessage() for r in caplog.records] == [warning]


# --- errors -----------------------------------------------------------------------

ERRORS = [
    ("serve", {"parallel": 0}, "--parallel must be between 1 and 64 (got 0)"),
    ("serve", {"parallel": 65}, "--parallel must be between 1 and 64 (got 65)"),
    ("run", {"parallel": 4}, "--parallel applies to serve and bench; run uses one slot (got 4)"),
    ("serve", {"ctx_size": 10}, "--ctx-size must be at least 64 (got 10)"),
    ("serve", {"port": 70000}, "--port must be between 0 and 65535 (got 70000)"),
    ("serve", {"max_queue": 0}, "--max-queue must be at least 1 (got 0)"),
    ("serve", {"max_tokens": 0}, "--max-tokens must be at least 1 (got 0)"),
    ("serve", {"max_tokens": 2_000_000}, "--max-tokens must be between 1 and 1000000 (got 2000000)"),
    ("serve", {"prefill_chunk_size": 2_000_000}, "--prefill-chunk-size must be between 0 and 1048576 (got 2000000)"),
    ("serve", {"prefill_chunk_size": -1}, "--prefill-chunk-size must be a non-negative integer (got -1)"),
    ("serve", {"batch_size": -2}, "--batch-size must be a non-negative integer (got -2)"),
    ("serve", {"cache_max_bytes": -1}, "--cache-max-bytes must be at least 0 (got -1)"),
    ("serve", {"cache_max_entries": -1}, "--cache-max-entries must be at least 0 (got -1)"),
    ("serve", {"cache_min_prefix": -1}, "--cache-min-prefix must be at least 0 (got -1)"),
    ("serve", {"temp": -1.0}, "--temp must be between 0 and 100 (got -1.0)"),
    ("serve", {"top_p": 0.0}, "--top-p must be in (0, 1] (got 0.0)"),
    ("serve", {"top_k": -1}, "--top-k must be between 0 and 1000000 (got -1)"),
    ("serve", {"min_p": 2.0}, "--min-p must be between 0 and 1 (got 2.0)"),
    ("serve", {"repeat_penalty": 0.0}, "--repeat-penalty must be in (0, 10] (got 0.0)"),
    ("serve", {"seed": -1}, "--seed must be a non-negative integer (got -1)"),
    ("serve", {"api_key": ""}, "--api-key must not be empty (omit it to disable authentication)"),
    ("serve", {"log_level": "loud"}, "--log-level must be one of debug, info, warning, error, critical (got 'loud')"),
    ("serve", {"model": " "}, "--model must not be empty (omit it to use the embedded default model)"),
    ("generate", {"port": 8000}, "--host, --port and --api-key apply to serve and bench, not generate"),
    ("serve", {"itl_budget_ms": 0}, "--itl-budget-ms must be between 1 and 600000 (got 0)"),
    ("run", {"itl_budget_ms": -5}, "--itl-budget-ms must be between 1 and 600000 (got -5)"),
    ("serve", {"itl_budget_ms": 700_000, "prefill_chunk_size": 512},
     "--itl-budget-ms must be between 1 and 600000 (got 700000)"),
]


@pytest.mark.parametrize(("command", "kwargs", "message"), ERRORS)
def test_bad_values_name_the_flag(command, kwargs, message):
    with pytest.raises(ConfigError) as info:
        resolve(command, flags_for(command, **kwargs), env={})
    assert str(info.value) == message


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"LLAMA_ARG_PORT": "http"}, "LLAMA_ARG_PORT must be a non-negative integer (got 'http')"),
        ({"LLAMA_ARG_PORT": "99999"}, "LLAMA_ARG_PORT must be between 0 and 65535 (got 99999)"),
        ({"LLAMA_ARG_N_PARALLEL": "0"}, "LLAMA_ARG_N_PARALLEL must be between 1 and 64 (got 0)"),
        ({"LLAMA_ARG_CTX_SIZE": "32"}, "LLAMA_ARG_CTX_SIZE must be at least 64 (got 32)"),
        ({"MLXCEL_PREFILL_CHUNK": "2000000"}, "MLXCEL_PREFILL_CHUNK must be between 0 and 1048576 (got 2000000)"),
        ({"MLXCEL_ITL_BUDGET_MS": "300ms"}, "MLXCEL_ITL_BUDGET_MS must be a non-negative integer (got '300ms')"),
        ({"MLXCEL_ITL_BUDGET_MS": "0"}, "MLXCEL_ITL_BUDGET_MS must be between 1 and 600000 (got 0)"),
    ],
)
def test_bad_env_values_name_the_variable(env, message):
    with pytest.raises(ConfigError) as info:
        resolve("serve", env=env)
    assert str(info.value) == message


# --- the CLI helpers --------------------------------------------------------------


def test_resolve_or_exit_prints_one_line_and_exits_2(capsys):
    with pytest.raises(typer.Exit) as info:
        resolve_or_exit("serve", flags_for("serve", temp=-1.0), env={})
    assert info.value.exit_code == 2
    assert capsys.readouterr().err == "error: --temp must be between 0 and 100 (got -1.0)\n"


def test_fail_prints_brackets_literally(capsys):
    with pytest.raises(typer.Exit) as info:
        fail("top_p must be in (0, 1] [bold]x[/bold]")
    assert info.value.exit_code == 1
    assert capsys.readouterr().err == "error: top_p must be in (0, 1] [bold]x[/bold]\n"


def test_setup_logging_installs_one_rich_handler():
    from rich.logging import RichHandler

    logger = logging.getLogger("mlxcel_py")
    before, level = list(logger.handlers), logger.level
    try:
        setup_logging("debug")
        setup_logging("warning")
        ours = [h for h in logger.handlers if isinstance(h, RichHandler)]
        assert len(ours) == 1 and logger.level == logging.WARNING
        with pytest.raises(ConfigError, match="unknown log level 'loud'"):
            setup_logging("loud")
    finally:
        logger.handlers[:] = before
        logger.setLevel(level)


@pytest.mark.parametrize("command", ["serve", "run", "generate"])
def test_threads_flag_then_llama_env_then_every_core(command):
    assert resolve(command, env={}).model.threads is None  # every core
    assert resolve(command, env={"LLAMA_ARG_THREADS": "1"}).model.threads == 1
    assert resolve(command, flags_for(command, threads=2), env={"LLAMA_ARG_THREADS": "1"}).model.threads == 2
    with pytest.raises(ConfigError, match=r"--threads must be between 1 and 1024 \(got 0\)"):
        resolve(command, flags_for(command, threads=0), env={})
    with pytest.raises(ConfigError, match=r"LLAMA_ARG_THREADS must be a non-negative integer"):
        resolve(command, env={"LLAMA_ARG_THREADS": "many"})
    assert "threads 2" in startup_summary(resolve(command, flags_for(command, threads=2), env={}))


def test_lookup_ngram_and_draft_bounds_resolve_from_flags_and_env():
    from mlxcel_py.engine.core.drafting import DraftConfig

    assert resolve("serve", env={}).engine.drafting == DraftConfig(0, 16, 0)
    assert not resolve("serve", env={}).engine.drafting.enabled
    cfg = resolve("serve", env={"MLXCEL_LOOKUP_NGRAM": "3", "LLAMA_ARG_DRAFT_MAX": "8", "LLAMA_ARG_DRAFT_MIN": "2"})
    assert cfg.engine.drafting == DraftConfig(3, 8, 2)
    assert resolve("generate", flags_for("generate", lookup_ngram=2, draft_max=4),
                   env={"LLAMA_ARG_DRAFT_MAX": "8"}).engine.drafting == DraftConfig(2, 4, 0)
    assert "lookup_ngram 3 draft_model none draft_max 8 draft_min 2" in startup_summary(cfg)
    with pytest.raises(ConfigError, match="--draft-min 9 exceeds --draft-max 8"):
        resolve("serve", flags_for("serve", lookup_ngram=3, draft_max=8, draft_min=9), env={})
    with pytest.raises(ConfigError, match="--draft-max must be between 1 and 256"):
        resolve("serve", flags_for("serve", draft_max=0), env={})
