#!/usr/bin/env python3
"""The config's "device" key at `hetrain train`'s start: "cuda" and "cuda:0" (alone or as
the entry of a list, one device per world rank) on a machine or build without a usable GPU
fail before any work (exit 1, one stderr line naming the device, the reason and what was
expected; no run directory, no data read); "auto" falls back to the CPU, says so, and
trains; a list trains each rank on its own entry, and one whose length is not the world
size is a config error. Where a GPU is usable ("auto" chose one) the
failure cases cannot run here and the script exits 77 (skipped) after the rest.

usage: test_device.py HETRAIN"""
import json
import os
import sys
import tempfile

import e2e_util as u

HETRAIN = os.path.abspath(sys.argv[1])


def config(device, data_dir):
    return {"model": {"type": "mlp", "hidden": [16]},
            "data": {"dataset": "fashion_mnist", "dir": data_dir},
            "train": {"steps": 2, "batch_size": 16, "eval_max_samples": 64, "log_every": 1,
                      "optimizer": {"lr": 0.001}},
            "device": device}


def write(tmp, name, cfg):
    path = os.path.join(tmp, name + ".json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    return path


def main():
    missing = []
    tmp = tempfile.mkdtemp(prefix="hetrain-device-")
    gpu_usable = None
    if u.have_fashion_mnist():
        run_dir = os.path.join(tmp, "auto")
        r = u.run([HETRAIN, "train", write(tmp, "auto", config("auto", u.FASHION_MNIST)), "--run-dir", run_dir])
        fell_back = 'device "auto": ' in r.stdout and "; training on the CPU" in r.stdout
        chose_gpu = 'device "auto": cuda:' in r.stdout
        gpu_usable = chose_gpu
        u.check('"auto": exit 0, and a note of what it chose (the CPU, with the reason, or a GPU)',
                r.returncode == 0 and (fell_back or chose_gpu), (r.returncode, r.stdout[-400:], r.stderr[-400:]))
        if fell_back:
            note = next(l for l in r.stdout.splitlines() if l.startswith('device "auto": '))
            u.check('"auto" on the CPU: the note says why (no CUDA backend in the build, or no usable GPU)',
                    "no CUDA backend" in note or "no usable GPU" in note, note)
        resolved = os.path.join(run_dir, "config.json")
        u.check('"auto": the resolved config records the device as written',
                os.path.exists(resolved) and json.load(open(resolved)).get("device") == "auto")
        # One device per world rank: a list of one for one process trains, and keeps the
        # list in the resolved config; under mpirun each rank takes its own entry.
        run_dir = os.path.join(tmp, "list-one")
        r = u.run([HETRAIN, "train", write(tmp, "list-one", config(["cpu"], u.FASHION_MNIST)), "--run-dir", run_dir])
        resolved = os.path.join(run_dir, "config.json")
        u.check('["cpu"] for one process: exit 0, and the resolved config keeps the list',
                r.returncode == 0 and os.path.exists(resolved) and json.load(open(resolved)).get("device") == ["cpu"],
                (r.returncode, r.stderr[-400:]))
        run_dir = os.path.join(tmp, "list-two")
        r = u.mpirun(HETRAIN, 2, ["train", write(tmp, "list-two", config(["cpu", "auto"], u.FASHION_MNIST)),
                                  "--run-dir", run_dir])
        u.check('["cpu", "auto"] on 2 ranks: exit 0; rank 1 alone notes what "auto" chose, rank 0 trains on the CPU',
                r.returncode == 0 and 'rank 1: device "auto": ' in r.stdout and 'rank 0: device' not in r.stdout,
                (r.returncode, r.stdout[-600:], r.stderr[-600:]))
    else:
        missing.append("the Fashion-MNIST dataset (for the \"auto\" run)")

    # A list whose length is not the world size: a config error before any work.
    run_dir = os.path.join(tmp, "list-short")
    r = u.run([HETRAIN, "train", write(tmp, "list-long", config(["cpu", "cpu"], "/no/such/dataset")),
               "--run-dir", run_dir])
    lines = r.stderr.splitlines()
    u.check('["cpu", "cpu"] for one process: exit 2 with one line naming the list, the world size and the forms',
            r.returncode == 2 and len(lines) == 1
            and "device: a list of 2 devices for a job of 1 rank; expected one per world rank" in lines[0]
            and not os.path.exists(run_dir), (r.returncode, r.stderr))

    if gpu_usable:
        missing.append("a machine without a usable GPU (for the \"cuda\" failures)")
    else:
        # The data directory does not exist: the device is chosen before any data is read,
        # so the error names the device, not the dataset.
        # A list's entry fails as the same device given alone does.
        for device, written in [("cuda", "cuda"), ("cuda:0", "cuda:0"), ("cuda", ["cuda"])]:
            tag = device.replace(":", "-") + ("-list" if isinstance(written, list) else "")
            run_dir = os.path.join(tmp, "run-" + tag)
            r = u.run([HETRAIN, "train", write(tmp, tag, config(written, "/no/such/dataset")), "--run-dir", run_dir])
            lines = r.stderr.splitlines()
            want = f'hetrain: error: device "{device}": '
            u.check(f'{json.dumps(written)} without a GPU: exit 1 with one stderr line "{want}..."',
                    r.returncode == 1 and len(lines) == 1 and lines[0].startswith(want), (r.returncode, r.stderr))
            u.check(f'{json.dumps(written)} without a GPU: the line gives the reason and what was expected',
                    ("no CUDA backend" in r.stderr or "no usable GPU" in r.stderr)
                    and "expected a machine with an NVIDIA GPU" in r.stderr
                    and 'device "cpu" or "auto"' in r.stderr, r.stderr)
            u.check(f'{json.dumps(written)} without a GPU: nothing started (no run directory, no data read, no training line)',
                    not os.path.exists(run_dir) and "dataset" not in r.stderr and "training " not in r.stdout,
                    (r.stdout, r.stderr))
    # hetrain probe --device: one per world rank, comma-separated.
    r = u.mpirun(HETRAIN, 2, ["probe", "--quick", "--device", "cpu,cpu,cpu"])
    u.check('probe --device cpu,cpu,cpu on 2 ranks: exit 2, naming the list and the world size',
            r.returncode == 2 and 'probe --device "cpu,cpu,cpu": 3 devices for 2 ranks; expected one per world rank'
            in r.stderr, (r.returncode, r.stderr[-600:]))
    probe = os.path.join(tmp, "probe.json")
    r = u.mpirun(HETRAIN, 2, ["probe", "--quick", "--device", "cpu,auto", "--json", probe])
    u.check('probe --device cpu,auto on 2 ranks: exit 0, rank 0 a CPU rank in the cluster file',
            r.returncode == 0 and os.path.exists(probe)
            and [x["device"]["kind"] for x in json.load(open(probe))["ranks"]][:1] == ["cpu"]
            and len(json.load(open(probe))["ranks"]) == 2, (r.returncode, r.stderr[-600:]))
    if not gpu_usable:
        # Each rank takes its own entry: rank 1's "cuda" fails on rank 1 alone.
        r = u.mpirun(HETRAIN, 2, ["probe", "--quick", "--device", "cpu,cuda"])
        u.check('probe --device cpu,cuda without a GPU: rank 1 fails naming "cuda", rank 0 does not',
                r.returncode != 0 and 'hetrain: rank 1: error: device "cuda": ' in r.stderr
                and "rank 0: error" not in r.stderr, (r.returncode, r.stderr[-600:]))
    return u.finish(tmp, missing)


if __name__ == "__main__":
    sys.exit(main())
