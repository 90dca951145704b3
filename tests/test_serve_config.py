"""The server settings: comma-separated --host, --alias and --tags, --cors-origins, their env fallbacks."""

import socket

import pytest
from typer.testing import CliRunner

import mlxcel_py.server.http.serving as serving
from mlxcel_py.cli.app import app
from mlxcel_py.config import resolve, startup_summary
from mlxcel_py.errors import ConfigError, ServeError
from mlxcel_py.models.chat_template import ChatTemplate

from config_helpers import flags_for


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as sock:
            sock.bind(("::1", 0))
        return True
    except OSError:
        return False


needs_ipv6 = pytest.mark.skipif(not _has_ipv6_loopback(), reason="no IPv6 loopback on this machine")


def test_hosts_and_aliases_are_comma_separated():
    cfg = resolve("serve", flags_for("serve", host=" 127.0.0.1, ::1,127.0.0.1 ", model_alias="first, second,,first",
                                     port=0), env={})
    assert cfg.server.hosts == ("127.0.0.1", "::1") and cfg.server.host == "127.0.0.1"
    assert cfg.server.model_aliases == ("first", "second") and cfg.server.model_alias == "first"
    assert cfg.server.urls() == ["http://127.0.0.1:0", "http://[::1]:0"]


def test_env_fallbacks_and_flags_win():
    env = {"LLAMA_ARG_HOST": "0.0.0.0,::", "LLAMA_ARG_ALIAS": "a,b", "LLAMA_ARG_CORS_ORIGINS": "*",
           "MLXCEL_CORS_ORIGINS": "http://ui.example:3000"}
    cfg = resolve("serve", env=env)
    assert (cfg.server.hosts, cfg.server.model_aliases) == (("0.0.0.0", "::"), ("a", "b"))
    assert cfg.server.cors_origins == ("http://ui.example:3000",)  # MLXCEL_ first
    flags = resolve("serve", flags_for("serve", host="127.0.0.1", model_alias="c", cors_origins="*"), env=env).server
    assert (flags.hosts, flags.model_aliases, flags.cors_origins) == (("127.0.0.1",), ("c",), ("*",))
    defaults = resolve("serve", env={}).server
    assert (defaults.hosts, defaults.model_aliases, defaults.cors_origins) == (("127.0.0.1",), (), ())


def test_tags_are_comma_separated_from_the_flag_or_llama_arg_tags():
    assert resolve("serve", flags_for("serve", tags=" b, a,,b "), env={}).server.model_tags == ("b", "a")
    env = {"LLAMA_ARG_TAGS": "x,y"}
    assert resolve("serve", env=env).server.model_tags == ("x", "y")
    assert resolve("serve", flags_for("serve", tags="z"), env=env).server.model_tags == ("z",)
    assert resolve("serve", env={}).server.model_tags == ()
    with pytest.raises(ConfigError, match=r"^LLAMA_ARG_TAGS must name at least one tag \(got ' , '\)"):
        resolve("serve", env={"LLAMA_ARG_TAGS": " , "})


@pytest.mark.parametrize("origins", ["*", "localhost", "http://a.example", "https://a.example:8443",
                                     "http://192.168.1.5:*", "http://[fe80::1]:3000", "http://[::1]:*"])
def test_valid_origins(origins):
    assert resolve("serve", flags_for("serve", cors_origins=origins), env={}).server.cors_origins == (origins,)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"host": " , "}, "--host must name at least one address (got ' , ')"),
    ({"model_alias": ","}, "--alias must name at least one model name (got ',')"),
    ({"cors_origins": "http://a.example/app"}, "--cors-origins: 'http://a.example/app' is not an origin"),
    ({"cors_origins": "ftp://a.example"}, "--cors-origins: 'ftp://a.example' is not an origin"),
    ({"cors_origins": "a.example"}, "--cors-origins: 'a.example' is not an origin"),
    ({"cors_origins": "http://a.example:port"}, "--cors-origins: 'http://a.example:port' is not an origin"),
    ({"env": {"MLXCEL_CORS_ORIGINS": "nope"}}, "MLXCEL_CORS_ORIGINS: 'nope' is not an origin"),
])
def test_bad_values_are_config_errors(kwargs, message):
    env = kwargs.pop("env", {})
    with pytest.raises(ConfigError) as info:
        resolve("serve", flags_for("serve", **kwargs), env=env)
    assert str(info.value).startswith(message)


