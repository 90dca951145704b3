"""deploy/nginx.conf in front of two single-process servers on 127.0.0.1 (only the ports change).

Requests flow; one conversation (X-Session-Id) stays on one replica, so its second turn hits
that replica's prompt cache; different conversations use both replicas; a replica that
goes away is routed around. Part of `make test-distributed`.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

import tiny
from cluster_helpers import LocalCluster, free_ports
from server_helpers import GREEDY

pytestmark = pytest.mark.cluster_extended
CONFIG = Path(__file__).resolve().parents[1] / "deploy" / "nginx.conf"
SYSTEM = "You are a careful assistant. Answer briefly, in plain words, and say when you do not know. " * 2


def finished(url: str) -> int:
    text = httpx.get(url + "/metrics", timeout=10).text
    return int(sum(s.value for f in text_string_to_metric_families(text) if f.name == "mlxcel_requests"
                   for s in f.samples if s.name == "mlxcel_requests_total"))


@pytest.fixture(scope="module")
def balanced(tmp_path_factory):
    nginx = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    if nginx is None:
        pytest.skip("nginx is not installed (Debian: apt-get install nginx-light)")
    folder = tmp_path_factory.mktemp("nginx")
    tiny.tiny_model()
    model = str(tiny._tmpdir() / "tiny-0.gguf")
    replicas = [LocalCluster(folder / f"r{i}", model, size=1) for i in range(2)]
    for r in replicas:
        r.folder.mkdir()
        r.start()
    front = free_ports(1)[0]
    conf = CONFIG.read_text().replace("127.0.0.1:8080", f"127.0.0.1:{front}")
    for i, r in enumerate(replicas):
        conf = conf.replace(f"127.0.0.1:808{i + 1}", f"127.0.0.1:{r.port}")
    (folder / "nginx.conf").write_text(conf)
    log = open(folder / "nginx.log", "w")
    proc = subprocess.Popen([nginx, "-p", str(folder), "-c", str(folder / "nginx.conf"), "-g", "daemon off;"],
                            stdout=log, stderr=log)
    url = f"http://127.0.0.1:{front}"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.1)
    yield url, replicas
    proc.terminate()
    proc.wait(10)
    for r in replicas:
        r.stop()


def chat(url: str, session: str, messages: list[dict]) -> dict:
    body = {"messages": messages, "max_tokens": 8, **GREEDY}
    response = httpx.post(url + "/v1/chat/completions", json=body, headers={"X-Session-Id": session}, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def test_requests_flow_and_stream_through_nginx(balanced):
    url, replicas = balanced
    body = {"prompt": "The quick brown fox", "max_tokens": 12, **GREEDY}
    direct = httpx.post(replicas[0].url + "/v1/completions", json=body, timeout=60).json()
    proxied = httpx.post(url + "/v1/completions", json=body, timeout=60).json()
    assert proxied["choices"][0]["text"] == direct["choices"][0]["text"]
    with httpx.stream("POST", url + "/v1/completions", json={**body, "stream": True}, timeout=60) as response:
        frames = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert frames[-1] == "data: [DONE]" and len(frames) >= 3


def test_a_conversation_stays_on_one_replica_and_hits_its_prompt_cache(balanced):
    url, replicas = balanced
    before = [finished(r.url) for r in replicas]
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What is the capital of France?"}]
    first = chat(url, "conversation-1", messages)
    messages += [first["choices"][0]["message"], {"role": "user", "content": "And of Spain?"}]
    second = chat(url, "conversation-1", messages)
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    served = [finished(r.url) - b for r, b in zip(replicas, before)]
    assert sorted(served) == [0, 2], served


def test_conversations_spread_over_both_replicas_and_survive_one_going_away(balanced):
    url, replicas = balanced
    before = [finished(r.url) for r in replicas]
    sessions = [f"conversation-{i}" for i in range(10, 20)]
    question = [{"role": "user", "content": "Hello"}]
    for s in sessions:
        chat(url, s, question)
    served = [finished(r.url) - b for r, b in zip(replicas, before)]
    assert all(n > 0 for n in served) and sum(served) == len(sessions), served
    replicas[1].stop()  # every conversation it held now goes to the other replica
    for s in sessions:
        chat(url, s, question)
