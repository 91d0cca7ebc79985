#!/usr/bin/env python3
"""End-to-end check of parallel.sync local (DiLoCo): 4 ranks in 3 groups (ranks 0 and 1
alone, ranks 2 and 3 one synchronous group; the plan `hetrain plan` makes for the fixed
4/2/1/1 cluster, its groups set so) train the MLP with an outer step every 4 inner
steps, stop with a checkpoint at step 30, and resume on 2 ranks, which plan local for
themselves, to step 60. The loss falls; the records and the summary carry the policy,
the groups, H and the outer step count; the checkpoint holds the outer weights and the
outer momentum; the resumed run ends with a trained model. SIGTERM to one rank mid-run
stops them all at one step, each with SIGTERM's status, with that step's checkpoint.

Every log step the trainer compares all ranks' outer-weight checksums and ends the job
when they differ, so each run succeeding is the check that they stay bit-identical.

The accuracy bound is loose on purpose (a 60-step model of a 128-wide MLP, far from
converged; chance is 10%): it tells a trained model from a broken outer step, not one
policy's accuracy from another's (tools/bench-faults measures that).

usage: test_local.py HETRAIN"""
import json
import os
import re
import signal
import struct
import subprocess
import sys
import tempfile
import time

from e2e_util import ENV, ROOT, check, finish, have_fashion_mnist, load, mpirun, rank_pids, records, run, save

HETRAIN = os.path.abspath(sys.argv[1])
CLUSTER = os.path.join(ROOT, "tests", "e2e", "clusters", "cpu_4_2_1_1.json")
H = 4


def config(path):
    cfg = load(os.path.join(ROOT, "configs", "fashion_mnist_mlp.json"))
    cfg["model"]["hidden"] = [128]
    cfg["train"].pop("epochs")
    cfg["train"].update(steps=60, eval_every=0, eval_max_samples=2000, log_every=10)
    cfg["train"]["optimizer"]["lr"] = 2e-3
    cfg["train"]["schedule"] = {"type": "constant"}
    cfg["checkpoint"] = {"every": 30, "keep": 5}
    cfg["parallel"] = {"sync": "local", "local_steps": H, "outer_delay": 1, "outer_lr": 1.0, "outer_momentum": 0.2,
                       "rebalance_every": 0}
    save(path, cfg)
    return path


def header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n))


def interrupt(scratch, cfg, planned):
    """SIGTERM to rank 2 alone of a local job mid-run (a scheduler's, or `kill`): its stop
    travels in its log window to rank 0, which answers a round's logs a round end before
    the others take the answers (trainer_logs.cpp), so it must hold the stop an answer
    carries until they take it. Every rank stops at one step and ends through
    MPI_Finalize, each with SIGTERM's status (the signal goes with the stop: the others
    exited 130, Ctrl-C's), and that step's checkpoint is the newest."""
    long_cfg = load(cfg)
    long_cfg["train"]["steps"] = 100000
    long_cfg["checkpoint"] = {"every": 50000, "keep": 2}
    path = os.path.join(scratch, "mlp-long.json")
    save(path, long_cfg)
    run_dir = os.path.join(scratch, "interrupted")
    out_path = os.path.join(scratch, "interrupted.out")
    with open(out_path, "w") as out:
        job = subprocess.Popen(["mpirun", "-np", "4", "--bind-to", "none", HETRAIN, "train", path, "--plan", planned,
                                "--run-dir", run_dir], stdout=out, stderr=subprocess.STDOUT, env=ENV)
    try:
        deadline = time.monotonic() + 120
        stepping = False
        while not stepping and job.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
            try:
                stepping = any(r["type"] == "train" and r["step"] >= 100 for r in records(run_dir))
            except (OSError, ValueError, KeyError):
                pass
        pids = rank_pids(job.pid)  # mpirun's children only: the ranks this test started
        check("the long local job is stepping past step 100 with 4 ranks", stepping and len(pids) == 4, pids)
        if 2 in pids:
            os.kill(pids[2], signal.SIGTERM)
        try:
            rc = job.wait(timeout=120)
        except subprocess.TimeoutExpired:
            rc = None
        check("the job ends within 120 s of the SIGTERM", rc is not None)
    finally:
        if job.poll() is None:
            for pid in rank_pids(job.pid).values():
                os.kill(pid, signal.SIGKILL)
            job.kill()
            job.wait()
    with open(out_path) as f:
        text = f.read()
    steps = [int(m) for m in re.findall(r"(?:terminated|stopped with the signalled rank \(SIGTERM\)) at step (\d+) of", text)]
    check("SIGTERM to one rank ends the job with SIGTERM's status, 143, on every rank", rc == 143, text[-2000:])
    # Each rank ends through MPI_Finalize (no abort: cli/main.cpp), so every one says so.
    # Per rank, as mpirun's status is the first rank's to end (rank 2's, often).
    check("every rank says it stopped, all at one step, rank 2 alone that it was terminated, the others with "
          "SIGTERM's status",
          len(steps) == 4 and len(set(steps)) == 1 and len(re.findall(r"rank 2: terminated at step", text)) == 1
          and len(re.findall(r"stopped with the signalled rank \(SIGTERM\) at step", text)) == 3, (steps, text[-2000:]))
    if steps:
        saved = sorted(os.listdir(os.path.join(run_dir, "checkpoints")))
        check("that step's checkpoint is the newest", saved and saved[-1] == f"ckpt-{steps[0]:08d}.safetensors", saved)