def test_summary_lists_every_url_and_the_origins():
    cfg = resolve("serve", flags_for("serve", host="127.0.0.1,::1", port=9000, cors_origins="http://a.example:3000"),
                  env={})
    lines = startup_summary(cfg)
    assert lines[-3].startswith("server http://127.0.0.1:9000, http://[::1]:9000 (no api key, ")
    assert lines[-2] == "cors loopback origins, http://a.example:3000"
    assert lines[-1] == "endpoints /metrics on, /slots on, slot save/restore off (--slot-save-path)"


def test_cli_flags_reach_the_config(monkeypatch):
    seen = []
    monkeypatch.setattr(serving, "serve_forever", seen.append)
    args = ["serve", "--host", "127.0.0.1,::1", "-a", "x,y", "--cors-origins", "*", "--port", "0", "--tags", "t1,t2"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert (seen[0].server.hosts, seen[0].server.model_aliases, seen[0].server.cors_origins) == (
        ("127.0.0.1", "::1"), ("x", "y"), ("*",))
    assert seen[0].server.model_tags == ("t1", "t2")
    bad = CliRunner().invoke(app, ["serve", "--cors-origins", "http://x/y", "--port", "0"])
    assert bad.exit_code != 0 and "is not an origin" in bad.stderr


@needs_ipv6
def test_every_address_is_bound_on_one_port():
    socks = serving.bind_sockets(("127.0.0.1", "::1"), 0)
    try:
        ports = {s.getsockname()[1] for s in socks}
        assert len(ports) == 1 and [s.family for s in socks] == [socket.AF_INET, socket.AF_INET6]
    finally:
        for s in socks:
            s.close()


@needs_ipv6
def test_a_taken_address_closes_the_others():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ServeError, match=f"cannot listen on 127.0.0.1:{port}"):
            serving.bind_sockets(("::1", "127.0.0.1"), port)
        with socket.socket(socket.AF_INET6) as again:  # the ::1 socket bound first was closed
            again.bind(("::1", port))


@needs_ipv6
def test_the_server_answers_on_every_address():
    import threading

    import httpx

    from mlxcel_py.server.app import create_app
    from server_helpers import START_TIMEOUT_S, wait_for

    cfg = resolve("serve", flags_for("serve", host="127.0.0.1,::1", port=0), env={})
    socks = serving.bind_sockets(cfg.server.hosts, 0)
    server = serving.make_server(create_app(None, None, cfg), cfg)
    thread = threading.Thread(target=server.run, kwargs={"sockets": socks}, daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started, START_TIMEOUT_S, "uvicorn to start")
        port = socks[0].getsockname()[1]
        for url in (f"http://127.0.0.1:{port}", f"http://[::1]:{port}"):
            resp = httpx.get(url + "/health", timeout=10)
            assert (resp.status_code, resp.json()) == (503, {"status": "loading"})
    finally:
        server.should_exit = True
        thread.join(START_TIMEOUT_S)


