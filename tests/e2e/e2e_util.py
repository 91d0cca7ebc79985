"""Helpers shared by the e2e scripts that drive hetrain under mpirun: the environment,
the ok/FAIL report, and running commands."""
import json
import os
import shutil
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1", OMP_NUM_THREADS="1")
failures = []


def check(name, cond, detail=""):
    print(("ok   " if cond else "FAIL ") + name + ("" if cond else f"  [{detail}]"))
    if not cond:
        failures.append(name)


def finish(scratch=None):
    """Prints the count of failed checks and returns the script's exit status. The
    scratch directory is removed when every check passed and kept, named, otherwise."""
    print(f"{len(failures)} failed")
    if scratch and not failures:
        shutil.rmtree(scratch, ignore_errors=True)
    elif scratch:
        print(f"kept for inspection: {scratch}")
    return 1 if failures else 0


def run(cmd, timeout=180):
    return subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=timeout)


def mpirun(hetrain, n, args, timeout=180, wrapper=None):
    return run(["mpirun", "-np", str(n), "--bind-to", "none"] + (wrapper or []) + [hetrain] + args, timeout)


def load(path):
    with open(path) as f:
        return json.load(f)
