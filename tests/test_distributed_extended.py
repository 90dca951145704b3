"""More two-rank cases, kept out of `make test` for time (`make test-distributed` runs them):
a stalled follower, a clean stop, pipeline parallelism, and the real `mlx.launch` recipe."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

import tiny
from cluster_helpers import LocalCluster, free_ports, start_cluster, write_qwen2_dir
from server_helpers import GREEDY

pytestmark = pytest.mark.cluster_extended
PROMPTS = [{"prompt": "The quick brown fox", "max_tokens": 24}, {"prompt": "Paris is the capital of", "max_tokens": 16}]


@pytest.fixture(scope="module")
def tiny_path() -> str:
    tiny.tiny_model()
    return str(tiny._tmpdir() / "tiny-0.gguf")


def texts(url: str) -> list[str]:
    with httpx.Client(base_url=url, timeout=60) as client:
        return [client.post("/v1/completions", json={**p, **GREEDY}).json()["choices"][0]["text"] for p in PROMPTS]


def stream_until_error(cluster: LocalCluster, act) -> dict:
    """Stream a long greedy completion, call `act()` after 3 chunks, return the error payload."""
    body = {"prompt": "The quick brown fox", "max_tokens": 100000, "stream": True, **GREEDY}
    with cluster.client() as client, client.stream("POST", "/v1/completions", json=body) as response:
        lines = (line[len("data: "):] for line in response.iter_lines() if line.startswith("data: "))
        for _ in range(3):
            next(lines)
        act()
        rest = list(lines)
    assert rest[-1] == "[DONE]"
    return json.loads(rest[-2])["error"]


def test_a_stalled_follower_fails_requests_within_the_timeout(tiny_path, tmp_path):
    cluster = start_cluster(tmp_path, tiny_path, "--distributed-timeout", "2")
    try:
        stopped = time.monotonic()
        error = stream_until_error(cluster, lambda: cluster.signal(1, signal.SIGSTOP))
        failed_after = time.monotonic() - stopped
        assert "no answer from the other ranks for 2." in error["message"] and "during a step" in error["message"]
        assert 2.0 <= failed_after < 10, failed_after
        assert cluster.client().get("/health").json()["status"] == "error"
        assert cluster.wait_exit(0, timeout=20) == 1
        cluster.signal(1, signal.SIGCONT)  # rank 0 is gone: the follower notices and leaves
        assert cluster.wait_exit(1, timeout=20) == 1
        assert "rank 1" in cluster.log(1) and "rank 0" in cluster.log(1)
    finally:
        cluster.stop()


def test_a_rank_that_cannot_load_stops_every_rank_with_its_reason(tiny_path, tmp_path):
    missing = str(tmp_path / "missing.gguf")
    cluster = LocalCluster(tmp_path, tiny_path, rank_models={1: missing})  # one -m a rank: a second is a second model
    cluster.spawn()
    try:
        reason = f"cannot serve on every rank: rank 1: model path not found: {missing}"
        for rank in (0, 1):
            assert cluster.wait_exit(rank, timeout=90) == 1
            assert f"error: {reason}" in " ".join(cluster.log(rank).split())  # rich wraps long lines
    finally:
        cluster.stop()


def test_ctrl_c_stops_rank_0_cleanly_and_it_stops_the_followers(tiny_path, tmp_path):
    cluster = start_cluster(tmp_path, tiny_path)
    try:
        assert len(texts(cluster.url)) == 2
        for rank in (0, 1):  # a terminal's Ctrl-C reaches every rank
            cluster.signal(rank, signal.SIGINT)
        assert cluster.wait_exit(0, timeout=30) == 0
        assert cluster.wait_exit(1, timeout=30) == 0
        assert "rank 1: stopped by rank 0" in cluster.log(1)
    finally:
        cluster.stop()


def test_pipeline_parallel_equals_one_process_and_followers_leave_with_rank_0(tmp_path):
    model = str(write_qwen2_dir(tmp_path / "qwen2-tiny"))
    single = LocalCluster(tmp_path / "single", model, size=1)
    (tmp_path / "single").mkdir()
    single.start()
    try:
        expected = texts(single.url)
    finally:
        single.stop()
    (tmp_path / "pipe").mkdir()
    cluster = start_cluster(tmp_path / "pipe", model, "--distributed", "pipeline", "--distributed-timeout", "5")
    try:
        assert "rank 0/2: layers 1-2 of 3" in cluster.log(0) and "rank 1/2: layers 0-0 of 3" in cluster.log(0)
        assert texts(cluster.url) == expected
        cluster.signal(0, signal.SIGKILL)
        assert cluster.wait_exit(1, timeout=20) == 1
        # The ring's error at once, or (when MLX's ring leaves the wait hanging) the watchdog.
        assert "rank 1 stopped following rank 0" in cluster.log(1) or "no record from rank 0" in cluster.log(1)
    finally:
        cluster.stop()


def test_the_mlx_launch_recipe(tiny_path, tmp_path):
    """The docs' one-host recipe, verbatim but for the ports: mlx.launch -n 2 --backend ring."""
    bin_dir = Path(sys.executable).parent
    ring_port, http_port = free_ports(2)
    cmd = [str(bin_dir / "mlx.launch"), "-n", "2", "--backend", "ring", "--starting-port", str(ring_port),
           "--python", sys.executable, str(bin_dir / "mlxcel-py"), "serve", "-m", tiny_path, "--port", str(http_port)]
    log = open(tmp_path / "launch.log", "w")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLX_", "PYTEST_"))}
    launcher = subprocess.Popen(cmd, stdout=log, stderr=log, env=env, start_new_session=True)
    try:
        url = f"http://127.0.0.1:{http_port}"
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and launcher.poll() is None:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        assert len(texts(url)) == 2
        ranks = launched_ranks(launcher.pid)
        assert sorted(ranks) == [0, 1]
        os.kill(ranks[0], signal.SIGTERM)  # stop rank 0 as a service manager would
        assert launcher.wait(60) == 0  # mlx.launch exits once every rank has
        output = (tmp_path / "launch.log").read_text()
        assert "rank 1: stopped by rank 0" in output
        assert "exited with code" not in output and "was killed" not in output  # mlx.launch's warnings
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait(10)


def launched_ranks(launcher: int) -> dict[int, int]:
    """rank -> pid of the processes mlx.launch started (its shell children exec the command)."""
    deadline, found = time.monotonic() + 10, {}
    while time.monotonic() < deadline and len(found) < 2:
        for task in Path(f"/proc/{launcher}/task").iterdir():
            for pid in (task / "children").read_text().split():
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                rank = [e for e in environ if e.startswith(b"MLX_RANK=")]
                if rank:
                    found[int(rank[0].split(b"=")[1])] = int(pid)
        time.sleep(0.1)
    return found
