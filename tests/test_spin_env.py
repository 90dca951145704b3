"""Importing mlxcel_py bounds how long numba's OpenMP decode worker spins between steps."""

import os
import subprocess
import sys

CODE = "import os, mlxcel_py; print(os.environ['GOMP_SPINCOUNT'])"


def test_gomp_workers_spin_briefly_unless_the_environment_says_otherwise():
    env = {k: v for k, v in os.environ.items() if k != "GOMP_SPINCOUNT"}
    assert subprocess.run([sys.executable, "-c", CODE], env=env, capture_output=True, text=True).stdout.strip() == "20000"
    env["GOMP_SPINCOUNT"] = "300000"
    assert subprocess.run([sys.executable, "-c", CODE], env=env, capture_output=True, text=True).stdout.strip() == "300000"
