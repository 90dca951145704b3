"""`python -m bench decode-sweep` (bench/decode.py): one tiny row width runs end to end and prints a row
per product kind, each with its GB/s and its fraction of the measured read bandwidth; the bandwidth
probe is positive."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

KINDS = ("qkv", "o", "gate_up", "down", "head", "step")


def test_read_bandwidth_is_positive():
    from bench.decode import read_bandwidth

    assert read_bandwidth(1, mib=16, reps=1) > 0
    assert read_bandwidth(2, mib=16, reps=1) > 0


def test_a_tiny_sweep_prints_a_row_per_product_kind(tmp_path):
    done = subprocess.run([sys.executable, "-m", "bench", "decode-sweep", "--hidden", "256", "--layers", "1",
                           "--ffn", "512", "--steps", "2", "--threads", "1", "--bw-mib", "32",
                           "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert "avx2" in lines[0] and "GB/s" in lines[1]
    header = next(i for i, line in enumerate(lines) if line.split()[:3] == ["hidden", "thr", "kind"])
    assert lines[header].split()[-3:] == ["GB/s", "of", "bus"]
    rows = {line.split()[2]: line.split() for line in lines[header + 1:]}
    assert set(rows) == set(KINDS)
    for kind, cells in rows.items():
        assert cells[0] == "256" and cells[1] == "1" and len(cells) == 8, cells
        float(cells[6]), float(cells[7])  # GB/s and the fraction (nan where the kind's time is below the noise)
    assert "Q6_K" in rows["head"][3] and float(rows["head"][4]) > 1  # the tied 49,152-row head, MB
    assert float(rows["head"][6]) > 0 and float(rows["head"][7]) > 0
    assert not list(tmp_path.iterdir())  # the file is deleted without --keep
