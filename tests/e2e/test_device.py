#!/usr/bin/env python3
"""The config's "device" key at `hetrain train`'s start: "cuda" and "cuda:0" on a machine
(or build) without a usable GPU fail before any work (exit 1, one stderr line naming the
device, the reason and what was expected; no run directory, no data read), and "auto"
falls back to the CPU, says so, and trains. Where a GPU is usable ("auto" chose one) the
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
    else:
        missing.append("the Fashion-MNIST dataset (for the \"auto\" run)")

    if gpu_usable:
        missing.append("a machine without a usable GPU (for the \"cuda\" failures)")
    else:
        # The data directory does not exist: the device is chosen before any data is read,
        # so the error names the device, not the dataset.
        for device in ["cuda", "cuda:0"]:
            run_dir = os.path.join(tmp, "run-" + device.replace(":", "-"))
            r = u.run([HETRAIN, "train", write(tmp, device.replace(":", "-"), config(device, "/no/such/dataset")),
                       "--run-dir", run_dir])
            lines = r.stderr.splitlines()
            want = f'hetrain: error: device "{device}": '
            u.check(f'"{device}" without a GPU: exit 1 with one stderr line "{want}..."',
                    r.returncode == 1 and len(lines) == 1 and lines[0].startswith(want), (r.returncode, r.stderr))
            u.check(f'"{device}" without a GPU: the line gives the reason and what was expected',
                    ("no CUDA backend" in r.stderr or "no usable GPU" in r.stderr)
                    and "expected a machine with an NVIDIA GPU" in r.stderr
                    and 'device "cpu" or "auto"' in r.stderr, r.stderr)
            u.check(f'"{device}" without a GPU: nothing started (no run directory, no data read, no training line)',
                    not os.path.exists(run_dir) and "dataset" not in r.stderr and "training " not in r.stdout,
                    (r.stdout, r.stderr))
    return u.finish(tmp, missing)


if __name__ == "__main__":
    sys.exit(main())
