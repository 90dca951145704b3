"""llama.cpp's sampler chain through the server: llama-server's own default request bodies accepted on
/completion and /v1/chat/completions, a chain request's tokens those of the chain run on the model's logits,
a seeded chain request the same alone and batched, `samplers` orders and Ollama's options, and the refusals."""

from __future__ import annotations

import concurrent.futures
import re

import mlx.core as mx
import numpy as np
import pytest

from server_helpers import error_of, start_server, stop_server

PROMPT_IDS = [5, 17, 42, 8, 99, 3, 61]
# What llama.cpp's web page sends (its settings' defaults), less the prompt/messages.
LLAMA_DEFAULTS = {
    "temperature": 0.8, "dynatemp_range": 0, "dynatemp_exponent": 1, "top_k": 40, "top_p": 0.95, "min_p": 0.05,
    "typical_p": 1, "xtc_probability": 0, "xtc_threshold": 0.1, "repeat_last_n": 64, "repeat_penalty": 1,
    "presence_penalty": 0, "frequency_penalty": 0, "dry_multiplier": 0, "dry_base": 1.75, "dry_allowed_length": 2,
    "dry_penalty_last_n": -1, "samplers": "edkypmxt", "timings_per_token": False, "stream": False,
    "top_n_sigma": -1, "mirostat": 0, "mirostat_tau": 5, "mirostat_eta": 0.1, "min_keep": 0,
}


@pytest.fixture(scope="module")
def srv():
    running = start_server(parallel=3)
    yield running
    stop_server(running)


def _complete(client, **body) -> dict:
    resp = client.post("/completion", json={"prompt": PROMPT_IDS, "n_predict": 6, "cache_prompt": False,
                                            "return_tokens": True, **body})
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_llama_servers_default_bodies_are_accepted(srv):
    with srv.client() as client:
        native = _complete(client, **LLAMA_DEFAULTS, seed=3)
        assert native["generation_settings"]["samplers"] == ["penalties", "dry", "top_k", "typ_p", "top_p", "min_p",
                                                              "xtc", "temperature"]
        chat = client.post("/v1/chat/completions", json={
            **LLAMA_DEFAULTS, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "seed": 3})
        assert chat.status_code == 200, chat.text


def test_a_chain_request_draws_from_the_chain_on_the_models_logits(srv):
    import dataclasses

    from mlxcel_py.engine.core.chain_params import ChainParams
    from mlxcel_py.engine.runner.sampler_chain import SamplerChain, settings_for

    model = srv.runtime.loaded.model
    row = np.array(model(mx.array([PROMPT_IDS]))[0, -1].astype(mx.float32))
    # XTC at temperature 0: the top tokens above the threshold are dropped, the last of them kept
    defaults = srv.runtime.config.sampling  # the server's top-k, top-p and min-p act in the chain too
    assert defaults.repetition_penalty == 1.0 and not defaults.logit_bias
    params = dataclasses.replace(defaults, temperature=0.0,
                                 chain=ChainParams(xtc_probability=1.0, xtc_threshold=0.002))
    want = SamplerChain(settings_for(params), np.random.default_rng(0)).sample(row)
    with srv.client() as client:
        plain = _complete(client, temperature=0, n_predict=1)["tokens"]
        got = _complete(client, temperature=0, n_predict=1, xtc_probability=1.0, xtc_threshold=0.002)["tokens"]
    assert got == [want] and plain == [int(np.argmax(row))] and want != plain[0]


def test_a_seeded_chain_request_is_the_same_alone_and_batched(srv):
    body = {"temperature": 1.2, "typical_p": 0.9, "top_n_sigma": 2.0, "dynatemp_range": 0.5, "seed": 11,
            "n_predict": 12}
    miro = {"temperature": 1.0, "mirostat": 2, "mirostat_tau": 4.0, "seed": 12, "n_predict": 12}
    with srv.client() as client:
        alone, alone_miro = _complete(client, **body)["tokens"], _complete(client, **miro)["tokens"]
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            runs = [pool.submit(_complete, client, **b) for b in (body, miro, {"temperature": 0.7, "n_predict": 20})]
            assert runs[0].result(60)["tokens"] == alone and runs[1].result(60)["tokens"] == alone_miro
        other = _complete(client, **{**body, "seed": 99})["tokens"]
    assert other != alone  # the seed decides the draws