def test_the_chat_template_flags_read_llama_servers_variables(tmp_path):
    path = tmp_path / "t.jinja"
    path.write_text("{{ messages[0].content }}")
    by_name = resolve("serve", env={"LLAMA_ARG_CHAT_TEMPLATE": "gemma", "LLAMA_CHAT_TEMPLATE_KWARGS": '{"a": 1}'})
    assert by_name.server.chat_template == ChatTemplate(name="gemma", defaults={"a": 1}, origin="LLAMA_ARG_CHAT_TEMPLATE")
    by_file = resolve("serve", env={"LLAMA_ARG_CHAT_TEMPLATE_FILE": str(path)})
    assert by_file.server.chat_template.source == "{{ messages[0].content }}"
    assert by_file.server.chat_template.origin == f"LLAMA_ARG_CHAT_TEMPLATE_FILE {path}"
    # the flag wins over its variable; a value that is no name is Jinja
    flag = resolve("serve", flags_for("serve", chat_template="{{ 1 }}"), env={"LLAMA_ARG_CHAT_TEMPLATE": "gemma"})
    assert flag.server.chat_template == ChatTemplate(source="{{ 1 }}", origin="--chat-template")
    assert resolve("serve", env={}).server.chat_template == ChatTemplate()
    assert "chat_template built-in gemma kwargs={'a': 1}" in startup_summary(by_name)


def test_the_chat_template_flags_apply_to_serve_only():
    with pytest.raises(ConfigError, match=r"--chat-template\* and --reasoning-\* apply to serve, not generate"):
        resolve("generate", flags_for("generate", chat_template="chatml"), env={})


def test_the_reasoning_flags_read_llama_servers_variables():
    cfg = resolve("serve", env={"LLAMA_ARG_THINK": "none", "LLAMA_ARG_THINK_BUDGET": "0"})
    assert (cfg.server.reasoning_format, cfg.server.reasoning_budget) == ("none", 0)
    assert cfg.server.chat_template.defaults == {"enable_thinking": False}  # budget 0: thinking off
    default = resolve("serve", env={}).server
    assert (default.reasoning_format, default.reasoning_budget, default.chat_template.defaults) == ("auto", -1, {})


@pytest.mark.parametrize("kwargs,message", [
    ({"reasoning_format": "deepseek-legacy"}, "--reasoning-format must be one of none, deepseek, auto"),
    ({"reasoning_budget": -2}, "--reasoning-budget must be -1 (unrestricted), 0 (thinking off) or a number of "
     "thinking tokens up to 1000000 (got -2)"),
    ({"reasoning_budget": 0, "chat_template_kwargs": '{"enable_thinking": true}'},
     "--reasoning-budget 0 turns thinking off, but --chat-template-kwargs sets enable_thinking"),
])
def test_bad_reasoning_flags_are_config_errors(kwargs, message):
    with pytest.raises(ConfigError) as err:
        resolve("serve", flags_for("serve", **kwargs), env={})
    assert str(err.value).startswith(message)


def test_the_pooling_flag_reads_llama_servers_variable(monkeypatch):
    assert resolve("serve", env={}).server.pooling is None  # the model's, else last (server/embeddings)
    assert resolve("serve", env={"LLAMA_ARG_POOLING": "mean"}).server.pooling == "mean"
    assert resolve("serve", flags_for("serve", pooling="cls"),
                   env={"LLAMA_ARG_POOLING": "mean"}).server.pooling == "cls"
    with pytest.raises(ConfigError, match=r"^--pooling must be one of mean, cls, last, none \(got 'rank'\)"):
        resolve("serve", flags_for("serve", pooling="rank"), env={})
    with pytest.raises(ConfigError, match=r"^LLAMA_ARG_POOLING must be one of"):
        resolve("serve", env={"LLAMA_ARG_POOLING": "max"})
    with pytest.raises(ConfigError, match=r"^--pooling applies to serve, not generate"):
        resolve("generate", flags_for("generate", pooling="mean"), env={})
    seen = []
    monkeypatch.setattr(serving, "serve_forever", seen.append)
    result = CliRunner().invoke(app, ["serve", "--pooling", "last", "--port", "0"])
    assert result.exit_code == 0, result.output
    assert seen[0].server.pooling == "last"
