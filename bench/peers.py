"""Peer servers for the benchmarks: mlx_lm.server on a dense float32 conversion of the default
model (OpenBLAS preloaded), and llama-server where it is installed.

    python bench/peers.py convert-default [--out DIR]   # write the mlx-lm directory (once)
    python bench/peers.py check [--step 2048]           # start mlx_lm.server on it, one request, stop
    python bench/peers.py status                        # which peers can run here

llama-server is found as $LLAMA_SERVER or `llama-server` on PATH; where neither exists the
benchmarks report it as "not run".
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Optional

from mlxcel_py.loadtest.servers import Arm, ManagedServer, ServerSpec, free_port

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
        subprocess.run([sys.executable, __file__, "convert-default", "--out", str(out)], check=True)
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
        import platform

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


if __name__ == "__main__":
    main()
