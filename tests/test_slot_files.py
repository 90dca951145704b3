"""Slots to disk (--slot-save-path, POST /slots/{id}?action=save|restore|erase) and --cache-ram."""

import json
import os

import pytest

from mlxcel_py.config import resolve
from mlxcel_py.engine import Request, SamplingParams, build_engine
from mlxcel_py.engine.core.slots import FORMAT, SlotAction, read_header, valid_filename
from mlxcel_py.errors import SlotActionError

from config_helpers import flags_for
from kv_models import loaded32, prompt, run_engine
from server_helpers import start_server, stop_server
from tiny import tiny_model


def greedy(n):
    return SamplingParams(max_tokens=n, ignore_eos=True, temperature=0.0)


def engine_for(loaded, **kw):
    kw.setdefault("parallel", 1)
    kw.setdefault("cache_min_prefix", 8)
    return build_engine(resolve("serve", flags_for("serve", **kw), env={}).engine, loaded)


def act(engine, action, path="", slot=0):
    return engine.slot_action(SlotAction(action, slot, os.path.basename(path), str(path)))


@pytest.mark.parametrize("loaded, types", [(tiny_model, None), (loaded32, "q8_0")])
def test_save_erase_restore_continues_token_exactly(tmp_path, loaded, types):
    kw = {"cache_type_k": types, "cache_type_v": types} if types else {}
    p = prompt(60, 1)
    engine = engine_for(loaded(), **kw)
    first = run_engine(engine, [Request("a", p, greedy(16))])["a"]
    saved = act(engine, "save", tmp_path / "s.bin")
    assert (saved.n_tokens, saved.n_bytes) == (60 + 15, (tmp_path / "s.bin").stat().st_size)  # the last token has no KV
    meta = read_header(str(tmp_path / "s.bin"))
    assert (meta["format"], json.loads(meta["tokens"])) == (FORMAT, list(p) + first[:15])
    assert act(engine, "erase").n_tokens == 75 and engine.stats().prompt_cache_entries == 0
    assert act(engine, "erase").n_tokens == 0  # nothing left to erase
    fresh = engine_for(loaded(), **kw)  # another process' engine: nothing in its prompt cache
    restored = act(fresh, "restore", tmp_path / "s.bin")
    assert (restored.n_tokens, restored.n_bytes) == (75, saved.n_bytes)
    follow = run_engine(fresh, [Request("b", p + tuple(first[:8]), greedy(8))])["b"]
    assert follow == first[8:16]
    assert fresh.stats().num_cached_prompt_tokens == 60 + 7  # adopted from the restored slot, one token forwarded


def test_an_unused_slot_saves_no_tokens_and_restores_to_empty(tmp_path):
    engine = engine_for(tiny_model())
    assert act(engine, "save", tmp_path / "empty.bin").n_tokens == 0
    assert act(engine, "restore", tmp_path / "empty.bin").n_tokens == 0


def test_restore_into_another_model_or_kv_type_is_refused(tmp_path):
    engine = engine_for(tiny_model())
    run_engine(engine, [Request("a", prompt(40, 2), greedy(4))])
    act(engine, "save", tmp_path / "s.bin")
    with pytest.raises(SlotActionError, match="Unable to restore slot: the file holds the KV of model 'tiny-0' "
                                              r"\([0-9a-f]{16}\), not of the served 'tiny-1'"):
        act(engine_for(tiny_model(1)), "restore", tmp_path / "s.bin")
    with pytest.raises(SlotActionError, match="the file's KV is K f32, V f32; this server stores K f16, V f16"):
        act(engine_for(tiny_model(), cache_type_k="f16", cache_type_v="f16"), "restore", tmp_path / "s.bin")
    (tmp_path / "junk.bin").write_bytes(b"not a slot file at all")
    with pytest.raises(SlotActionError, match="Unable to restore slot: not a slot file") as info:
        act(engine, "restore", tmp_path / "junk.bin")
    assert info.value.status == 400
    with pytest.raises(SlotActionError, match="no such file under --slot-save-path"):
        act(engine, "restore", tmp_path / "missing.bin")


def test_a_busy_slot_and_a_bad_slot_id_are_refused(tmp_path):
    engine = engine_for(tiny_model(), prefill_chunk_size=16)
    engine.add_request(Request("long", prompt(100, 3), greedy(4)))
    engine.step()  # its first piece: the slot is prefilling
    with pytest.raises(SlotActionError, match="slot 0 is processing a request; retry when it is idle") as info:
        act(engine, "save", tmp_path / "s.bin")
    assert info.value.status == 503
    with pytest.raises(SlotActionError, match="Invalid slot ID"):
        act(engine, "save", tmp_path / "s.bin", slot=1)