def test_orders_and_ollama_options(srv):
    with srv.client() as client:
        by_letters = _complete(client, temperature=0.9, seed=4, samplers="kpt", top_k=5, top_p=0.5)
        by_names = _complete(client, temperature=0.9, seed=4, samplers=["top_k", "top_p", "temperature"], top_k=5,
                             top_p=0.5)
        assert by_letters["tokens"] == by_names["tokens"]
        assert by_names["generation_settings"]["samplers"] == ["top_k", "top_p", "temperature"]
        ollama = client.post("/api/generate", json={"model": "m", "prompt": "hi", "stream": False, "options": {
            "temperature": 0.8, "mirostat": 1, "mirostat_tau": 3.0, "mirostat_eta": 0.2, "seed": 5, "num_predict": 4}})
        assert ollama.status_code == 200, ollama.text
        for body, param in (({"samplers": ["top_k", "nope"]}, "samplers"), ({"mirostat": 3}, "mirostat"),
                            ({"xtc_threshold": 2.0}, "xtc_threshold"), ({"min_keep": -1}, "min_keep"),
                            ({"dry_allowed_length": -1}, "dry_allowed_length"),
                            ({"dry_sequence_breakers": [1]}, "dry_sequence_breakers")):
            resp = client.post("/completion", json={"prompt": "x", **body})
            assert resp.status_code == 400 and error_of(resp)["param"] == param, resp.text


def test_the_flags_set_every_requests_chain():
    from config_helpers import flags_for
    from mlxcel_py.config import resolve
    from mlxcel_py.engine.core.chain_params import ChainParams
    from mlxcel_py.errors import ConfigError

    cfg = resolve("serve", flags_for("serve", samplers="top_k;typ_p;temperature", typical=0.9, mirostat_lr=0.2,
                                     top_nsigma=1.5, min_keep=2), env={})
    assert cfg.sampling.chain == ChainParams(typical_p=0.9, mirostat_eta=0.2, top_n_sigma=1.5, min_keep=2,
                                             order=("top_k", "typ_p", "temperature"))
    assert resolve("generate", flags_for("generate", sampling_seq="kt"), env={}).sampling.chain.order == \
        ("top_k", "temperature")
    assert not resolve("run", flags_for("run"), env={}).sampling.chain.active
    for flags, message in ((dict(mirostat=5), "--mirostat must be 0 (off), 1 or 2"),
                           (dict(samplers="top_k;nope"), "--samplers: unknown sampler 'nope'"),
                           (dict(samplers="k", sampling_seq="k"), "give one"),
                           (dict(xtc_threshold=3.0), "--xtc-threshold must be between 0 and 1")):
        with pytest.raises(ConfigError, match=re.escape(message)):
            resolve("serve", flags_for("serve", **flags), env={})


def test_dry_greedy_tokens_equal_llama_servers():
    import json
    from pathlib import Path

    from mlxcel_py.models import load_model

    fixtures = Path(__file__).parent / "fixtures"
    record = json.loads((fixtures / "samplers_llama_cpp.json").read_text())["dry_server"]
    running = start_server(model=load_model(str(fixtures / "gguf" / record["model"])), parallel=1, ctx_size=1024)
    try:
        with running.client() as client:
            for run in record["runs"]:
                body = {"prompt": record["prompt"], "n_predict": 16, "temperature": 0, "return_tokens": True,
                        "cache_prompt": False}
                assert client.post("/completion", json=body).json()["tokens"] == run["without"]
                got = client.post("/completion", json={**body, **run["body"]}).json()
                assert got["tokens"] == run["tokens"], run["body"]
                assert got["generation_settings"]["dry_multiplier"] == run["body"]["dry_multiplier"]
    finally:
        stop_server(running)
