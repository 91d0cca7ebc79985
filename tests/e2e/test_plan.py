#!/usr/bin/env python3
"""End-to-end checks of `hetrain plan`: a GPU beside two CPUs (synthetic), a device that
cannot hold the full model (a probe file with one memory-capped rank), the plan file, the
picture and the trace, planning a job's own ranks under mpirun, the bad inputs, and (where
cgroups are writable) the 4-rank cluster that tools/hetero-local --quota 0.8,0.4,0.2,0.2
probes.

usage: test_plan.py HETRAIN HETERO_LOCAL"""
import json
import os
import re
import subprocess
import sys
import tempfile

from e2e_util import ENV, ROOT, check, finish, load, run
from e2e_util import mpirun as mpirun_with

HETRAIN, HETERO = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
MLP, CNN = (os.path.join(ROOT, "configs", n) for n in ("fashion_mnist_mlp.json", "fashion_mnist_cnn.json"))


def plan(*args, timeout=120):
    return run([HETRAIN, "plan", *args], timeout)


def mpirun(n, args, timeout=120):
    return mpirun_with(HETRAIN, n, args, timeout)


def write_config(path, base, **sections):
    cfg = load(base)
    for k, v in sections.items():
        cfg.setdefault(k, {}).update(v)
    with open(path, "w") as f:
        json.dump(cfg, f)
    return path