@pytest.mark.parametrize("name, ok", [
    ("slot1.bin", True), ("a b.bin", True), ("../x.bin", False), ("a/b.bin", False), ("..", False), ("", False),
    (".hidden", False), ("x\\y", False), ("bad\x00name", False), ("trailing.", False), (" lead", False),
    ("c:" + "x", False), ("x" * 256, False),
])
def test_filenames_are_one_plain_name(name, ok):
    assert valid_filename(name) is ok


def test_cache_ram_caps_the_prompt_cache_by_bytes():
    lm = tiny_model()  # 512 bytes of KV per token: 1 MiB holds 2048 tokens
    engine = engine_for(lm, cache_ram=1)
    a, b = prompt(1500, 4), prompt(1500, 5)
    run_engine(engine, [Request("a", a, greedy(2))])
    assert engine.stats().prompt_cache_entries == 1
    run_engine(engine, [Request("b", b, greedy(2))])  # a's 1,501 tokens are evicted to fit b's
    stats = engine.stats()
    assert (stats.prompt_cache_entries, stats.prompt_cache_bytes) == (1, 1501 * 512)
    run_engine(engine, [Request("a2", a + (7,), greedy(2))])
    assert engine.stats().num_cached_prompt_tokens == 0  # a is gone
    assert engine_for(lm, cache_ram=0).scheduler.prompt_cache is None
    assert engine_for(lm, cache_ram=-1).scheduler.prompt_cache.max_bytes >= 1 << 62


def test_kv_bytes_in_slots_and_metrics_and_the_slot_routes(tmp_path):
    running = start_server(parallel=1, slot_save_path=str(tmp_path), cache_min_prefix=8)
    try:
        with running.client() as c:
            ids = list(prompt(40, 6))
            body = {"prompt": ids, "n_predict": 6, "temperature": 0.0, "return_tokens": True}
            first = c.post("/completion", json=body).json()
            slot = c.get("/slots").json()[0]
            assert (slot["cache_type_k"], slot["cache_type_v"], slot["kv_bytes_per_token"]) == ("f32", "f32", 512)
            metrics = c.get("/metrics").text
            assert "mlxcel_kv_bytes_per_token 512.0" in metrics
            saved = c.post("/slots/0?action=save", json={"filename": "one.bin"}).json()
            assert set(saved) == {"id_slot", "filename", "n_saved", "n_written", "timings"}
            assert (saved["id_slot"], saved["filename"], saved["n_saved"]) == (0, "one.bin", 45)
            assert saved["n_written"] == (tmp_path / "one.bin").stat().st_size and "save_ms" in saved["timings"]
            assert c.post("/slots/0?action=erase").json() == {"id_slot": 0, "n_erased": 45}
            restored = c.post("/slots/0?action=restore", json={"filename": "one.bin"}).json()
            assert (restored["n_restored"], restored["n_read"]) == (45, saved["n_written"])
            assert "restore_ms" in restored["timings"]
            again = c.post("/completion", json={**body, "prompt": ids + first["tokens"][:3], "n_predict": 3}).json()
            assert again["tokens"] == first["tokens"][3:6] and again["tokens_cached"] > 40
            for path, payload, status, message in (
                ("/slots/0?action=save", {"filename": "../up.bin"}, 400, "Invalid filename"),
                ("/slots/0?action=save", {"filename": "/etc/x"}, 400, "Invalid filename"),
                ("/slots/0?action=save", {}, 400, "filename (a string) is required"),
                ("/slots/0?action=save", {"filename": "a.bin", "model": "x"}, 400,
                 "model is not a field of /slots/{id}?action=save"),
                ("/slots/0?action=load", {"filename": "a.bin"}, 400, "Invalid action"),
                ("/slots/x?action=save", {"filename": "a.bin"}, 400, "Invalid slot ID"),
                ("/slots/3?action=save", {"filename": "a.bin"}, 400, "Invalid slot ID"),
            ):
                r = c.post(path, json=payload)
                assert (r.status_code, r.json()["error"]["message"]) == (status, message), path
            assert sorted(os.listdir(tmp_path)) == ["one.bin"]
    finally:
        stop_server(running)


def test_slot_actions_need_slot_save_path():
    running = start_server(parallel=1)
    try:
        with running.client() as c:
            r = c.post("/slots/0?action=save", json={"filename": "a.bin"})
        assert r.status_code == 501
        assert r.json()["error"]["message"] == ("This server does not support slots action. "
                                                "Start it with `--slot-save-path`")
    finally:
        stop_server(running)


def test_the_slot_action_route_declares_its_501_without_a_save_path():
    running = start_server()
    try:
        with running.client() as client:
            answer = client.post("/slots/0?action=save", json={"filename": "a.bin"})
            declared = client.get("/openapi.json").json()["paths"]["/slots/{id_slot}"]["post"]["responses"]
    finally:
        stop_server(running)
    assert answer.status_code == 501 and "--slot-save-path" in answer.json()["error"]["message"]
    assert "501" in declared  # schemathesis found it undocumented (make stress)
