#!/usr/bin/env python3
"""End-to-end check that a stalled rank ends a `sync` job instead of hanging it: 2 ranks
train the MLP data-parallel with parallel.peer_timeout_s = 3 and a checkpoint every 5
steps; once the first checkpoint is in the run directory, this script stops rank 1 with
SIGSTOP from outside. The job must then exit nonzero, and its output must carry rank 0's
line naming rank 1 (whichever wait rank 0 was in: the gradient sums, the log
consultation or a checkpoint's exchange). The newest checkpoint must still load
(`hetrain eval`): checkpoints are written whole or not at all.

A pipeline of three stages with its middle rank stopped: each rank that reports names
that rank alone (a stage whose neighbour waits too takes a roll call first).

Then a rank that stalls before MPI start-up (`--inject stall:rank=1,at=0,for=...`: it
sleeps before MPI_Init, so rank 0 waits inside Open MPI's start-up, a call that cannot
time out): the job must end within the bound, rank 0 naming MPI start-up and the peer
timeout (comm/watchdog.h), long before the stall is over.

Bounds. The job runs 100000 steps, far more than it can reach before the stop, and
rank 1 stays stopped until the job has ended, so the timeout must fire; nothing waits
on a speed. How long the job takes to end after the stop is bounded only loosely
(STOP_BOUND_S, 20 timeouts' worth): the check is that it ends at all, where before it
waited 600 s and earlier forever.

usage: test_stall.py HETRAIN"""
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

from e2e_util import ENV, ROOT, check, finish, have_fashion_mnist, load, rank_pids, run

HETRAIN = os.path.abspath(sys.argv[1])
PEER_TIMEOUT_S = 3
STOP_BOUND_S = 20 * PEER_TIMEOUT_S
START_BOUND_S = 240  # the job starting and writing its first checkpoint


def config(path, run_dir, strategy="equal", hidden=(64,)):
    cfg = load(os.path.join(ROOT, "configs", "fashion_mnist_mlp.json"))
    cfg["model"]["hidden"] = list(hidden)
    cfg["train"].pop("epochs")
    cfg["train"].update(steps=100000, batch_size=64, eval_every=0, log_every=10)
    cfg["train"]["schedule"] = {"type": "constant"}
    cfg["checkpoint"] = {"every": 5, "keep": 3}
    cfg["parallel"] = {"strategy": strategy, "sync": "sync", "peer_timeout_s": PEER_TIMEOUT_S,
                       "rebalance_every": 0}
    cfg["run"] = {"dir": run_dir}
    with open(path, "w") as f:
        json.dump(cfg, f)
    return path


def checkpoints(run_dir):
    d = os.path.join(run_dir, "checkpoints")
    if not os.path.isdir(d):
        return []
    return sorted(os.path.join(d, f) for f in os.listdir(d) if f.endswith(".safetensors"))


def end_job(job, stopped):
    """Ends `job` (mpirun and its ranks) where it still runs, and continues the rank
    `stopped` (a pid, or None), so that nothing of the case is left behind."""
    if job.poll() is None:
        os.killpg(job.pid, signal.SIGKILL)
    if stopped is not None:
        try:
            os.kill(stopped, signal.SIGCONT)
        except ProcessLookupError:
            pass
    job.wait()


def stop_rank_1(job, run_dir, what):
    """Once `job` has written a checkpoint into `run_dir` (checked as `what`), stops its
    rank 1 with SIGSTOP and waits at most STOP_BOUND_S for the job to end. Returns rank 1's
    pid (None where the job could not be stopped so), the job's exit status (None: still
    running) and the seconds from the stop."""
    start = time.monotonic()
    while not checkpoints(run_dir) and job.poll() is None and time.monotonic() - start < START_BOUND_S:
        time.sleep(0.2)
    ranks = rank_pids(job.pid)
    check(what, job.poll() is None and checkpoints(run_dir) and 1 in ranks,
          f"exit {job.poll()}, checkpoints {checkpoints(run_dir)}, ranks {ranks}")
    if job.poll() is not None or 1 not in ranks:
        return None, None, 0.0
    os.kill(ranks[1], signal.SIGSTOP)
    t_stop = time.monotonic()
    try:
        status = job.wait(timeout=STOP_BOUND_S)
    except subprocess.TimeoutExpired:
        status = None
    return ranks[1], status, time.monotonic() - t_stop