def main():
    tmp = tempfile.mkdtemp(prefix="hetrain-plan-")
    j, svg, trace = (os.path.join(tmp, n) for n in ("plan.json", "plan.svg", "trace.json"))

    # A GPU beside two CPUs: the GPU takes the large majority (at this batch all of it: the
    # CPUs' few per cent do not pay for the all-reduce), and the plan says how much.
    r = plan(CNN, "--cluster", "synth:1xrtx4090,2xcpu-16c", "--json", j, "--svg", svg, "--trace", trace)
    m = re.search(r"work per step by device: rtx4090 \(1 rank\) ([0-9.]+)%", r.stdout)
    print(r.stdout)
    check("mixed GPU+CPU: plans and says the GPU's share of the work", r.returncode == 0 and m,
          r.stderr[-1500:])
    check("mixed GPU+CPU: the GPU does at least 90% of the work", m and float(m.group(1)) >= 90,
          m.group(1) if m else "")
    p = load(j) if os.path.exists(j) else {}
    check("plan file: format, world size and exact shares",
          p.get("format") == "hetrain-plan/1" and p.get("world_size") == 3
          and sum(p["layout"]["samples"]) == 128, str(p)[:300])
    with open(svg) as f:
        picture = f.read()
    check("svg: one document with compute, comm and memory bars",
          picture.rstrip().endswith("</svg>") and 'class="compute"' in picture and 'class="params"' in picture)
    events = load(trace)["traceEvents"]
    working = {r["rank"] for r in p.get("ranks", []) if r["replica"] >= 0}
    check("trace: Chrome trace events on the lane of every rank the plan uses",
          working and {e["tid"] for e in events if e.get("ph") == "X"} == working, str(working))
    idle = sorted(set(range(3)) - working)
    check("mixed GPU+CPU: idle ranks are named with the reason",
          not idle or f"ranks {', '.join(map(str, idle))} left idle" in r.stdout, str(idle))

    # One rank capped below the model's weight state (MLP: 10.7 MB with AdamW): a probe
    # file from two ranks, rank 1 capped at 8 MiB, as tools/hetero-local --mem would.
    cluster = os.path.join(tmp, "cluster.json")
    r = mpirun(2, ["probe", "--quick", "--json", cluster, "--model", MLP])
    check("probe for the memory-limited cluster", r.returncode == 0, r.stderr[-1500:])
    c = load(cluster)
    c["ranks"][1]["memory_cap_bytes"] = 8 << 20
    capped = os.path.join(tmp, "capped.json")
    with open(capped, "w") as f:
        json.dump(c, f)
    r = plan(MLP, "--cluster", capped, "--json", j)
    print(r.stdout)
    p = load(j) if r.returncode == 0 else {"ranks": [{}, {}], "baseline": {}}
    r1 = p["ranks"][1]
    fits = all(x["memory"]["params"] + x["memory"]["grads"] + x["memory"]["optimizer"]
               + x["memory"]["activations"] <= x["device"]["memory_bytes"] for x in p["ranks"]) if r.returncode == 0 else False
    check("memory-limited rank: the plan fits every rank", r.returncode == 0 and fits, r.stderr[-1500:])
    check("memory-limited rank: by a pipeline split or a memory strategy, shown in the output",
          r.returncode == 0 and (p["strategy"] in ("pipeline", "hybrid") or r1.get("memory_strategy") != "none")
          and ("pipeline" in r.stdout or "optimizer sharding" in r.stdout))
    problems = p["baseline"].get("problems", [])
    check("memory-limited rank: the equal split is reported as not fitting, naming rank and shortfall",
          p["baseline"].get("fits") is False and problems and "rank 1" in problems[0] and "short" in problems[0]
          and "baseline does not fit" in r.stdout, str(problems))

    # Planning the job's own ranks: every rank probes, rank 0 prints the plan.
    r = mpirun(2, ["plan", MLP])
    check("under mpirun without --cluster: probes the job and plans it",
          r.returncode == 0 and "world size:    2" in r.stdout and r.stdout.count("predicted:") == 1,
          r.stderr[-1500:])

    # Bad input: each a clear error with a nonzero exit.
    r = plan(MLP, "--cluster", "synth:2xrtx9090")
    check("unknown synth device: exit 2 naming it and the choices",
          r.returncode == 2 and "rtx9090" in r.stderr and "rtx4090" in r.stderr, r.stderr)
    broken = os.path.join(tmp, "broken.json")
    c = load(cluster)
    del c["ranks"][0]["device"]
    with open(broken, "w") as f:
        json.dump(c, f)
    r = plan(MLP, "--cluster", broken)
    check("malformed cluster file: exit 2 naming the file and the field",
          r.returncode == 2 and broken in r.stderr and "device" in r.stderr, r.stderr)
    small = write_config(os.path.join(tmp, "small_batch.json"), MLP, train={"batch_size": 3},
                         parallel={"strategy": "data"})
    r = plan(small, "--cluster", "synth:4xcpu-16c")
    check("global batch smaller than the replicas: names both numbers",
          r.returncode == 1 and "global batch 3 is smaller than the 4 data-parallel replicas" in r.stderr,
          r.stderr)
    c = load(cluster)
    for x in c["ranks"]:
        x["memory_cap_bytes"] = 1 << 20
    tiny = os.path.join(tmp, "tiny.json")
    with open(tiny, "w") as f:
        json.dump(c, f)
    r = plan(MLP, "--cluster", tiny)
    check("a model that fits nowhere: names a rank, its device and the shortfall",
          r.returncode == 1 and "no plan fits" in r.stderr and "rank " in r.stderr and "short" in r.stderr,
          r.stderr)
    check("no plan file is written when planning fails", not os.path.exists(os.path.join(tmp, "none.json")))

    # The 4-rank heterogeneous acceptance.
    if subprocess.run([HETERO, "--check"], capture_output=True).returncode != 0:
        print("SKIP hetero-local acceptance: cgroups are not writable here")
    else:
        hetero = os.path.join(tmp, "hetero.json")
        data = write_config(os.path.join(tmp, "mlp_data.json"), MLP, parallel={"strategy": "data"})
        want = [64, 32, 16, 16]
        # A second probe when the first one's split is off 4:2:1:1 by more than 20%: this
        # host's speed jumps at times (once rank 1 probed at 0.71 of rank 0, not 0.5), and
        # one probe of a few seconds can catch it.
        for attempt in range(2):
            r = subprocess.run([HETERO, "--quota", "0.8,0.4,0.2,0.2", "--", HETRAIN, "probe", "--json", hetero,
                                "--model", MLP], capture_output=True, text=True, env=ENV, timeout=300)
            check("hetero-local probe of four unequal ranks", r.returncode == 0, r.stderr[-1500:])
            r = plan(data, "--cluster", hetero, "--json", j)
            print(r.stdout)
            # Per rank (replicas follow the speed order, not the rank order).
            shares = [x["samples"] for x in load(j)["ranks"]] if r.returncode == 0 else [0, 0, 0, 0]
            speed = [1 / sum(b["fwd_bwd_s_per_sample"] for b in x["blocks"]) for x in load(hetero)["ranks"]]
            ideal = [128 * v / sum(speed) for v in speed]
            # The best whole-sample split: each sample to the rank that would finish it first
            # (optimal for the slowest rank's time; it can differ from `ideal` by more than one
            # sample, e.g. 65 against 63.9 when the small shares round down).
            best = [0] * len(speed)
            for _ in range(128):
                k = min(range(len(speed)), key=lambda i: (best[i] + 1) / speed[i])
                best[k] += 1
            slowest = lambda split: max(n / v for n, v in zip(split, speed))
            print("data-parallel shares " + ", ".join(map(str, shares)) + "; proportional to the measured speeds "
                  + ", ".join(f"{x:.1f}" for x in ideal) + "; best whole split " + ", ".join(map(str, best))
                  + "; 4:2:1:1 is " + ", ".join(map(str, want)))
            check("4-rank cluster: shares are the measured speeds' best split (the slowest rank's time)",
                  r.returncode == 0 and slowest(shares) <= slowest(best) * (1 + 1e-9), str(shares))
            # The emulation itself is looser than 10%: three throttled ranks sharing a CPU run at
            # 0.21-0.25 of rank 0, not 0.25 (see the README); 20% still catches a wrong split.
            near = all(abs(a - w) <= 0.2 * w for a, w in zip(shares, want))
            if near:
                break
        check("4-rank cluster: shares within 20% of 4:2:1:1", near, str(shares))
        r = plan(MLP, "--cluster", hetero)
        print(r.stdout)
        check("4-rank cluster: auto plans and beats the equal split",
              r.returncode == 0 and float(re.search(r"speed-up over baseline: ([0-9.]+)x", r.stdout).group(1)) > 1.2,
              r.stderr[-1500:])
    return finish(tmp)


if __name__ == "__main__":
    sys.exit(main())
