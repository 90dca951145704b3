"""Our llama.cpp sampler chain (engine/runner/sampler_chain.py) against llama.cpp's own samplers on fixed
logits: tests/fixtures/samplers_llama_cpp.json, recorded by scripts/make_sampler_fixture.py from llama.cpp's
library (scripts/sampler_reference.cpp). Each sampler alone, with min_keep, in llama-server's default order and
another; mirostat 1 and 2 replayed over the tokens llama.cpp drew (the candidates they keep follow mu)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from mlxcel_py.engine.core.chain_params import ChainParams
from mlxcel_py.engine.runner.sampler_chain import ChainSettings, SamplerChain, draw

RECORD = json.loads((Path(__file__).parent / "fixtures" / "samplers_llama_cpp.json").read_text())


def settings(chain: list) -> ChainSettings:
    """llama.cpp's chain (its init functions' arguments) as our settings."""
    values, order = {}, []
    for name, *args in chain:
        if name == "top_k":
            values["top_k"], step = args[0], "top_k"
        elif name in ("typical", "top_p", "min_p"):
            values["typical_p" if name == "typical" else name], values["min_keep"] = args
            step = "typ_p" if name == "typical" else name
        elif name == "xtc":
            values.update(xtc_probability=args[0], xtc_threshold=args[1], min_keep=args[2])
            step = "xtc"
        elif name == "temp_ext":
            values.update(temperature=args[0], dynatemp_range=args[1], dynatemp_exponent=args[2])
            step = "temperature"
        elif name == "top_n_sigma":
            values["top_n_sigma"], step = args[0], "top_n_sigma"
        elif name == "mirostat":
            values.update(mirostat=1, mirostat_tau=args[2], mirostat_eta=args[3])
            step = None
        elif name == "mirostat_v2":
            values.update(mirostat=2, mirostat_tau=args[1], mirostat_eta=args[2])
            step = None
        else:
            raise AssertionError(name)
        if step:
            order.append(step)
    plain = {k: values.pop(k) for k in ("temperature", "top_k", "top_p", "min_p") if k in values}
    return ChainSettings(order=tuple(order), **plain, more=ChainParams(**values))


def _check(got, want: list, where: str) -> None:
    """The same candidates in the same order; tokens of equal logits in either order (std::partial_sort's
    order among ties is unspecified)."""
    np.testing.assert_allclose(got.logits, [k[1] for k in want], rtol=2e-6, atol=1e-6, err_msg=where)
    runs, ids = [], got.ids.tolist()
    for i, (token, logit, _) in enumerate(want):
        if runs and runs[-1][0] == logit:
            runs[-1][1].add(token), runs[-1][2].add(ids[i])
        else:
            runs.append((logit, {token}, {ids[i]}))
    assert all(want_ids == got_ids for _, want_ids, got_ids in runs), where


def _row(step: dict) -> np.ndarray:
    return np.array(RECORD["rows"][step["row"]], np.float32)


STATELESS = [name for name in RECORD["cases"] if not name.startswith(("mirostat", "dry"))]


@pytest.mark.parametrize("name", STATELESS)
def test_each_chain_keeps_what_llama_cpp_keeps(name):
    case = RECORD["cases"][name]
    chain = SamplerChain(settings(case["chain"]), np.random.default_rng(0))
    for step in case["steps"]:
        _check(chain.candidates(_row(step)), step["kept"], f"{name} on {step['row']}")


@pytest.mark.parametrize("name", [n for n in RECORD["cases"] if n.startswith("mirostat")])
def test_mirostat_follows_llama_cpps_mu_over_its_draws(name):
    case = RECORD["cases"][name]
    chain = SamplerChain(settings(case["chain"]), np.random.default_rng(0))
    for i, step in enumerate(case["steps"]):
        got = chain.candidates(_row(step))
        _check(got, step["kept"], f"{name} step {i}")
        np.testing.assert_allclose(got.p, [k[2] for k in step["kept"]], rtol=1e-5, atol=1e-7)
        chain.chose(float(got.p[got.ids.tolist().index(step["selected"])]))


@pytest.mark.parametrize("name", [n for n in RECORD["cases"] if n.startswith("dry")])
def test_dry_penalizes_what_llama_cpps_dry_penalizes(name):
    from mlxcel_py.engine.runner.dry import Dry

    case = RECORD["cases"][name]
    (_, multiplier, base, allowed, last_n, *breakers), = case["chain"]
    pairs = [(int(b.split(",")[0]), tuple(int(t) for t in b.split(",")[1:])) for b in breakers]
    dry = Dry(multiplier, base, allowed, last_n, pairs, case["history"][:3])
    dry.extend(case["history"][3:-1])
    dry.accept(case["history"][-1])  # the prompt's tokens, then a chosen one: one history either way
    want = {k[0]: -k[1] for k in case["steps"][0]["kept"] if k[1] != 0}
    got = dry.penalties()
    assert got.keys() == want.keys(), name
    np.testing.assert_allclose([got[t] for t in sorted(got)], [want[t] for t in sorted(want)], rtol=1e-5)


def test_the_draw_is_the_sequences_own_and_llama_cpps_rule():
    p = np.array([0.1, 0.2, 0.3, 0.4], np.float32)
    assert [draw(p, u) for u in (0.0, 0.05, 0.15, 0.29, 0.31, 0.99, 1.0)] == [0, 0, 1, 1, 2, 3, 3]
    row = _row(RECORD["cases"]["top_k"]["steps"][0])
    seeded = [SamplerChain(ChainSettings(top_k=10, temperature=1.0, more=ChainParams(typical_p=0.9)),
                           np.random.default_rng(5))
              for _ in range(2)]
    assert [seeded[0].sample(row) for _ in range(20)] == [seeded[1].sample(row) for _ in range(20)]
