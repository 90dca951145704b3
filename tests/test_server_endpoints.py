"""llama-server's endpoint switches: --metrics/--no-metrics and --slots/--no-slots (env
LLAMA_ARG_ENDPOINT_METRICS / LLAMA_ARG_ENDPOINT_SLOTS), 501 when off, /props telling which."""

import pytest

from mlxcel_py.config import resolve
from mlxcel_py.errors import ConfigError
from config_helpers import flags_for
from server_helpers import error_of, start_server, stop_server


@pytest.fixture(scope="module")
def off():
    running = start_server(parallel=1, metrics=False, slots=False)
    with running.client() as client:
        yield client
    stop_server(running)


@pytest.fixture(scope="module")
def on():
    running = start_server(parallel=1)
    with running.client() as client:
        yield client, running
    stop_server(running)


@pytest.mark.parametrize("path, name, flag", [("/metrics", "metrics", "--metrics"), ("/slots", "slots", "--slots")])
def test_a_switched_off_endpoint_is_llama_servers_501(off, path, name, flag):
    resp = off.get(path)
    assert resp.status_code == 501
    assert error_of(resp) == {
        "message": f"This server does not support {name} endpoint. Start it with `{flag}`",
        "type": "not_supported_error", "param": None, "code": None,
    }


def test_props_tells_which_endpoints_are_on(off, on):
    assert on[0].get("/props").json()["ui"] is True
    assert {k: v for k, v in off.get("/props").json().items() if k.startswith("endpoint_")} == {
        "endpoint_slots": False, "endpoint_props": False, "endpoint_metrics": False}
    client, _ = on
    assert {k: v for k, v in client.get("/props").json().items() if k.startswith("endpoint_")} == {
        "endpoint_slots": True, "endpoint_props": False, "endpoint_metrics": True}


def test_metrics_carry_the_process_start_time(on):
    client, running = on
    resp = client.get("/metrics")
    assert resp.status_code == 200
    assert resp.headers["process-start-time-unix"] == str(running.runtime.started)
    assert client.get("/slots").status_code == 200


@pytest.mark.parametrize("raw, value", [("1", True), ("true", True), ("on", True), ("enabled", True),
                                        ("0", False), ("false", False), ("off", False), ("disabled", False)])
def test_the_environment_switches_them(raw, value):
    env = {"LLAMA_ARG_ENDPOINT_METRICS": raw, "LLAMA_ARG_ENDPOINT_SLOTS": raw}
    server = resolve("serve", env=env).server
    assert (server.endpoint_metrics, server.endpoint_slots) == (value, value)


def test_a_flag_wins_over_the_environment_and_a_bad_value_names_its_variable():
    server = resolve("serve", flags_for("serve", metrics=True), env={"LLAMA_ARG_ENDPOINT_METRICS": "0"}).server
    assert server.endpoint_metrics is True
    with pytest.raises(ConfigError, match="LLAMA_ARG_ENDPOINT_SLOTS must be one of .* \\(got 'maybe'\\)"):
        resolve("serve", env={"LLAMA_ARG_ENDPOINT_SLOTS": "maybe"})


def test_props_ui_follows_the_chat_page():
    running = start_server(parallel=1, no_webui=True)
    try:
        with running.client() as client:
            assert client.get("/props").json()["ui"] is False
    finally:
        stop_server(running)
    assert resolve("serve", env={}).server.webui is True