def main():
    if not have_fashion_mnist():
        print("SKIP: Fashion-MNIST is not installed")
        return finish(missing=["Fashion-MNIST"])
    scratch = tempfile.mkdtemp(prefix="hetrain-e2e-local-")
    cfg = config(os.path.join(scratch, "mlp.json"))
    planned = os.path.join(scratch, "plan.json")
    p = run([HETRAIN, "plan", cfg, "--cluster", CLUSTER, "--json", planned, "--dump", "2"])
    check("hetrain plan makes a local plan", p.returncode == 0 and "sync: local (DiLoCo)" in p.stdout,
          p.stdout[-2000:] + p.stderr[-2000:])
    if p.returncode:
        return finish(scratch)
    plan = load(planned)
    # parallel.outer_delay 1 asks for the outer step a job step into the next round: the
    # fixed cluster's exchange takes less than a round.
    check("the plan file holds the groups, H and D", plan["sync_policy"] == "local" and plan["local"]["inner_steps"] == H
          and 1 <= plan["local"]["outer_delay"] < H, plan.get("local"))
    D = plan["local"]["outer_delay"]
    check("--dump shows the outer synchronisation in every round of H steps",
          f"each round of {H} job steps (2):\nOuterSyncFinish after job step {D}\nOuterSyncStart after job step {H}\n"
          in p.stdout, p.stdout[-1000:])
    # Three groups, the round's 4 x 128 samples split 250/140/122 in 2/1/1 inner steps:
    # group 0 takes steps of 125, group 1 one of 140, ranks 2 and 3 one of 122 (61 each
    # of the nominal 64/64), so every group's sub-plan is resized before its steps.
    plan["local"]["groups"] = [[0], [1], [2, 3]]
    plan["local"]["group_steps"] = [2, 1, 1]
    plan["local"]["round_samples"] = [250, 140, 122]
    shares = [128, 128, 64, 64]
    plan["layout"]["samples"] = shares
    for r, n in zip(plan["ranks"], shares):
        r["samples"] = n
    save(planned, plan)

    run_dir = os.path.join(scratch, "run")
    timeline = os.path.join(scratch, "timeline.json")
    a = mpirun(HETRAIN, 4, ["train", cfg, "--plan", planned, "--run-dir", run_dir, "--stop-after", "30",
                            "--timeline", timeline], timeout=300)
    check("4 ranks in 3 groups train to step 30", a.returncode == 0, a.stderr[-3000:])
    if a.returncode:
        return finish(scratch)
    # --timeline records a whole round: every rank's group's inner steps in it (one job
    # step held none for most groups, and the trace was empty).
    used = load(planned)
    steps_of = {}
    for g, members in enumerate(used["local"]["groups"]):
        for replica in members:
            for rank in used["layout"]["replicas"][replica]:
                steps_of[rank] = used["local"]["group_steps"][g]
    events = [e for e in load(timeline)["traceEvents"] if e.get("ph") == "X"] if os.path.exists(timeline) else []
    per_rank = {r: sum(1 for e in events if e["tid"] == r and e["name"] == "OptimizerStep") for r in steps_of}
    check("--timeline: one round, each rank's H_g optimiser steps", per_rank == steps_of, (per_rank, steps_of))
    ckpt = os.path.join(run_dir, "checkpoints", "ckpt-00000030.safetensors")
    check("a checkpoint at step 30", os.path.exists(ckpt))
    ckpt_outer = None
    if os.path.exists(ckpt):
        h = header(ckpt)
        ckpt_outer = int(h["__metadata__"].get("outer_steps", 0))
        momentum = [k for k in h if k.startswith("outer.momentum.")]
        model = [k for k in h if k.startswith("model.")]
        check("it holds the outer momentum of every weight", len(momentum) == len(model) > 0, sorted(h)[:10])
        check("its metadata names the policy and the outer steps",
              h["__metadata__"].get("sync_policy") == "local" and int(h["__metadata__"].get("outer_steps", 0)) > 0,
              h.get("__metadata__"))

    # The same plan with rank 0's compute made 16 times as slow (--inject): its group
    # paces every round, and the rounds' measured times re-split the samples so that it,
    # planned with the most, ends with fewer than rank 1, alone in its group on an equal
    # core (so the injected factor decides the order whatever the load; the two-rank
    # group's time depends on how its all-reduce shares the cores, so it is not compared).
    # (parallel.rebalance_every above 0 lets the rounds re-split; the other runs here
    # keep the plan's split at 0.)
    resplit_cfg = load(cfg)
    resplit_cfg["parallel"]["rebalance_every"] = 10
    resplit_path = os.path.join(scratch, "mlp-resplit.json")
    save(resplit_path, resplit_cfg)
    slow_dir = os.path.join(scratch, "slow0")
    s = mpirun(HETRAIN, 4, ["train", resplit_path, "--plan", planned, "--run-dir", slow_dir, "--steps", "60",
                            "--inject", "slow:rank=0,at=1,factor=16"], timeout=300)
    check("4 ranks train with rank 0 slowed 16x", s.returncode == 0, s.stderr[-3000:])
    if s.returncode == 0:
        # Every rank holds the outer weights after the final flush, so the groups share the
        # final evaluation (two chunks of 1,000 images: ranks 0 and 1 one each); rank 0
        # adds the chunks' sums up as one process does: hetrain eval's figures, to the bit.
        summary = load(os.path.join(slow_dir, "summary.json"))
        end = os.path.join(slow_dir, "checkpoints", "ckpt-00000060.safetensors")
        e = run([HETRAIN, "eval", resplit_path, "--checkpoint", end]) if os.path.exists(end) else None
        alone = json.loads(e.stdout.strip().splitlines()[-1]) if e and e.returncode == 0 else {}
        check("the groups share the final evaluation, which equals hetrain eval of the last checkpoint",
              summary.get("eval_chunks") == [1, 1, 0, 0] and alone
              and all(summary["final"].get(k) == alone.get(k) for k in ("test_accuracy", "test_loss", "test_samples")),
              (summary.get("eval_chunks"), summary.get("final"), alone, e.stderr[-500:] if e else "no checkpoint"))
        splits = [r for r in records(slow_dir) if r["type"] == "local_resplit"]
        last = splits[-1]["round_samples"] if splits else []
        check("the rounds re-split from measurement: rank 0's group ends with fewer samples than rank 1's",
              bool(splits) and sum(last) == 4 * 128 and last[0] < 250 and last[0] < last[1],
              [(r["step"], r["round_samples_before"], r["round_samples"]) for r in splits])
        check("the re-split is said in the progress output", "re-split from their measured speed" in s.stdout,
              s.stdout[-2000:])
        check("train prints the groups' section that the plan table's share column points to",
              "under sync: local below" in s.stdout and "sync: local (DiLoCo)" in s.stdout, s.stdout[:3000])
        # The checkpoint holds the split the run stepped by, and a resume under the same
        # plan goes on by it (the plan's split would repeat some of a round's samples).
        end = os.path.join(slow_dir, "checkpoints", "ckpt-00000060.safetensors")
        split = json.loads(header(end).get("__metadata__", {}).get("local.split", "{}")) if os.path.exists(end) else {}
        check("the last checkpoint holds the re-split the run stepped by", bool(splits)
              and split.get("round_samples") == last, (split, last))
        r = mpirun(HETRAIN, 4, ["train", resplit_path, "--plan", planned, "--run-dir", slow_dir, "--resume",
                                "--steps", "70"], timeout=300)
        check("a resume under the same plan goes on by the checkpoint's split, and says so", r.returncode == 0
              and "go on by the split the checkpoint's run stepped by (the groups' samples a round "
              + ", ".join(map(str, last)) + ")" in r.stderr, r.stderr[-2000:])
    check("with parallel.rebalance_every 0 the rounds keep the plan's split",
          not [r for r in records(run_dir) if r["type"] == "local_resplit"], run_dir)

    # The guard inside a group names world ranks: rank 1, alone in its group (which
    # numbers it 0), sends a NaN gradient at step 5.
    nan_dir = os.path.join(scratch, "nan1")
    n = mpirun(HETRAIN, 4, ["train", cfg, "--plan", planned, "--run-dir", nan_dir, "--steps", "12",
                            "--inject", "nan:rank=1,at=5"], timeout=300)
    check("4 ranks train with a NaN on rank 1 at step 5", n.returncode == 0, n.stderr[-3000:])
    if n.returncode == 0:
        guard = [(r["step"], r["rank"]) for r in records(nan_dir) if r["type"] == "guard"]
        check("the guard names world rank 1 (not its rank in its group)", guard == [(5, 1)], guard)
        check("... and so does the progress output", "step 5: rank 1 left out of the step" in n.stdout,
              n.stdout[-2000:])

    # A run shorter than a round (H job steps): one partial round, its outer step at the
    # end, which the start says.
    short_dir = os.path.join(scratch, "short")
    q = mpirun(HETRAIN, 4, ["train", cfg, "--plan", planned, "--run-dir", short_dir, "--steps", str(H - 1)],
               timeout=300)
    check(f"a run of {H - 1} steps under a round of {H}: trains, and says it is one partial round",
          q.returncode == 0 and f"local: a round is {H} job steps, more than the {H - 1} this run takes: it trains one "
          "partial round, its outer step at the end" in q.stdout + q.stderr, (q.stdout + q.stderr)[-2000:])

    # The first two ranks of the fixed cluster: a plan that does not depend on this host's load.
    two = load(CLUSTER)
    two["world_size"] = 2
    two["ranks"] = two["ranks"][:2]
    for key in ("latency_s", "bandwidth_bytes_per_s"):
        two["links"][key] = [row[:2] for row in two["links"][key][:2]]
    two_path = os.path.join(scratch, "cluster2.json")
    save(two_path, two)
    b = mpirun(HETRAIN, 2, ["train", cfg, "--resume", "--cluster", two_path, "--run-dir", run_dir],
               timeout=300)
    check("2 ranks resume the 4 ranks' checkpoint and train to step 60", b.returncode == 0, b.stderr[-3000:])
    if b.returncode:
        return finish(scratch)
    trains = [r for r in records(run_dir) if r["type"] == "train"]
    check("a train record every 10 steps, each naming the policy",
          [r["step"] for r in trains] == list(range(10, 61, 10)) and all(r.get("sync_policy") == "local" for r in trains),
          [(r["step"], r.get("sync_policy")) for r in trains])
    outer = [r["outer_steps"] for r in trains[:3]]
    # A round ends every H steps; its outer step lands D steps into the next one.
    check("the outer steps count rounds, each landing D steps into the next",
          outer == [(s - D) // H for s in (10, 20, 30)], (outer, D))
    resumed = [r["outer_steps"] for r in trains if r["step"] > 30]
    check("after the resume the outer steps count on from the checkpoint's",
          ckpt_outer is not None and ckpt_outer > 0 and resumed and resumed[0] >= ckpt_outer
          and resumed == sorted(resumed), (ckpt_outer, resumed))
    losses = [r["loss"] for r in trains]
    check("the loss falls", losses[-1] < 0.75 * losses[0], losses)
    summary = load(os.path.join(run_dir, "summary.json"))
    check("the summary names the policy, the groups and H",
          summary.get("sync_policy") == "local" and summary.get("inner_steps") == H and summary.get("ranks") == 2
          and summary.get("resumed_from_step") == 30 and "groups" in summary, summary)
    # Both ranks on this host, no link emulated: the exchange through shared memory.
    check("the outer exchange ran through shared memory", summary.get("outer_exchange") == "shared memory", summary)
    accuracy = summary["final"]["test_accuracy"]
    print(f"final test accuracy {accuracy:.4f}")
    check("the resumed model is trained (test accuracy above 60%)", accuracy > 0.6, accuracy)

    # Rank 3 four hundred times slower than rank 0: its one-sample step outlasts the
    # others' whole shares, so the local plan leaves it idle, outside the outer exchange
    # (plan::outer_members): the others' rounds do not wait on it, and its checksum is
    # left out of the comparison at log steps while theirs are compared.
    slow = load(CLUSTER)
    slow["ranks"][3]["device"]["sgemm_gflops"] = 0.02
    slow_path = os.path.join(scratch, "cluster_slow3.json")
    save(slow_path, slow)
    idle_dir = os.path.join(scratch, "idle")
    c = mpirun(HETRAIN, 4, ["train", cfg, "--cluster", slow_path, "--run-dir", idle_dir, "--steps", "20"], timeout=300)
    check("4 ranks train under local with the slowest left idle", c.returncode == 0, c.stderr[-3000:])
    if c.returncode == 0:
        s = load(os.path.join(idle_dir, "summary.json"))
        check("rank 3 takes no share and is in no group",
              s["rank_shares"][3] == 0 and all(3 not in g for g in s["groups"])
              and all(sum(s["rank_shares"][r] for r in g) == 128 for g in s["groups"]),
              (s["rank_shares"], s["groups"]))

    interrupt(scratch, cfg, planned)
    empty_windows(scratch, cfg, planned)
    sync_then_local(scratch, cfg, two_path)
    return finish(scratch)


def sync_then_local(scratch, cfg, cluster):
    """Synchronous steps first, then local from their checkpoint (the warm-up of
    docs/architecture.md): 2 ranks under sync stop at step 12, then resume under local,
    their link (0.1 ms, 1 GB/s in the cluster file) worth a synchronous plan of both but
    not a local group of both. The checkpoint's guard was of the 2 ranks' replicas, a local
    group's is of its own member: the resume failed it as a corrupt file."""
    two = load(cluster)
    two["links"]["latency_s"] = [[0, 1e-4], [1e-4, 0]]
    two["links"]["bandwidth_bytes_per_s"] = [[0, 1e9], [1e9, 0]]
    cluster = os.path.join(scratch, "cluster2_slow.json")
    save(cluster, two)
    synced = load(cfg)
    synced["parallel"] = {"sync": "sync", "rebalance_every": 0}
    sync_cfg = os.path.join(scratch, "sync_first.json")
    save(sync_cfg, synced)
    run_dir = os.path.join(scratch, "warm")
    a = mpirun(HETRAIN, 2, ["train", sync_cfg, "--cluster", cluster, "--run-dir", run_dir, "--stop-after", "12"],
               timeout=300)
    check("2 ranks under sync stop at step 12 with a checkpoint", a.returncode == 0, a.stderr[-3000:])
    if a.returncode == 0:
        meta = header(os.path.join(run_dir, "checkpoints", "ckpt-00000012.safetensors"))["__metadata__"]
        check("... both of them training (two replicas)", len(json.loads(meta["guard.layout"])["replicas"]) == 2,
              meta.get("guard.layout"))
    if a.returncode:
        return
    b = mpirun(HETRAIN, 2, ["train", cfg, "--resume", "--cluster", cluster, "--run-dir", run_dir, "--steps", "24"],
               timeout=300)
    check("... and resume under local to step 24", b.returncode == 0, b.stderr[-3000:])
    if b.returncode == 0:
        s = load(os.path.join(run_dir, "summary.json"))
        check("the resumed run is local, in two groups, from step 12",
              s.get("sync_policy") == "local" and s.get("groups") == [[0], [1]] and s.get("resumed_from_step") == 12
              and s.get("steps") == 24, s)


def empty_windows(scratch, cfg, planned):
    """The plan's groups take their inner steps in a round's first two job steps, so with
    log_every 1 the windows of job steps 3 and 4 of every round hold no inner step on any
    rank: no sample trained, none left out. Judged as "no finite loss", they ended the run
    as diverged (exit 1, no checkpoint)."""
    c = load(cfg)
    c["train"]["log_every"] = 1
    one = os.path.join(scratch, "log-every-1.json")
    save(one, c)
    run_dir = os.path.join(scratch, "empty-windows")
    a = mpirun(HETRAIN, 4, ["train", one, "--plan", planned, "--run-dir", run_dir, "--stop-after", "8"], timeout=300)
    losses = [r["loss"] for r in records(run_dir) if r["type"] == "train"] if os.path.exists(run_dir) else []
    check("log_every 1: windows with no inner step on any rank are no divergence; 8 steps logged, every loss finite",
          a.returncode == 0 and len(losses) == 8 and all(isinstance(x, float) and x == x for x in losses),
          f"rc {a.returncode}, losses {losses}\n{a.stderr[-2000:]}")


if __name__ == "__main__":
    sys.exit(main())
