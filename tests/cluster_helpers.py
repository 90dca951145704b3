"""Launch `mlxcel-py serve` as two ranks on 127.0.0.1, the way `mlx.launch --backend ring` does.

mlx.launch gives each rank MLX_RANK and MLX_HOSTFILE (a JSON list of each rank's
"ip:port"); doing the same here keeps each rank's pid and exit status in the test's hands.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import httpx
import pytest

START_TIMEOUT_S = 90.0  # two cold processes importing MLX and FastAPI on a busy 2-core machine
PROBE = """
import mlx.core as mx
group = mx.distributed.init(strict=True, backend="ring")
total = mx.distributed.all_sum(mx.array([group.rank() + 1.0]))
print(total.item())
"""


def free_ports(count: int) -> list[int]:
    """Ports the kernel says are free now (a small race: the ranks bind them a moment later)."""
    socks = [socket.socket() for _ in range(count)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def write_hostfile(folder: Path, size: int) -> Path:
    path = folder / "hosts.json"
    path.write_text(json.dumps([[f"127.0.0.1:{port}"] for port in free_ports(size)]))
    return path


def rank_env(rank: int, hostfile: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLX_", "PYTEST_"))}
    return env | {"MLX_RANK": str(rank), "MLX_HOSTFILE": str(hostfile), "COLUMNS": "200"}


def ring_unavailable(folder: Path) -> Optional[str]:
    """Why two ring ranks cannot start here, or None when an all_sum between them works."""
    hostfile = write_hostfile(folder, 2)
    procs = [subprocess.Popen([sys.executable, "-c", PROBE], env=rank_env(r, hostfile),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(2)]
    outputs = []
    for proc in procs:
        try:
            outputs.append(proc.communicate(timeout=60)[0])
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            return "two ring ranks on 127.0.0.1 did not finish an all_sum within 60 s"
    if any(p.returncode != 0 for p in procs) or any(o.strip().splitlines()[-1:] != ["3.0"] for o in outputs):
        return f"two ring ranks on 127.0.0.1 failed: {outputs[0].strip()[-300:]}"
    return None


@dataclass
class LocalCluster:
    """Two (or more) ranks of `mlxcel-py serve` on loopback; rank 0 answers HTTP on `url`."""

    folder: Path
    model: str
    args: tuple[str, ...] = ()
    size: int = 2
    rank_args: dict[int, tuple[str, ...]] = field(default_factory=dict)  # appended for one rank
    rank_models: dict[int, str] = field(default_factory=dict)  # one rank's -m instead of `model`
    procs: list[subprocess.Popen] = field(default_factory=list)
    port: int = 0

    def start(self) -> "LocalCluster":
        self.spawn()
        self.wait_ready()
        return self

    def spawn(self) -> None:
        hostfile = write_hostfile(self.folder, self.size)
        self.port = free_ports(1)[0]
        script = str(Path(sys.executable).parent / "mlxcel-py")
        for rank in range(self.size):
            env = rank_env(rank, hostfile)
            if self.size == 1:  # one plain process: no launcher variables at all
                env = {k: v for k, v in env.items() if not k.startswith("MLX_")}
            log = open(self.log_path(rank), "w")
            model = self.rank_models.get(rank, self.model)
            cmd = [script, "serve", "-m", model, "--port", str(self.port), "--log-level", "info", *self.args]
            argv = cmd + list(self.rank_args.get(rank, ()))
            self.procs.append(subprocess.Popen(argv, env=env, stdout=log, stderr=log))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self, **kwargs) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=60.0, **kwargs)

    def log_path(self, rank: int) -> Path:
        return self.folder / f"rank{rank}.log"

    def log(self, rank: int) -> str:
        return self.log_path(rank).read_text(errors="replace")

    def wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            for rank, proc in enumerate(self.procs):
                if proc.poll() is not None:
                    raise AssertionError(f"rank {rank} exited with {proc.returncode}:\n{self.log(rank)[-3000:]}")
            try:
                if httpx.get(self.url + "/health", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"the cluster was not ready in {START_TIMEOUT_S} s:\n{self.log(0)[-3000:]}")

    def wait_exit(self, rank: int, timeout: float) -> Optional[int]:
        """The rank's exit status, or None if it is still running after `timeout` seconds."""
        try:
            return self.procs[rank].wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def signal(self, rank: int, sig: int) -> None:
        self.procs[rank].send_signal(sig)

    def stop(self) -> None:
        """Kill whatever is still running (the test's own processes, by pid)."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
                proc.wait(10)


def start_cluster(folder: Path, model: str, *args: str) -> LocalCluster:
    """A started cluster; skips the test, with the reason, where two ring ranks cannot run at all."""
    cluster = LocalCluster(folder, model, args)
    try:
        return cluster.start()
    except AssertionError:
        cluster.stop()
        reason = ring_unavailable(folder)  # probed only on failure: it costs two more cold starts
        if reason is not None:
            pytest.skip(f"the MLX ring backend cannot run here: {reason}")
        raise


QWEN2_LAYERS = 3


def tiny_qwen2():
    """A qwen2 model (mlx-lm has both shard() and a pipeline split for it) with the tiny llama's
    weights and random q/k/v biases, so its greedy text is not degenerate."""
    import mlx.core as mx
    import numpy as np
    from mlx_lm.models.qwen2 import Model, ModelArgs

    from tiny import CONTEXT, FFN, HEADS, HIDDEN, KV_HEADS, tiny_model, tiny_weights

    vocab = len(tiny_model().tokenizer)
    args = ModelArgs(model_type="qwen2", hidden_size=HIDDEN, num_hidden_layers=QWEN2_LAYERS,
                     intermediate_size=FFN, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                     rms_norm_eps=1e-5, vocab_size=vocab, rope_theta=10000.0,
                     max_position_embeddings=CONTEXT, tie_word_embeddings=True)
    model = Model(args)
    weights = {k: mx.array(v) for k, v in tiny_weights(vocab, seed=1).items()}
    rng = np.random.default_rng(2)
    for i in range(QWEN2_LAYERS):
        src = f"model.layers.{i % 2}."  # the tiny llama has 2 layers; the third reuses the first's
        for name, value in list(weights.items()):
            if name.startswith(src) and i >= 2:
                weights[name.replace(src, f"model.layers.{i}.", 1)] = value
        for proj, rows in (("q_proj", HEADS), ("k_proj", KV_HEADS), ("v_proj", KV_HEADS)):
            bias = rng.standard_normal(rows * (HIDDEN // HEADS)).astype(np.float32) * 0.1
            weights[f"model.layers.{i}.self_attn.{proj}.bias"] = mx.array(bias)
    model.load_weights(list(weights.items()), strict=True)
    mx.eval(model.parameters())
    return model


def write_qwen2_dir(folder: Path) -> Path:
    """`tiny_qwen2` as an mlx-lm model directory (config.json, safetensors, tokenizer)."""
    from mlx_lm.utils import save_model

    from tiny import tiny_model

    model = tiny_qwen2()
    folder.mkdir(parents=True, exist_ok=True)
    save_model(folder, model)
    config = {k: v for k, v in vars(model.args).items() if isinstance(v, (int, float, str, bool))}
    (folder / "config.json").write_text(json.dumps(config))
    tiny_model().tokenizer._tokenizer.save_pretrained(str(folder))
    return folder
