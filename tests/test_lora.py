"""LoRA adapters loaded with the model (models/lora.py): an mlx-lm adapter directory (random, written here) on
the llama fixture's Hugging Face directory gives mlx-lm's own greedy tokens with the same adapter; the GGUF LoRA
fixture (scripts/make_lora_fixture.py) on the llama GGUF gives llama-server's recorded tokens with --lora and
--lora-scaled; GET /lora-adapters lists them, a request's `lora` is honoured at the loaded scales and refused
otherwise; the adapters that do not fit are refused at load."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from server_helpers import error_of, start_server, stop_server

FIXTURES = Path(__file__).parent / "fixtures" / "gguf"
HF_DIR = FIXTURES / "llama-hf"
GGUF = FIXTURES / "llama-f16.gguf"
ADAPTER = FIXTURES / "lora" / "llama-lora-f32.gguf"
RECORD = json.loads((FIXTURES / "lora" / "llama_lora_llama_server.json").read_text())
PROMPT = "Hello there, how are"


def mlx_adapter(folder: Path, rank: int = 4, scale: float = 2.0, kind: str = "lora") -> Path:
    """A random mlx-lm adapter for the llama fixture: q_proj and v_proj of every layer, as mlx_lm.lora saves."""
    config = json.loads((HF_DIR / "config.json").read_text())
    hidden, layers = config["hidden_size"], config["num_hidden_layers"]
    kv = config["num_key_value_heads"] * config["head_dim"]
    rng = np.random.default_rng(0)
    weights = {}
    for i in range(layers):
        for name, out in (("self_attn.q_proj", hidden), ("self_attn.v_proj", kv)):
            weights[f"model.layers.{i}.{name}.lora_a"] = mx.array(rng.standard_normal((hidden, rank), np.float32) * 0.3)
            weights[f"model.layers.{i}.{name}.lora_b"] = mx.array(rng.standard_normal((rank, out), np.float32) * 0.3)
    folder.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(folder / "adapters.safetensors"), weights)
    (folder / "adapter_config.json").write_text(json.dumps({
        "fine_tune_type": kind, "num_layers": layers,
        "lora_parameters": {"rank": rank, "scale": scale, "dropout": 0.0,
                            "keys": ["self_attn.q_proj", "self_attn.v_proj"]}}))
    return folder


def greedy(model, ids: list[int], n: int = 10) -> list[int]:
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    logits = model(mx.array([ids]), cache=cache)
    out = []
    for _ in range(n):
        out.append(int(mx.argmax(logits[0, -1])))
        logits = model(mx.array([[out[-1]]]), cache=cache)
    return out


def _completion(client, prompt, n: int, **extra) -> dict:
    resp = client.post("/completion", json={"prompt": prompt, "n_predict": n, "temperature": 0, "return_tokens": True,
                                            "cache_prompt": False, **extra})
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_an_mlx_lm_adapter_gives_mlx_lms_own_tokens(tmp_path):
    from mlx_lm import load
    from mlx_lm.tuner.utils import load_adapters

    from mlxcel_py.models import encode_text, load_model

    folder = mlx_adapter(tmp_path / "adapter")
    reference, tokenizer = load(str(HF_DIR))
    reference.set_dtype(mx.float32)  # ours runs float32 on the CPU
    reference = load_adapters(reference, str(folder))
    ids = list(tokenizer.encode(PROMPT))
    want = greedy(reference, ids)
    loaded = load_model(str(HF_DIR), lora=((str(folder), 1.0),))
    assert list(encode_text(loaded.tokenizer, PROMPT)) == ids and "LoRA adapter x1" in loaded.description
    plain = greedy(load_model(str(HF_DIR)).model, ids)
    assert plain != want  # the adapter decides the reply
    running = start_server(model=loaded, parallel=2, prefill_chunk_size=3)
    try:
        with running.client() as client:
            assert _completion(client, ids, 10)["tokens"] == want  # by flag
            assert client.get("/lora-adapters").json() == [{"id": 0, "path": str(folder), "scale": 1.0}]
            # by request: off for this one (llama-server's lora), on by name (mlx_lm.server's adapters)
            assert _completion(client, ids, 10, lora=[{"id": 0, "scale": 0.0}])["tokens"] == plain
            assert _completion(client, ids, 10, adapters="adapter")["tokens"] == want
    finally:
        stop_server(running)


@pytest.mark.parametrize("run", RECORD["runs"], ids=lambda r: f"scale-{r['scale']}")
def test_a_gguf_lora_gives_llama_servers_tokens(run):
    from mlxcel_py.models import load_model

    loaded = load_model(str(GGUF), lora=((str(ADAPTER), run["scale"]),))
    running = start_server(model=loaded, parallel=1)
    try:
        with running.client() as client:
            got = _completion(client, RECORD["prompt"], RECORD["n_predict"])
            assert got["tokens"] == run["tokens"]
            assert got["generation_settings"]["lora"] == run["lora_adapters"]
            assert client.get("/lora-adapters").json()[0]["scale"] == run["scale"]
    finally:
        stop_server(running)


def test_requests_with_their_own_scales_batch_together_and_never_share_the_cache():
    from mlxcel_py.models import encode_text, load_model

    want = {run["scale"]: run["tokens"] for run in RECORD["runs"]}
    base = load_model(str(GGUF))
    want[0.0] = greedy(base.model, list(encode_text(base.tokenizer, RECORD["prompt"])), RECORD["n_predict"])
    loaded = load_model(str(GGUF), lora=((str(ADAPTER), 1.0),))
    running = start_server(model=loaded, parallel=3)
    n = RECORD["n_predict"]
    try:
        with running.client() as client:
            import concurrent.futures

            with concurrent.futures.ThreadPoolExecutor(3) as pool:
                runs = {scale: pool.submit(_completion, client, RECORD["prompt"], n, lora=[{"id": 0, "scale": scale}])
                        for scale in (1.0, 0.5, 0.0)}
                assert {scale: r.result(60)["tokens"] for scale, r in runs.items()} == want
            # the prompt cache (prompts of 32 tokens and more): shared at the loaded scales, never with its own
            long = " ".join([RECORD["prompt"]] * 6)
            first = _completion(client, long, 2, cache_prompt=True)
            again = _completion(client, long, 2, cache_prompt=True)
            own = _completion(client, long, 2, cache_prompt=True, lora=[{"id": 0, "scale": 0.5}])
            assert again["timings"]["cache_n"] >= first["tokens_evaluated"] - 1 and own["timings"]["cache_n"] == 0
            assert own["generation_settings"]["lora"] == [{"id": 0, "scale": 0.5}]
            # POST /lora-adapters: the scales of the requests that follow without their own
            assert client.post("/lora-adapters", json=[{"id": 0, "scale": 0.5}]).json() == {"success": True}
            assert client.get("/lora-adapters").json()[0]["scale"] == 0.5
            assert _completion(client, RECORD["prompt"], n)["tokens"] == want[0.5]
            assert client.post("/lora-adapters", json=[]).json() == {"success": True}  # every adapter at 0
            assert _completion(client, RECORD["prompt"], n)["tokens"] == want[0.0]
            client.post("/lora-adapters", json=[{"id": 0, "scale": 1.0}])
            assert _completion(client, RECORD["prompt"], n, lora=[])["tokens"] == want[1.0]  # []: the server's
            for lora, message in (([{"id": 3, "scale": 1.0}], "no adapter with id 3"),
                                  ([{"id": 0, "scale": "x"}], "scale must be a number")):
                resp = client.post("/completion", json={"prompt": "x", "lora": lora})
                assert resp.status_code == 400 and message in error_of(resp)["message"], resp.text
            assert client.post("/lora-adapters", json={"id": 0}).status_code == 400
    finally:
        stop_server(running)


def test_adapters_that_do_not_fit_are_refused(tmp_path):
    from mlxcel_py.errors import ModelLoadError
    from mlxcel_py.models import load_model

    with pytest.raises(ModelLoadError, match="'dora' adapters are not supported"):
        load_model(str(HF_DIR), lora=((str(mlx_adapter(tmp_path / "dora", kind="dora")), 1.0),))
    with pytest.raises(ModelLoadError, match="not an mlx-lm adapter directory"):
        load_model(str(HF_DIR), lora=((str(tmp_path), 1.0),))
    with pytest.raises(ModelLoadError, match="a llama adapter; the model is qwen3"):
        load_model(str(FIXTURES / "qwen3-f16.gguf"), lora=((str(ADAPTER), 1.0),))
    with pytest.raises(ModelLoadError, match="not a LoRA adapter GGUF"):
        load_model(str(GGUF), lora=((str(GGUF), 1.0),))


def test_the_flags():
    from config_helpers import flags_for
    from mlxcel_py.config import resolve
    from mlxcel_py.errors import ConfigError

    cfg = resolve("serve", flags_for("serve", lora=["a.gguf,b"], lora_scaled=["c.gguf:0.5"]), env={})
    assert cfg.model.lora == (("a.gguf", 1.0), ("b", 1.0), ("c.gguf", 0.5))
    assert resolve("run", flags_for("run", lora=["dir"]), env={}).model.lora == (("dir", 1.0),)
    for bad in (["c.gguf"], ["c.gguf:x"], [":0.5"]):
        with pytest.raises(ConfigError, match="--lora-scaled takes FILE:SCALE"):
            resolve("serve", flags_for("serve", lora_scaled=bad), env={})
    with pytest.raises(ConfigError, match="--lora applies to one model"):
        resolve("serve", flags_for("serve", lora=["a"], model=["x.gguf", "y.gguf"]), env={})


def test_two_adapters_in_one_batch_each_request_its_own(tmp_path, monkeypatch):
    import concurrent.futures
    import sys

    from mlxcel_py.models import load_model

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    import make_lora_fixture

    other = tmp_path / "other-lora.gguf"
    monkeypatch.setattr(make_lora_fixture, "OUT", other)
    make_lora_fixture.write(seed=7)  # a second random adapter for the same model
    n, prompt = RECORD["n_predict"], RECORD["prompt"]
    alone = start_server(model=load_model(str(GGUF), lora=((str(other), 1.0),)), parallel=1)
    try:
        with alone.client() as client:
            want_other = _completion(client, prompt, n)["tokens"]
    finally:
        stop_server(alone)
    both = start_server(model=load_model(str(GGUF), lora=((str(ADAPTER), 1.0), (str(other), 1.0))), parallel=2)
    try:
        with both.client() as client, concurrent.futures.ThreadPoolExecutor(2) as pool:
            first = pool.submit(_completion, client, prompt, n, lora=[{"id": 0, "scale": 1.0}])
            second = pool.submit(_completion, client, prompt, n, lora=[{"id": 1, "scale": 1.0}])
            assert first.result(60)["tokens"] == RECORD["runs"][0]["tokens"]  # llama-server's, the first alone
            assert second.result(60)["tokens"] == want_other
            assert want_other != RECORD["runs"][0]["tokens"]
    finally:
        stop_server(both)


def test_mlx_lm_servers_adapters_field_names_a_loaded_adapter(tmp_path, monkeypatch):
    import sys

    from mlxcel_py.models import load_model

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    import make_lora_fixture

    other = tmp_path / "other-lora.gguf"
    monkeypatch.setattr(make_lora_fixture, "OUT", other)
    make_lora_fixture.write(seed=7)
    loaded = load_model(str(GGUF), lora=((str(ADAPTER), 1.0), (str(other), 1.0)))
    running = start_server(model=loaded, parallel=1)
    want = RECORD["runs"][0]["tokens"]  # llama-server's, the fixture adapter alone at 1.0
    try:
        with running.client() as client:
            assert _completion(client, RECORD["prompt"], RECORD["n_predict"])["tokens"] != want  # both on
            body = {"prompt": RECORD["prompt"], "max_tokens": RECORD["n_predict"], "temperature": 0}
            for name in (str(ADAPTER), ADAPTER.name, ADAPTER.stem):
                got = client.post("/v1/completions", json={**body, "adapters": name}).json()
                assert got["choices"][0]["text"] == loaded.tokenizer.decode(want), name
            assert _completion(client, RECORD["prompt"], RECORD["n_predict"], adapters=ADAPTER.stem)["tokens"] == want
            ids = [m["id"] for m in client.get("/v1/models").json()["data"]]
            named = next(i for i in ids if i.endswith(":" + ADAPTER.stem))
            assert len(ids) == 3 and named == f"{ids[0]}:{ADAPTER.stem}"  # the model, then each adapter alone
            got = client.post("/v1/completions", json={**body, "model": named}).json()
            assert got["choices"][0]["text"] == loaded.tokenizer.decode(want)
            resp = client.post("/v1/completions", json={**body, "adapters": "missing"})
            assert resp.status_code == 400 and "'missing' is not a loaded adapter" in error_of(resp)["message"]
            resp = client.post("/completion", json={"prompt": "x", "adapters": ADAPTER.name,
                                                    "lora": [{"id": 0, "scale": 1}]})
            assert resp.status_code == 400 and error_of(resp)["param"] == "adapters"
    finally:
        stop_server(running)


def test_init_without_apply_loads_at_zero_until_post():
    from config_helpers import flags_for
    from mlxcel_py.config import resolve
    from mlxcel_py.errors import ConfigError
    from mlxcel_py.models import encode_text, load_model

    cfg = resolve("serve", flags_for("serve", lora=[str(ADAPTER)], lora_init_without_apply=True), env={})
    assert cfg.model.lora == ((str(ADAPTER), 0.0),)
    with pytest.raises(ConfigError, match="--lora-init-without-apply needs --lora"):
        resolve("serve", flags_for("serve", lora_init_without_apply=True), env={})
    base = load_model(str(GGUF))
    plain = greedy(base.model, list(encode_text(base.tokenizer, RECORD["prompt"])), RECORD["n_predict"])
    running = start_server(model=load_model(str(GGUF), lora=cfg.model.lora), parallel=1)
    try:
        with running.client() as client:
            assert _completion(client, RECORD["prompt"], RECORD["n_predict"])["tokens"] == plain
            client.post("/lora-adapters", json=[{"id": 0, "scale": 1.0}])
            assert _completion(client, RECORD["prompt"], RECORD["n_predict"])["tokens"] == RECORD["runs"][0]["tokens"]
    finally:
        stop_server(running)


def test_the_cpu_decode_step_adds_each_rows_adapters(monkeypatch):
    """Over a quantized file the CPU decode step (its products over the blocks) takes the additions, each row at
    its own scales: with float activations (exact to float32) its tokens are the MLX forward's."""
    import concurrent.futures

    from mlxcel_py.models import load_model
    from mlxcel_py.models.cpu.native import NativeDecoder
    from mlxcel_py.models.cpu.quant import int8_ir, products
    from mlxcel_py.models.lora import LoraProduct

    if not int8_ir.HAS_AVX2:
        pytest.skip("the block decode step is chosen on AVX2")
    monkeypatch.setattr(products, "linear", products.linear_vector)  # float activations: exact to float32
    quantized = str(FIXTURES / "llama-q8_0.gguf")
    native = load_model(quantized, lora=((str(ADAPTER), 1.0),))
    assert type(native.cpu_decode) is NativeDecoder
    assert all(isinstance(getattr(w, f), LoraProduct) for w in native.cpu_decode._layers for f in ("qkv", "o"))
    reference = load_model(quantized, lora=((str(ADAPTER), 1.0),), cpu_weights="f32")
    assert reference.cpu_decode is None  # the MLX forward with the adapters
    results = []
    for loaded in (native, reference):
        running = start_server(model=loaded, parallel=3)
        try:
            with running.client() as client, concurrent.futures.ThreadPoolExecutor(3) as pool:
                runs = [pool.submit(_completion, client, RECORD["prompt"], 10, lora=[{"id": 0, "scale": s}])
                        for s in (1.0, 0.5, 0.0)]
                results.append([r.result(60)["tokens"] for r in runs])
        finally:
            stop_server(running)
    assert results[0] == results[1] and len({tuple(t) for t in results[0]}) == 3


