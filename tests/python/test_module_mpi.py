"""seqpar's Python module under mpirun -np 2 and -np 4, sharing mpi4py's MPI world
(mpi_module_check.py), and the example script on threads and on MPI."""

import os
import subprocess
import sys

import pytest

from module_env import SEQPAR_PYTHONPATH, mpirun

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(HERE, "..", "..", "examples", "ring_attention.py")


@pytest.mark.parametrize("np_", [2, 4])
def test_every_strategy_on_mpi(np_):
    r = mpirun(np_, os.path.join(HERE, "mpi_module_check.py"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count(" ok ") == 16, r.stdout


def test_example_on_threads_and_mpi():
    env = dict(os.environ, PYTHONPATH=SEQPAR_PYTHONPATH)
    r = subprocess.run([sys.executable, EXAMPLE, "--ranks", "4"], env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0 and "max |out - ref|" in r.stdout, r.stdout + r.stderr
    r = mpirun(2, EXAMPLE, "--mpi")
    assert r.returncode == 0 and "max |out - ref|" in r.stdout, r.stdout + r.stderr
