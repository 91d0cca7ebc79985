#!/usr/bin/env python3
"""End-to-end check of parallel.sync deadline: 4 ranks train the MLP (plan from a fixed
cluster file, shares 64/32/16/16) while rank 0, the reduction's first leader and the
owner of the run directory, is stopped from outside with SIGSTOP for 3 s and continued.

What must hold whatever the timing: the job completes; steps closed short are counted;
while rank 0 was stopped the others closed steps without it, led by a backup; rank 0's
records of those steps were written when it returned (one contributions record per
step, none missing); every replica ends bit-identical (the trainer checks it and fails
otherwise); the run ends with valid checkpoints that `hetrain eval` reads. The stall is
3 s against steps of tens of milliseconds, so "the others closed steps during it" holds
with a margin of two orders of magnitude, not by luck.

Then a hybrid plan (2 replicas x 2 stages, from a fixed cluster file whose ranks 1-3
cannot hold the whole model's optimiser state, so that no data-parallel plan fits without
sharding, which deadline refuses; the config caps their memory so): rank 0 is stopped for 3 s, which holds its replica's
pipeline (rank 0 leads both stages' reductions at first), and later the other replica's
last stage. The replica without a stopped rank keeps closing steps on every stage; the
held replica's ranks are caught up and agree on one step (AlignReplica) before they
compute again; the job ends with every stage's replicas bit-identical, and rank 0 writes
one record per step and a finite loss from the last stage.

usage: test_deadline.py HETRAIN"""
import glob
import json
import math
import os
import signal
import struct
import subprocess
import sys
import tempfile
import time
import zlib

from e2e_util import ENV, ROOT, check, finish, have_fashion_mnist, load, mpirun, rank_pids, run, save

HETRAIN = os.path.abspath(sys.argv[1])
RANKS = 4
STEPS = 400
HYBRID_STEPS = 1000
STALL_S = 3.0
STALLED = 0


def config(path, sync, strategy="data", steps=STEPS):
    cfg = load(os.path.join(ROOT, "configs", "fashion_mnist_mlp.json"))
    cfg["train"].pop("epochs")
    cfg["train"].update(steps=steps, eval_every=50, eval_max_samples=200, log_every=50)
    cfg["checkpoint"] = {"every": 100, "keep": 10}
    # A wait that goes wrong fails within the test's time, naming the rank, rather than at
    # the default 300 s, when the test runner kills the test without a word.
    cfg["parallel"] = {"strategy": strategy, "sync": sync, "peer_timeout_s": 60}
    save(path, cfg)
    return path


def lr_at(step):
    """The config's schedule (AdamW 1e-3, cosine, 100 warmup steps over STEPS, min_lr 0) at
    0-based step `step`, as optim/lr_schedule.cpp computes it."""
    base, warmup = 1e-3, 100
    if step < warmup:
        return base * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, STEPS - warmup - 1))
    return 0.5 * base * (1 + math.cos(math.pi * progress))


