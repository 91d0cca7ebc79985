"""Helpers shared by the e2e scripts that drive hetrain under mpirun: the environment,
the ok/FAIL report, what this machine lacks, and running commands. A script runs every
check it can here; when some could not run and none failed, it exits 77, which meson
reports as skipped (see finish)."""
import glob
import json
import os
import shutil
import struct
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1", OMP_NUM_THREADS="1")
SKIP = 77
FASHION_MNIST = "/usr/share/datasets/fashion-mnist"
failures = []
SHM = "/dev/shm"


def _segments():
    """Open MPI's shared-memory segments now in /dev/shm."""
    try:
        return {f for f in os.listdir(SHM) if f.startswith("vader_segment.")}
    except OSError:
        return set()


_SEGMENTS_AT_START = _segments()


def _mapped_segments():
    """The segments some live process still maps."""
    mapped = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/maps") as f:
                for line in f:
                    if SHM + "/vader_segment." in line:
                        mapped.add(os.path.basename(line.split()[-1]))
        except OSError:
            continue
    return mapped


def remove_stale_segments():
    """A job this script stopped or killed leaves its ranks' segments behind (a rank
    removes its own only on a clean exit): remove those that appeared while the script
    ran and that no live process maps, so another job's, running beside it, stay."""
    stale = (_segments() - _SEGMENTS_AT_START) - _mapped_segments()
    for name in stale:
        try:
            os.remove(os.path.join(SHM, name))
        except OSError:
            pass


def have_fashion_mnist():
    """Whether the Fashion-MNIST dataset is installed: training, probing with a model and
    evaluating need it (planning does not: it plans from the model's shapes)."""
    return os.path.isdir(FASHION_MNIST)


def check(name, cond, detail=""):
    print(("ok   " if cond else "FAIL ") + name + ("" if cond else f"  [{detail}]"))
    if not cond:
        failures.append(name)


def finish(scratch=None, missing=()):
    """Prints the count of failed checks and returns the script's exit status: 1 when a
    check failed; else SKIP when `missing` names something this machine lacks, so some
    checks could not run; else 0. The scratch directory is removed when no check failed
    and kept, named, otherwise."""
    print(f"{len(failures)} failed")
    remove_stale_segments()
    if scratch and not failures:
        shutil.rmtree(scratch, ignore_errors=True)
    elif scratch:
        print(f"kept for inspection: {scratch}")
    if failures:
        return 1
    if missing:
        print("SKIP: some checks need what this machine lacks: " + "; ".join(missing))
        return SKIP
    return 0


def run(cmd, timeout=180):
    return subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=timeout)


def mpirun(hetrain, n, args, timeout=180, wrapper=None):
    return run(["mpirun", "-np", str(n), "--bind-to", "none"] + (wrapper or []) + [hetrain] + args, timeout)



def rank_pids(mpirun_pid):
    """{world rank: pid} of mpirun's children, from OMPI_COMM_WORLD_RANK in their environment."""
    pids = {}
    for d in glob.glob("/proc/[0-9]*"):
        try:
            with open(d + "/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid != mpirun_pid:
                continue
            with open(d + "/environ", "rb") as f:
                env = dict(e.split(b"=", 1) for e in f.read().split(b"\0") if b"=" in e)
            if b"OMPI_COMM_WORLD_RANK" in env:
                pids[int(env[b"OMPI_COMM_WORLD_RANK"])] = int(os.path.basename(d))
        except (OSError, ValueError, IndexError):
            continue
    return pids


def records(run_dir):
    """A run directory's metrics.jsonl, one dict per record."""
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def safetensors(path):
    """(metadata, {name: (dtype, raw bytes)}) of a safetensors checkpoint."""
    with open(path, "rb") as f:
        blob = f.read()
    n = struct.unpack("<Q", blob[:8])[0]
    header, data = json.loads(blob[8:8 + n]), blob[8 + n:]
    return header.get("__metadata__", {}), {k: (v["dtype"], data[v["data_offsets"][0]:v["data_offsets"][1]])
                                            for k, v in header.items() if k != "__metadata__"}


def load(path):
    with open(path) as f:
        return json.load(f)


def save(path, data):
    """Writes `data` as JSON to `path` (a config or plan a case varies); returns the path."""
    with open(path, "w") as f:
        json.dump(data, f)
    return path