def startup_stall(cfg, scratch):
    stall_s = 10 * STOP_BOUND_S  # far past the bound: only the watchdog can end the job in time
    with open(os.path.join(scratch, "startup.log"), "w+") as log:
        t0 = time.monotonic()
        job = subprocess.Popen(["mpirun", "-np", "2", "--bind-to", "none", HETRAIN, "train", cfg,
                                "--run-dir", os.path.join(scratch, "startup-run"),
                                "--inject", f"stall:rank=1,at=0,for={stall_s}"],
                               stdout=log, stderr=subprocess.STDOUT, env=ENV, start_new_session=True)
        try:
            status = job.wait(timeout=STOP_BOUND_S)
        except subprocess.TimeoutExpired:
            status = None
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
        took = time.monotonic() - t0
        log.seek(0)
        text = log.read()
    check(f"a rank stalled before MPI start-up ends the job within {STOP_BOUND_S} s", status is not None,
          f"still running after {took:.1f} s")
    check("that job's exit status is nonzero", status not in (None, 0), f"exit {status}")
    check(f"it waited at least the peer timeout ({PEER_TIMEOUT_S} s)", took >= PEER_TIMEOUT_S, f"{took:.2f} s")
    line = next((l for l in text.splitlines()
                 if f"hetrain: rank 0: error: timed out after {PEER_TIMEOUT_S} s waiting for MPI start-up" in l), "")
    check("rank 0 names MPI start-up and the peer timeout", line, text[-2000:])
    print("  " + line.strip())
    print(f"  the job with a stall before start-up ended after {took:.1f} s, exit status {status}")