def metrics_records(path):
    """The whole lines of rank 0's metrics.jsonl so far, parsed."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f.read().split("\n")[:-1] if line]


def after_records(n):
    return lambda records: len(records) >= n


def train_with_stall(cfg, run_dir, cluster, stops=((STALLED, after_records(20)),)):
    """Starts the job and, for each (rank, when) of `stops` in turn, stops that rank for
    STALL_S once when(rank 0's metrics records so far) holds, then continues it.
    Returns (returncode, stdout, stderr)."""
    cmd = ["mpirun", "-np", str(RANKS), "--bind-to", "none", HETRAIN, "train", cfg, "--run-dir", run_dir,
           "--cluster", cluster]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    metrics = os.path.join(run_dir, "metrics.jsonl")
    deadline = time.time() + 120
    stopped = None
    try:
        for rank, when in stops:
            while time.time() < deadline and p.poll() is None:
                if when(metrics_records(metrics)):
                    break
                time.sleep(0.05)
            pids = rank_pids(p.pid)
            if p.poll() is None and rank in pids:
                stopped = pids[rank]
                os.kill(stopped, signal.SIGSTOP)
                time.sleep(STALL_S)
                os.kill(stopped, signal.SIGCONT)
                stopped = None
        out, err = p.communicate(timeout=300)
    finally:
        if stopped:
            os.kill(stopped, signal.SIGCONT)
        if p.poll() is None:
            p.kill()
            p.communicate()
    return p.returncode, out, err


def main():
    if not have_fashion_mnist():
        print("SKIP: Fashion-MNIST is not installed")
        return finish(missing=["Fashion-MNIST"])
    scratch = tempfile.mkdtemp(prefix="hetrain-e2e-deadline-")
    cluster = os.path.join(ROOT, "tests", "e2e", "clusters", "cpu_4_2_1_1.json")
    cfg = config(os.path.join(scratch, "mlp.json"), "deadline")
    run_dir = os.path.join(scratch, "run")
    rc, out, err = train_with_stall(cfg, run_dir, cluster)
    check("the deadline run with rank 0 stopped for 3 s completes", rc == 0, (out + err)[-3000:])
    if rc != 0:
        return finish(scratch)
    records = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    steps = [r for r in records if r["type"] == "contributions"]
    check("one contributions record per step, none missing or repeated (rank 0 wrote its stall's when it returned)",
          [r["step"] for r in steps] == list(range(1, STEPS + 1)), [r["step"] for r in steps][:20])
    summary = load(os.path.join(run_dir, "summary.json"))
    d = summary.get("deadline", {})
    check("the summary counts steps closed short (> 0)", d.get("steps_closed_short", 0) > 0, d)
    check("the summary's counts agree with the records",
          d.get("steps_closed_short") == sum(r["closed_short"] for r in steps)
          and d.get("samples_dropped") == sum(r["samples_dropped"] for r in steps), d)
    without = [r for r in steps if all(c[0] != STALLED for c in r["contributors"])]
    check("while rank 0 was stopped the others closed steps without it", len(without) > 0)
    check("a backup led those steps", any(r["leader"] != STALLED for r in without),
          [(r["step"], r["leader"]) for r in without][:10])
    check("every step's samples are the sum of its contributors'",
          all(r["samples"] == sum(c[1] for c in r["contributors"]) for r in steps))
    check("a step closed short left out some share",
          all(r["samples_dropped"] > 0 for r in steps if r["closed_short"]))
    check("the summary names the policy", summary.get("sync_policy") == "deadline", summary.get("sync_policy"))
    # samples/s counts the samples that entered a gradient: the dropped shares are not in it.
    g = summary.get("guard", {})
    batch = load(cfg)["train"]["batch_size"]
    trained = summary.get("steps_this_run", 0) * batch - d.get("samples_dropped", 0) - g.get("samples_excluded", 0)
    check("the summary's trained samples are those drawn less those dropped",
          summary.get("samples_trained_this_run") == trained and d.get("samples_dropped", 0) > 0
          and math.isclose(summary.get("mean_samples_per_s", 0) * summary.get("wall_s", 0), trained, rel_tol=1e-9),
          (summary.get("samples_trained_this_run"), trained))
    # A log step that a catch-up took rank 0 past is recorded at the step applied, with
    # that step's learning rate (it once had the lr of the step rank 0 had run).
    trains = [r for r in records if r["type"] == "train"]
    wrong = [(r["step"], r["lr"], lr_at(r["step"] - 1)) for r in trains
             if not math.isclose(r["lr"], lr_at(r["step"] - 1), rel_tol=1e-5)]
    check("every train record's lr is the schedule's at its step", trains and not wrong, wrong[:5])
    print(f"steps closed short {d.get('steps_closed_short')}, led by a backup {d.get('steps_led_by_a_backup')}, "
          f"catch-ups on rank 0 {d.get('catch_ups')}, samples dropped {d.get('samples_dropped')}")

    checkpoints = sorted(glob.glob(os.path.join(run_dir, "checkpoints", "*.safetensors")))
    # A rank 0 caught up past a checkpoint step saves at the step it was caught up to, so a
    # multiple of 100 that rank 0 missed (the records show it absent) is covered by a
    # checkpoint after it, no later than the first step rank 0 is back in (or the end: the
    # others may finish the job while it is stopped); which happens depends on the timing
    # of the stop, not the code. A checkpoint off the multiples must follow such a miss.
    ckpt_steps = [int(os.path.basename(c).split("-")[1].split(".")[0]) for c in checkpoints]
    absent = {r["step"] for r in steps if all(c[0] != STALLED for c in r["contributors"])}
    def back_after(m):
        return min([r["step"] for r in steps if r["step"] > m and r["step"] not in absent], default=STEPS)
    covered = bool(ckpt_steps) and ckpt_steps[-1] == STEPS and all(
        m in ckpt_steps or (m in absent and any(m < c <= back_after(m) for c in ckpt_steps))
        for m in range(100, STEPS + 1, 100)) and all(
        c % 100 == 0 or any(p < a < c for a in absent) for p, c in zip([0] + ckpt_steps, ckpt_steps))
    check("a checkpoint every 100 steps, or right after a catch-up past one, the last at the end", covered,
          ckpt_steps)
    # Evaluations follow the same rule, every 50 steps (the last step's is the final one).
    eval_steps = [r["step"] for r in records if r["type"] == "eval"]
    evaluated = all(m in eval_steps or (m in absent and any(m < e <= back_after(m) for e in eval_steps))
                    for m in range(50, STEPS, 50)) and all(
        e % 50 == 0 or any(p < a < e for a in absent) for p, e in zip([0] + eval_steps, eval_steps))
    check("an evaluation every 50 steps, or right after a catch-up past one", evaluated, eval_steps)
    if checkpoints:
        e = run([HETRAIN, "eval", cfg, "--checkpoint", checkpoints[-1]], timeout=120)
        check("the last checkpoint is valid (hetrain eval reads it)", e.returncode == 0, (e.stdout + e.stderr)[-2000:])
        print("final:", summary["final"])
    hybrid(scratch)
    interrupt_one(scratch)
    interrupt_hybrid(scratch)
    rebalance(scratch)
    return finish(scratch)


def checkpoint_metadata(path):
    """A checkpoint's __metadata__ (docs/formats.md#checkpoint)."""
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    return json.loads(data[8:8 + n]).get("__metadata__", {})


def rewrite_checkpoint_metadata(path, key, value):
    """Sets one metadata key and seals the file again as hetrain does: the header padded to
    a multiple of 8, the CRC-32 of the whole file with its own 8 digits zeroed."""
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    header["__metadata__"][key] = value
    text = json.dumps(header, separators=(",", ":"))
    text += " " * (-len(text) % 8)
    out = bytearray(struct.pack("<Q", len(text)) + text.encode() + data[8 + n:])
    at = out.find(b'"hetrain.crc32":"') + len('"hetrain.crc32":"')
    out[at:at + 8] = b"00000000"
    out[at:at + 8] = b"%08x" % (zlib.crc32(bytes(out)) & 0xFFFFFFFF)
    with open(path, "wb") as f:
        f.write(bytes(out))


def rebalance(scratch):
    """parallel.rebalance_every under deadline: rank 1 is slowed 4x from step 20 (--inject
    slow), and the leader's re-splits, carried in the steps' records, move samples off it:
    a re-split after the slow-down gives it the smallest share, at most half of any
    other's, and every contribution after the last re-split carries the shares it set, so
    every rank ran them. The plan's shares
    (64/32/16/16 from the fixed cluster) are not the ranks' speeds here either, so the
    first checks move them too. Stopped after step 120, its checkpoint holds the shares
    in force, and a resume starts from a checkpoint's shares."""
    cluster = os.path.join(ROOT, "tests", "e2e", "clusters", "cpu_4_2_1_1.json")
    steps = 200
    cfg_path = config(os.path.join(scratch, "rebalance.json"), "deadline", steps=steps)
    cfg = load(cfg_path)
    cfg["parallel"]["rebalance_every"] = 10
    cfg["checkpoint"] = {"every": 0, "keep": 1}
    cfg["train"].update(eval_every=0, log_every=20)
    save(cfg_path, cfg)
    run_dir = os.path.join(scratch, "run-rebalance")
    # In two invocations: stopped after step 120, then resumed, which starts from the
    # shares the checkpoint's run stepped by, not the plan's.
    args = ["train", cfg_path, "--cluster", cluster, "--run-dir", run_dir, "--inject", "slow:rank=1,at=20,factor=4"]
    p = mpirun(HETRAIN, RANKS, args + ["--stop-after", "120"], timeout=240)
    check("rebalance: the deadline run with rank 1 slowed 4x stops after step 120", p.returncode == 0,
          (p.stdout + p.stderr)[-3000:])
    if p.returncode != 0:
        return
    first = metrics_records(os.path.join(run_dir, "metrics.jsonl"))
    ckpt = os.path.join(run_dir, "checkpoints", "ckpt-00000120.safetensors")
    meta = checkpoint_metadata(ckpt)
    shares = json.loads(meta.get("shares", "{}"))
    in_force = [r for r in first if r["type"] == "rebalance" and r["step"] <= 121]
    check("rebalance: the checkpoint holds the shares in force at its step",
          in_force and shares.get("samples") == in_force[-1]["shares"], (shares, in_force[-1:]))
    # The slowed rank's share (often 1 here) would be refused as too small to measure it
    # by; the shares put in their place (a valid checkpoint still) are taken as they are.
    shares["samples"] = [40, 24, 24, 40]
    rewrite_checkpoint_metadata(ckpt, "shares", json.dumps(shares))
    p = mpirun(HETRAIN, RANKS, args + ["--resume"], timeout=240)
    check("rebalance: resumed, it completes (replicas bit-identical)", p.returncode == 0, (p.stdout + p.stderr)[-3000:])
    if p.returncode != 0:
        return
    records = metrics_records(os.path.join(run_dir, "metrics.jsonl"))
    resumed = next((r for r in records if r["type"] == "contributions" and r["step"] == 121), None)
    ran = {c[0]: c[1] for c in resumed["contributors"] if c[2] == 0 and c[1] > 0} if resumed else {}
    check("rebalance: the resumed run starts from the checkpoint's shares 40/24/24/40, not the plan's 64/32/16/16",
          ran and all(n == [40, 24, 24, 40][k] for k, n in ran.items()) and "resuming with the shares" in p.stderr,
          (resumed, p.stderr[-1500:]))
    splits = [r for r in records if r["type"] == "rebalance"]
    check("rebalance: the leaders' re-splits are recorded as deadline's",
          splits and all(r.get("sync_policy") == "deadline" and sum(r["shares"]) == 128 and r.get("ranks") == [0, 1, 2, 3]
                         for r in splits), splits[:3])
    if not splits:
        return
    # A later check may undo a re-split whose measured step came out slower (the
    # ShareTuner's rule, on a loaded host), so any re-split after the slow-down counts.
    moved = [r for r in splits if r["step"] > 20 and 2 * r["shares"][1] <= min(
        n for k, n in enumerate(r["shares"]) if k != 1)]
    check("rebalance: after the slow-down a re-split gives the slowed rank the smallest share, at most half of any "
          "other's", moved, splits)
    last = splits[-1]
    # A rebalance record's step is the first that runs its shares (records count from 1).
    after = [r for r in records if r["type"] == "contributions" and r["step"] >= last["step"]]
    wrong = [r for r in after for c in r["contributors"] if c[2] == 0 and c[1] > 0 and c[1] != last["shares"][c[0]]]
    check("rebalance: every contribution after the last re-split carries its shares", after and not wrong,
          wrong[:3])


def interrupt_one(scratch):
    """SIGTERM to one rank that is not rank 0: its finish ends every member's chain at one
    step, and the job stops there with a checkpoint of that step (once taken for the end
    of training: rank 0 wrote the step-200 weights as the checkpoint of the last step)."""
    cluster = os.path.join(ROOT, "tests", "e2e", "clusters", "cpu_4_2_1_1.json")
    # The signal comes about 20 steps in (rank 0 writes a contributions record a step): far
    # short of the end, whatever the machine.
    steps = 4000
    cfg = config(os.path.join(scratch, "interrupt.json"), "deadline", steps=steps)
    interrupt(scratch, "interrupt", cfg, cluster, steps, 2)


def interrupt_hybrid(scratch):
    """The same on a hybrid plan, to the last stage of the replica without rank 0: its
    replica agrees on the step in AlignReplica, so no stage of it waits on the stopped one
    (they did, up to the peer timeout, and a chain that ended there read as the end of
    training on the other replica)."""
    cluster = os.path.join(ROOT, "tests", "e2e", "clusters", "cpu_4_hybrid_capped_8mib.json")
    steps = 4000
    cfg = config(os.path.join(scratch, "interrupt-hybrid.json"), "deadline", strategy="auto", steps=steps)
    c = load(cfg)
    c["emulate"] = {"ranks": [{"rank": r, "memory_cap_mb": 8} for r in (1, 2, 3)]}
    save(cfg, c)
    plan_file = os.path.join(scratch, "interrupt-hybrid.plan.json")
    plan = run([HETRAIN, "plan", cfg, "--cluster", cluster, "--json", plan_file])
    if plan.returncode != 0 or load(plan_file)["strategy"] != "hybrid":
        check("interrupt-hybrid: the fixed cluster plans a hybrid plan under deadline", False,
              (plan.stdout + plan.stderr)[-2000:])
        return
    replicas = load(plan_file)["layout"]["replicas"]
    interrupt(scratch, "interrupt-hybrid", cfg, cluster, steps, [r for r in replicas if 0 not in r][0][-1])


def interrupt(scratch, tag, cfg, cluster, steps, stopped):
    """Runs `cfg`, SIGTERMs rank `stopped` once rank 0 has 20 records, checks the stop and a resume."""
    c = load(cfg)
    c["train"]["log_every"] = 10
    save(cfg, c)
    run_dir = os.path.join(scratch, tag)
    p = subprocess.Popen(["mpirun", "-np", str(RANKS), "--bind-to", "none", HETRAIN, "train", cfg, "--run-dir",
                          run_dir, "--cluster", cluster], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=ENV)
    metrics = os.path.join(run_dir, "metrics.jsonl")
    try:
        deadline = time.time() + 120
        while time.time() < deadline and p.poll() is None and len(metrics_records(metrics)) < 20:
            time.sleep(0.05)
        pids = rank_pids(p.pid)
        if p.poll() is None and stopped in pids:
            os.kill(pids[stopped], signal.SIGTERM)
        out, err = p.communicate(timeout=300)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    ckpts = sorted(glob.glob(os.path.join(run_dir, "checkpoints", "*.safetensors")))
    last = int(os.path.basename(ckpts[-1])[5:13]) if ckpts else -1
    check(f"{tag}: SIGTERM to rank {stopped} stops the job (exit 143 on every rank: the end's exchange carries "
          f"the signal) with a checkpoint short of the end",
          p.returncode == 143 and 0 < last < steps and not os.path.exists(os.path.join(run_dir, "summary.json")),
          f"rc {p.returncode}, checkpoints {[os.path.basename(x) for x in ckpts]}\n{err[-2000:]}")
    said = [line for line in err.splitlines()
            if any(f"{how} at step" in line
                   for how in ("terminated", "interrupted", "stopped with the signalled rank (SIGTERM)"))]
    check(f"{tag}: every rank says it stopped at the checkpoint's step, rank {stopped} alone that it was terminated",
          len(said) == RANKS and all(f"at step {last} of {steps}" in line for line in said)
          and sum("terminated at step" in line for line in said) == 1
          and any(f"rank {stopped}: terminated" in line for line in said), "\n".join(said))
    if not 0 < last < steps:
        return
    c["train"]["steps"] = last + 20
    save(cfg, c)
    r = subprocess.run(["mpirun", "-np", str(RANKS), "--bind-to", "none", HETRAIN, "train", cfg, "--run-dir", run_dir,
                        "--cluster", cluster, "--resume"], capture_output=True, text=True, env=ENV, timeout=300)
    check(f"{tag}: --resume goes on from that checkpoint's step",
          r.returncode == 0 and f"at step {last} of {last + 20}" in r.stderr + r.stdout, (r.stdout + r.stderr)[-2000:])


def hybrid(scratch):
    cluster = os.path.join(ROOT, "tests", "e2e", "clusters", "cpu_4_hybrid_capped_8mib.json")
    cfg = config(os.path.join(scratch, "hybrid.json"), "deadline", strategy="auto", steps=HYBRID_STEPS)
    # The cluster file's caps, enforced: a catch-up's state must not need room beside the
    # rank's own (rank 1's plan fills 99% of its 8 MiB).
    c = load(cfg)
    c["emulate"] = {"ranks": [{"rank": r, "memory_cap_mb": 8} for r in (1, 2, 3)]}
    save(cfg, c)
    run_dir = os.path.join(scratch, "hybrid")
    plan = run([HETRAIN, "plan", cfg, "--cluster", cluster, "--json", os.path.join(scratch, "hybrid.plan.json")])
    check("hybrid: the fixed cluster plans 2 replicas x 2 stages under deadline", plan.returncode == 0
          and load(os.path.join(scratch, "hybrid.plan.json"))["strategy"] == "hybrid", (plan.stdout + plan.stderr)[-2000:])
    if plan.returncode != 0:
        return
    replicas = load(os.path.join(scratch, "hybrid.plan.json"))["layout"]["replicas"]
    other = [r for r in replicas if 0 not in r][0]
    # Rank 0 once it has recorded 20 steps; the other replica's last stage once rank 0 has
    # contributed to 20 steps after the first 20 (it is back, its replica realigned), with
    # HYBRID_STEPS long enough that both stops fall in the job at any speed the others
    # close steps alone (300 steps in 3 s here).
    back = lambda records: sum(1 for r in records if r["type"] == "contributions" and r["step"] > 25
                               and any(c[0] == 0 for c in r["contributors"])) >= 20
    rc, out, err = train_with_stall(cfg, run_dir, cluster, stops=((0, after_records(20)), (other[-1], back)))
    check("hybrid: the deadline run with rank 0, then another replica's last stage, stopped 3 s completes "
          "(its replicas bit-identical at the end: the trainer checks)", rc == 0, (out + err)[-3000:])
    if rc != 0:
        return
    records = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    steps = [r for r in records if r["type"] == "contributions"]
    check("hybrid: one contributions record per step (rank 0's stage), none missing or repeated",
          [r["step"] for r in steps] == list(range(1, HYBRID_STEPS + 1)), [r["step"] for r in steps][:20])
    without0 = [r for r in steps if all(c[0] != 0 for c in r["contributors"])]
    without_other = [r for r in steps if all(c[0] != other[0] for c in r["contributors"])]
    check("hybrid: while rank 0's replica was held the other replica closed steps without it, led by a backup",
          len(without0) > 0 and all(r["leader"] != 0 for r in without0), len(without0))
    check("hybrid: while the other replica was held, rank 0's replica closed steps without it",
          len(without_other) > 0, len(without_other))
    check("hybrid: a step closed short dropped a replica's whole share",
          all(r["samples_dropped"] == 64 for r in steps if r["closed_short"]),
          [r["samples_dropped"] for r in steps if r["closed_short"]][:10])
    # A window whose steps rank 0 only caught up past or realigned its replica to brought
    # it no loss, and its record leaves the loss out (never null).
    train = [r for r in records if r["type"] == "train"]
    losses = [r["loss"] for r in train if "loss" in r]
    check("hybrid: every loss logged is a finite number, most windows log one, the last below the first",
          losses and all(isinstance(x, float) and math.isfinite(x) for x in losses)
          and 2 * len(losses) >= len(train) and losses[-1] < losses[0], [r.get("loss", "-") for r in train])
    summary = load(os.path.join(run_dir, "summary.json"))
    d = summary.get("deadline", {})
    check("hybrid: the summary counts rank 0's catch-ups (>= 1)", d.get("catch_ups", 0) >= 1, d)
    print(f"hybrid: steps without rank 0's replica {len(without0)}, without the other {len(without_other)}, "
          f"rank 0's replica alignments {d.get('replica_alignments')}, final {summary.get('final')}")
    checkpoints = sorted(glob.glob(os.path.join(run_dir, "checkpoints", "*.safetensors")))
    if checkpoints:
        e = run([HETRAIN, "eval", cfg, "--checkpoint", checkpoints[-1]], timeout=120)
        check("hybrid: the last checkpoint is valid (hetrain eval reads it)", e.returncode == 0,
              (e.stdout + e.stderr)[-2000:])


if __name__ == "__main__":
    sys.exit(main())
