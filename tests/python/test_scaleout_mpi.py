"""MPI through mpi4py 4.x: dlbridge tensors, and through convert any
framework's, as send/receive buffers (tests/mpi/rank_buffers.py), on
loopback with Debian's OpenMPI.  Each run is a subprocess with a timeout, so
a hang fails the test instead of blocking the suite."""

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

RANK_SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "mpi" / "rank_buffers.py"


def mpi_env():
    env = dict(os.environ)
    # Loopback only: shared memory and TCP on lo, no network probing.
    env.setdefault("OMPI_MCA_btl", "self,tcp,vader")
    env.setdefault("OMPI_MCA_btl_tcp_if_include", "lo")
    env.setdefault("OMPI_MCA_oob_tcp_if_include", "lo")
    env.setdefault("OMPI_MCA_plm_rsh_agent", "")
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return env


def mpiexec():
    exe = shutil.which("mpiexec")
    if exe is None:
        pytest.skip("mpiexec not found: install Debian's openmpi-bin "
                    "(scripts/bootstrap does)")
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        pytest.skip("mpi4py is not installed (requirements/test.txt pins it)")
    return exe


@pytest.mark.parametrize("ranks", [2, 4])
def test_point_to_point_and_allreduce(ranks):
    exe = mpiexec()
    try:
        res = subprocess.run(
            [exe, "--oversubscribe", "--allow-run-as-root", "-n", str(ranks),
             sys.executable, str(RANK_SCRIPT)],
            capture_output=True, text=True, timeout=90, env=mpi_env())
    except subprocess.TimeoutExpired as exc:
        pytest.fail("mpiexec -n %d hung (killed after 90 s): %s" % (ranks, exc))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "ok %d ranks" % ranks in res.stdout
