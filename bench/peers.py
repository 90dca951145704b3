"""Peer servers for the benchmarks: mlx_lm.server on a dense float32 conversion of the default
model (OpenBLAS preloaded), and llama-server where it is installed; and what every benchmark shares:
the machine's description for the record, and one llama-server process driven by its own /completion
API (`LlamaServer`, the speculative benchmark's llama-server arm).

    python -m bench peers convert-default [--out DIR]   # write the mlx-lm directory (once)
    python -m bench peers check [--step 2048]           # start mlx_lm.server on it, one request, stop
    python -m bench peers status                        # which peers can run here

llama-server is found as $LLAMA_SERVER or `llama-server` on PATH; where neither exists the
benchmarks report it as "not run".
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Optional

from mlxcel_py.loadtest.servers import Arm, ManagedServer, ServerSpec, free_port

ROOT = Path(__file__).resolve().parents[1]
OPENBLAS = "/lib/x86_64-linux-gnu/libopenblas.so.0"
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mlxcel-py" / "bench"
DEFAULT_DIR = CACHE / "smollm2-135m-instruct-f32"


def convert_default(out: Path = DEFAULT_DIR) -> Path:
    """Save the default model, dense float32, as an mlx-lm directory: config.json,
    model.safetensors and the tokenizer files."""
    from mlxcel_py.models.cpu.blas import preload_blas

    preload_blas("auto")
    import mlx.core as mx
    from mlx.utils import tree_flatten

    from mlxcel_py.models import load_model

    lm = load_model(None, dense=True)
    out.mkdir(parents=True, exist_ok=True)
    config = dataclasses.asdict(lm.model.args)
    config["eos_token_id"] = sorted(lm.eos_token_ids)
    config["bos_token_id"] = lm.bos_token_id
    (out / "config.json").write_text(json.dumps(config, indent=1))
    mx.save_safetensors(str(out / "model.safetensors"), dict(tree_flatten(lm.model.parameters())))
    lm.tokenizer._tokenizer.save_pretrained(str(out))
    return out


def ensure_converted(out: Path = DEFAULT_DIR) -> Path:
    """The conversion, made in a child process (the BLAS preload must precede mlx) if missing."""
    if not (out / "model.safetensors").is_file():
        subprocess.run([sys.executable, "-m", "bench", "peers", "convert-default", "--out", str(out)], cwd=ROOT,
                       check=True)
    return out


def mlx_lm_flags() -> set[str]:
    """The long flags this mlx_lm.server accepts (empty when it is not installed)."""
    got = subprocess.run([sys.executable, "-m", "mlx_lm.server", "--help"], capture_output=True, text=True)
    return set(re.findall(r"--[a-z][a-z0-9-]+", got.stdout)) if got.returncode == 0 else set()


def mlx_lm_spec(name: str, model_dir: Path, step: Optional[int], port: Optional[int] = None) -> ServerSpec:
    """mlx_lm.server on loopback with a prefill step size (None: its default)."""
    port = port or free_port()
    argv = [sys.executable, "-m", "mlx_lm.server", "--model", str(model_dir), "--host", "127.0.0.1",
            "--port", str(port), "--log-level", "WARNING"]
    if step is not None:
        argv += ["--prefill-step-size", str(step)]
    env = {"LD_PRELOAD": OPENBLAS} if os.path.exists(OPENBLAS) else {}
    if env and "OPENBLAS_CORETYPE" not in os.environ:
        # The same OpenBLAS kernels our server picks (models/cpu/blas.py), so the comparison is fair.
        from mlxcel_py.models.cpu.blas import _cpu_flags, coretype_for

        coretype = coretype_for(_cpu_flags(), platform.machine())
        if coretype:
            env["OPENBLAS_CORETYPE"] = coretype
    return ServerSpec(name, tuple(argv), port, env)


def llama_server_binary() -> Optional[str]:
    return os.environ.get("LLAMA_SERVER") or shutil.which("llama-server")


def llama_server_spec(name: str, binary: str, gguf: str, batch: int, parallel: int,
                      port: Optional[int] = None) -> ServerSpec:
    """llama-server as the peer notes ran it: -c 16384 --kv-unified -t 2, and -b per arm."""
    port = port or free_port()
    argv = [binary, "-m", gguf, "--host", "127.0.0.1", "--port", str(port), "-c", "16384",
            "--parallel", str(parallel), "--kv-unified", "-t", str(os.cpu_count() or 2), "-b", str(batch)]
    return ServerSpec(name, tuple(argv), port)


def peer_arms(steps: tuple[int, ...] = (2048, 512)) -> tuple[list[Arm], dict[str, int], list[dict]]:
    """mlx_lm.server arms (name -> prefill step) and the status lines of every peer."""
    status = []
    flags = mlx_lm_flags()
    if not flags:
        status.append({"name": "mlx_lm.server", "status": "not run", "note": "mlx_lm.server is not installed"})
        arms: list[Arm] = []
    else:
        usable = steps if "--prefill-step-size" in flags else (None,)
        arms = [Arm(f"mlx_lm-step{s or 'default'}") for s in usable]
        note = "" if "--prefill-step-size" in flags else "no --prefill-step-size flag: default step only"
        status.append({"name": "mlx_lm.server", "status": "run", "note": note or "dense float32, OpenBLAS"})
    step_of = {a.name: (int(a.name.removeprefix("mlx_lm-step")) if a.name[-1].isdigit() else None) for a in arms}
    if llama_server_binary() is None:
        status.append({"name": "llama-server", "status": "not run",
                       "note": "not installed on this machine ($LLAMA_SERVER unset, none on PATH)"})
    return arms, step_of, status


def check(step: int) -> None:
    from mlxcel_py.loadtest.client import StreamLog, completion_body, new_client, stream_request

    model_dir = ensure_converted()
    async def one(url: str) -> StreamLog:
        log = StreamLog()
        async with new_client() as client:
            await stream_request(client, url + "/v1/completions", completion_body("The capital of France is", 8,
                                                                                   eos_ids={2}), log)
        return log

    with ManagedServer(mlx_lm_spec("mlx_lm-check", model_dir, step)) as server:
        log = asyncio.run(one(server.spec.url))
    print(f"mlx_lm.server: {len(log.token_times)} token frames, finish {log.finish_reason}, error {log.error}")


def machine() -> str:
    """One line for the record: the CPU model, cores, SIMD flags, the platform and the load average."""
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = next((line.split(":", 1)[1].strip() for line in cpu.splitlines() if line.startswith("Model name")), "?")
    flags = open("/proc/cpuinfo").read()
    simd = [f for f in ("avx2", "fma", "avx512f", "avx512_vnni", "amx_tile") if f" {f} " in flags]
    return f"{model}, {os.cpu_count()} cores, {'+'.join(simd)}; {platform.platform()}; load {os.getloadavg()[0]:.2f}"


def machine_lines() -> list[str]:
    """The CPU model, its avx2/avx512f flags and the load average, for the record (a line each)."""
    lines = []
    try:
        cpu = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        model = next((ln.split(":", 1)[1].strip() for ln in cpu.splitlines() if ln.startswith("Model name")), "?")
        flags = next((ln for ln in cpu.splitlines() if ln.startswith("Flags")), "").split()
        lines.append(f"cpu: {model}; cores {os.cpu_count()}; avx2 {'avx2' in flags}; avx512f {'avx512f' in flags}")
    except (OSError, subprocess.SubprocessError) as exc:
        lines.append(f"cpu: lscpu failed ({exc})")
    lines.append("uptime: " + subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    return lines


# llama-server driven by its own /completion API (the speculative benchmark's `--llama-server PATH`): the same
# GGUF, the same prompt token ids, greedy, the same thread count, plain vs `--spec-type ngram-simple`. Each arm
# starts its own llama-server on 127.0.0.1 (a free port), sends `streams` identical /completion requests at once
# (prompt cache off), and reads llama-server's own timings: one stream's tok/s is its `predicted_per_second`;
# several streams' the sum of theirs.


def _post(url: str, body: dict, timeout: float) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def _wait_healthy(base: str, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"llama-server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(base + "/health", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.25)  # polling a child's readiness: no event to wait on
    raise RuntimeError("llama-server did not become healthy in time")


class LlamaServer:
    """One llama-server process for an arm; `run(ids, ...)` -> (tok/s, tokens of stream 0, drafted, accepted)."""

    def __init__(self, binary: str, model: Path, threads: int, streams: int, spec: list[str]):
        self.port, self.streams = free_port(), streams
        cmd = [binary, "-m", str(model), "--host", "127.0.0.1", "--port", str(self.port), "-t", str(threads),
               "-tb", str(threads), "-np", str(streams), "-c", str(2048 * streams), "--no-warmup", *spec]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.base = f"http://127.0.0.1:{self.port}"
        _wait_healthy(self.base, self.proc)

    def run(self, ids: list[int], max_tokens: int, ignore_eos: bool) -> tuple[float, list[int], int, int]:
        body = {"prompt": ids, "n_predict": max_tokens, "temperature": 0.0, "top_k": 1, "cache_prompt": False,
                "ignore_eos": ignore_eos, "return_tokens": True, "seed": 0}
        results: list = [None] * self.streams

        def one(i: int) -> None:
            results[i] = _post(self.base + "/completion", body, timeout=600)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(self.streams)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=600)
        timings = [r["timings"] for r in results]
        tps = sum(t["predicted_per_second"] for t in timings)
        drafted = sum(t.get("draft_n", 0) for t in timings)
        accepted = sum(t.get("draft_n_accepted", 0) for t in timings)
        return tps, list(results[0].get("tokens", [])), drafted, accepted

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)


def llama_spec_args(ngram: int, draft_max: int) -> list[str]:
    """llama-server's n-gram arm with our lookup's n-gram and longest draft."""
    return ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", str(ngram),
            "--spec-ngram-simple-size-m", str(draft_max), "--spec-draft-n-max", str(draft_max)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    conv = sub.add_parser("convert-default", help="write the dense float32 mlx-lm directory")
    conv.add_argument("--out", type=Path, default=DEFAULT_DIR)
    chk = sub.add_parser("check", help="start mlx_lm.server on the conversion and send one request")
    chk.add_argument("--step", type=int, default=2048)
    sub.add_parser("status", help="which peers can run here")
    args = parser.parse_args()
    if args.cmd == "convert-default":
        print(convert_default(args.out))
    elif args.cmd == "check":
        check(args.step)
    else:
        arms, _, status = peer_arms()
        for s in status:
            print(f"{s['name']}: {s['status']} ({s['note']})")
        binary = llama_server_binary()
        if binary:
            print(f"llama-server: {binary}")