def final_evaluation_stall(scratch):
    """Rank 1 stopped while rank 0 runs the final evaluation (the CNN on 10,000 images, a
    few seconds), rank 1 waiting at the job's end meanwhile: rank 0 names it. Its arrival
    had gone out before the stop, and the end was left to MPI_Finalize's watchdog, which
    names no rank. A pipeline of two stages, so that rank 0 evaluates alone (replicas
    would share the evaluation, and rank 1 would be stopped in that instead). Returns
    what could not be checked ([] or a reason)."""
    cfg = load(os.path.join(ROOT, "configs", "fashion_mnist_cnn.json"))
    cfg["train"].pop("epochs")
    cfg["train"].update(steps=6, eval_every=0, eval_max_samples=10000, log_every=2)
    cfg["checkpoint"] = {"every": 0, "keep": 1}
    cfg["parallel"] = {"strategy": "pipeline", "sync": "sync", "peer_timeout_s": PEER_TIMEOUT_S, "rebalance_every": 0}
    run_dir = os.path.join(scratch, "final-run")
    cfg["run"] = {"dir": run_dir}
    path = os.path.join(scratch, "cnn-final.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    last = os.path.join(run_dir, "checkpoints", "ckpt-00000006.safetensors")  # written before the evaluation
    with open(os.path.join(scratch, "final.log"), "w+") as log:
        job = subprocess.Popen(["mpirun", "-np", "2", "--bind-to", "none", HETRAIN, "train", path],
                               stdout=log, stderr=subprocess.STDOUT, env=ENV, start_new_session=True)
        stopped, missing = None, []
        try:
            start, ranks = time.monotonic(), {}
            while not os.path.exists(last) and job.poll() is None and time.monotonic() - start < START_BOUND_S:
                if 1 not in ranks:  # mpirun starts them one after the other
                    ranks = rank_pids(job.pid)
                time.sleep(0.02)
            if 1 not in ranks:
                ranks = rank_pids(job.pid)
            # Into rank 1's wait at the end, its arrival sent (the evaluation takes seconds):
            # a stop before it would be named at the arrival already.
            time.sleep(1.0)
            try:
                os.kill(ranks[1], signal.SIGSTOP)
                stopped = ranks[1]
            except (KeyError, ProcessLookupError):
                pass
            log.seek(0)
            # Rank 0 prints the evaluation's line before it goes to the end: where it is out
            # already, rank 1 may be past the exchanges (this script was too slow to react).
            if stopped is None or "final (step 6)" in log.read():
                missing = ["a final evaluation long enough to stop rank 1 in (rank 0's had ended before this script "
                           "stopped rank 1)"]
            else:
                try:
                    status = job.wait(timeout=STOP_BOUND_S)
                except subprocess.TimeoutExpired:
                    status = None
                log.seek(0)
                text = log.read()
                check("a rank stopped during the final evaluation: the job ends, nonzero", status not in (None, 0),
                      f"exit {status}")
                # At its arrival, or (the stop came after rank 1 had sent that) at its leaving.
                said = re.search(rf"hetrain: rank 0: error: no word from rank 1 after {PEER_TIMEOUT_S} s waiting for "
                                 r"every rank (leaving )?at the job's end", text)
                check("... rank 0 names it, at the job's end", said, text[-2000:])
        finally:
            end_job(job, stopped)
    return missing


def pipeline_stall(scratch):
    """A pipeline of three stages with its middle rank stopped: every rank that reports
    names it, and no other. The stage beside the stopped one that waits on the third (a
    send to it, taken only once that one receives) had named the third, which was
    waiting too; a roll call of the replica's ranks now says who is absent."""
    run_dir = os.path.join(scratch, "pipeline-run")
    path = config(os.path.join(scratch, "mlp-pipeline.json"), run_dir, "pipeline", (64, 64))
    with open(os.path.join(scratch, "pipeline.log"), "w+") as log:
        job = subprocess.Popen(["mpirun", "-np", "3", "--oversubscribe", "--bind-to", "none", HETRAIN, "train", path],
                               stdout=log, stderr=subprocess.STDOUT, env=ENV, start_new_session=True)
        stopped = None
        try:
            stopped, status, _ = stop_rank_1(job, run_dir, "a 3-stage pipeline runs and writes a checkpoint")
            if stopped is None:
                return
            log.seek(0)
            text = log.read()
            check("its middle rank stopped: the job ends, nonzero", status not in (None, 0), f"exit {status}")
            named = re.findall(r"hetrain: rank (\d+): error: no word from ranks? ([0-9, ]+) after", text)
            check("... a rank names the stopped one", named, text[-2000:])
            check("... and every rank that reports names rank 1 alone", all(who == "1" for _, who in named),
                  "\n".join(l for l in text.splitlines() if "error:" in l))
            for l in text.splitlines():
                if "error: no word" in l:
                    print("  " + l.strip())
        finally:
            end_job(job, stopped)


def main():
    if not have_fashion_mnist():
        print("SKIP: Fashion-MNIST is not installed")
        return finish(missing=["Fashion-MNIST"])
    scratch = tempfile.mkdtemp(prefix="hetrain-stall-")
    run_dir = os.path.join(scratch, "run")
    cfg = config(os.path.join(scratch, "mlp.json"), run_dir)
    log = open(os.path.join(scratch, "job.log"), "w+")
    job = subprocess.Popen(["mpirun", "-np", "2", "--bind-to", "none", HETRAIN, "train", cfg],
                           stdout=log, stderr=subprocess.STDOUT, env=ENV, start_new_session=True)
    stopped = None
    try:
        stopped, status, took = stop_rank_1(job, run_dir, "the job runs and writes a checkpoint")
        if stopped is not None:
            check(f"the job ends within {STOP_BOUND_S} s of rank 1's stop", status is not None,
                  f"still running after {took:.1f} s")
            check("the job's exit status is nonzero", status not in (None, 0), f"exit {status}")
            check(f"the job waited at least the peer timeout ({PEER_TIMEOUT_S} s) before ending",
                  took >= PEER_TIMEOUT_S, f"{took:.2f} s")
            log.seek(0)
            text = log.read()
            line = next((l for l in text.splitlines() if "hetrain: rank 0: error: no word from rank 1 after 3 s waiting for" in l), "")
            check("rank 0 names rank 1, what it waited for and for how long", line, text[-2000:])
            print("  " + line.strip())
            print(f"  the job ended {took:.1f} s after rank 1's stop, exit status {status}")
    finally:
        end_job(job, stopped)
        log.close()
    startup_stall(cfg, scratch)
    pipeline_stall(scratch)
    missing = final_evaluation_stall(scratch)
    newest = checkpoints(run_dir)[-1:]
    check("no partial checkpoint is left in the run directory",
          all(not f.endswith(".tmp") for f in os.listdir(os.path.join(run_dir, "checkpoints")))
          if os.path.isdir(os.path.join(run_dir, "checkpoints")) else False)
    if newest:
        r = run([HETRAIN, "eval", cfg, "--checkpoint", newest[0]], timeout=120)
        check("the newest checkpoint loads and evaluates (hetrain eval)", r.returncode == 0 and "accuracy" in r.stdout,
              r.stdout + r.stderr)
    return finish(scratch, missing)


if __name__ == "__main__":
    sys.exit(main())