def test_fused_adapters_run_as_the_unfused_at_their_scales():
    """--lora-fuse: merged into float32 weights (the CPU decode step then runs as for any model), the tokens of
    the unfused adapter; a request asking for other scales is a 400."""
    from config_helpers import flags_for
    from mlxcel_py.config import resolve
    from mlxcel_py.errors import ConfigError
    from mlxcel_py.models import load_model

    cfg = resolve("serve", flags_for("serve", lora=[str(ADAPTER)], lora_fuse=True), env={})
    assert cfg.model.lora_fuse and cfg.model.lora == ((str(ADAPTER), 1.0),)
    with pytest.raises(ConfigError, match="--lora-fuse needs --lora"):
        resolve("generate", flags_for("generate", lora_fuse=True), env={})
    fused = load_model(str(GGUF), lora=cfg.model.lora, lora_fuse=True)
    assert fused.lora is None and fused.adapters[0].fused and fused.cpu_decode is not None
    running = start_server(model=fused, parallel=1)
    try:
        with running.client() as client:
            assert _completion(client, RECORD["prompt"], RECORD["n_predict"])["tokens"] == RECORD["runs"][0]["tokens"]
            resp = client.post("/completion", json={"prompt": "x", "lora": [{"id": 0, "scale": 0.5}]})
            assert resp.status_code == 400 and "fused into the weights" in error_of(resp)["message"]
            assert client.post("/lora-adapters", json=[{"id": 0, "scale": 0.5}]).status_code == 400
    finally:
        stop_server(running)
