#!/usr/bin/env python3
"""End-to-end test of tools/hetero-local (emulated mixed cluster via cgroup CPU quotas).

Always: bad inputs are refused with exit 2 and a message naming the value.
Then, if `hetero-local --check` says cgroups are not writable here, prints SKIP with the
reason and exits 77 (meson counts it as skipped). Otherwise, checks that hold under any
other load on the machine (a busy host slows a rank below its quota, never above it):
  - quotas 0.5,0.25: each rank sits in hetrain-<pid>-rank<r> whose files hold the
    configured quota and memory cap, HETRAIN_MEMORY_CAP is set, and each rank's CPU time
    stays within its quota x wall time (plus the few periods' slack CFS allows);
  - --change 1.5s:1=0.1: rank 1's quota file goes from 0.5 to 0.1 of a core while it
    runs, and its CPU time after the change stays within 0.1 x wall time; rank 0's stays
    at 0.5;
  - quotas 0.8,0.4,0.2,0.2 on 2+ CPUs: rank 0 pinned alone to one CPU, ranks 1-3 to
    another (worst-fit decreasing), said in the EMULATION line; --no-pin leaves every
    rank the launcher's CPUs; quotas that do not fit one core each leave them unpinned;
  - a failing rank's exit status comes back;
  - SIGINT and SIGTERM mid-run: exit 128+N, no command process left;
  - after every run no cgroup named hetrain-<pid>-* is left in any hierarchy.

usage: test_hetero_local.py HETERO_LOCAL
"""
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time

TOOL = os.path.abspath(sys.argv[1])
PY = sys.executable
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        failures.append(what)


def tool(*args):
    return [PY, TOOL, *args]


# A CPU burner: spins for DUR seconds of wall time and reports, as one JSON line, its
# confinement (cgroup paths, memory limit, HETRAIN_MEMORY_CAP, CFS burst, allowed CPUs) and
# its run cut into segments at each change of its cgroup's CPU quota, which it re-reads as
# it goes: per segment the quota and period it saw, the wall time and the CPU time.
BURNER = r'''
import json, os, sys, time
dur = float(sys.argv[1])
if len(sys.argv) > 2 and sys.argv[2] == "one-cpu":
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
rank = os.environ.get("OMPI_COMM_WORLD_RANK")
mnt = {}
for line in open("/proc/self/mounts"):
    dev, mp, fs, opts = line.split()[:4]
    if fs == "cgroup":
        for o in opts.split(","):
            mnt.setdefault(o, mp)
    elif fs == "cgroup2":
        mnt.setdefault("", mp)
cg = {}
for line in open("/proc/self/cgroup"):
    _, ctrls, path = line.rstrip("\n").split(":", 2)
    for c in ctrls.split(","):
        cg[c] = path
def rd(ctrl, f):
    try:
        return open(os.path.join(mnt[ctrl], cg[ctrl].lstrip("/"), f)).read().split()
    except Exception:
        return ["-"]
v1 = "cpu" in mnt
def quota():   # (quota_us or -1 for none, period_us)
    if v1:
        q, p = rd("cpu", "cpu.cfs_quota_us")[0], rd("cpu", "cpu.cfs_period_us")[0]
    else:
        q, p = (rd("", "cpu.max") + ["-"])[:2]
    return (-1 if q in ("max", "-1") else int(q)), int(p)
info = dict(rank=int(rank), pid=os.getpid(), cap=os.environ.get("HETRAIN_MEMORY_CAP", "-"),
            cpus=len(os.sched_getaffinity(0)))
if v1:
    info.update(cpu_path=cg["cpu"], mem_path=cg.get("memory", "-"),
                memlim=rd("memory", "memory.limit_in_bytes")[0], burst_us=rd("cpu", "cpu.cfs_burst_us")[0])
else:
    info.update(cpu_path=cg[""], mem_path=cg[""], memlim=rd("", "memory.max")[0],
                burst_us=rd("", "cpu.max.burst")[0])
def say(line):   # one write() per line, so mpirun never interleaves two ranks' lines
    os.write(1, (line + "\n").encode())
say(f"ready {rank} {os.getpid()}")
segments = []
q = quota(); w0 = time.monotonic(); c0 = time.process_time(); t0 = w0; n = 0
while True:
    for _ in range(1000):
        n += 1
    w = time.monotonic()
    done = w - t0 >= dur
    now = quota() if n % 20000 == 0 or done else q
    if now != q or done:
        c = time.process_time()
        segments.append(dict(quota_us=q[0], period_us=q[1], wall_s=w - w0, cpu_s=c - c0))
        q, w0, c0 = now, w, c
    if done:
        break
info["segments"] = segments
say("result " + json.dumps(info))
'''


def burner(dur, *flags):
    return [PY, "-c", BURNER, str(dur), *flags]


def cgroup_roots():
    roots = []
    with open("/proc/self/mounts") as f:
        for line in f:
            p = line.split()
            if p[2] in ("cgroup", "cgroup2") and ("cpu" in p[3].split(",") or
                                                  "memory" in p[3].split(",") or
                                                  p[2] == "cgroup2"):
                roots.append(p[1])
    return roots


def leftover_groups(pid):
    prefix = f"hetrain-{pid}-"
    found = []
    for root in cgroup_roots():
        for d, subdirs, _ in os.walk(root):
            found += [os.path.join(d, s) for s in subdirs if s.startswith(prefix)]
    return found


def alive(pid):
    """True if pid runs (a zombie waiting for a reaper counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def run_tool(args, timeout=60):
    p = subprocess.Popen(tool(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.terminate()                       # lets hetero-local clean up
        out, err = p.communicate()
        failures.append(f"{' '.join(args[:4])}...: timed out")
    check(not leftover_groups(p.pid), f"no cgroups left after {' '.join(args[:6])} ...")
    return p.returncode, out, err


def results(out):
    res = {}
    for line in out.splitlines():
        if line.startswith("result {"):
            r = json.loads(line[len("result "):])
            res[r["rank"]] = r
    return res


# The most CPU time a process in a CFS-bandwidth group can use in a window of `wall_s`
# seconds at `quota_us` per `period_us`, whatever else runs: the quota refilled at every
# period boundary the window holds or touches (wall/period + 2), what each of its CPUs'
# run queues may hold over from the pool (up to one period's quota each), the burst
# allowance, and one scheduler tick's overrun before the throttle acts (at most 10 ms,
# HZ >= 100), which is then paid back.
def cpu_bound(quota_us, period_us, wall_s, cpus, burst_us):
    q = quota_us / period_us
    period = period_us * 1e-6
    return q * (wall_s + 2 * period) + cpus * q * period + burst_us * 1e-6 + 0.010


def check_segments(r, rank, want):
    """Checks rank r's segments: the quotas it saw are `want` in order (a later entry may
    be all it saw, had it started after a change), and each segment's CPU time is within
    cpu_bound. Returns the segments."""
    segs = r["segments"]
    seen = [s["quota_us"] for s in segs]
    check(seen and seen == want[len(want) - len(seen):],
          f"rank {rank}: its cgroup's quota read {seen} us per period over the run, expected {want}")
    burst = int(r["burst_us"]) if r["burst_us"].isdigit() else 0
    for s in segs:
        if s["quota_us"] <= 0:
            continue
        bound = cpu_bound(s["quota_us"], s["period_us"], s["wall_s"], r["cpus"], burst)
        check(s["cpu_s"] <= bound,
              f"rank {rank} at {s['quota_us']}/{s['period_us']} us: {s['cpu_s']:.3f} s CPU in "
              f"{s['wall_s']:.3f} s wall <= {bound:.3f} s (quota x wall + CFS slack)")
    return segs


# ---------------------------------------------------------------- refusals (no cgroups needed)

def test_refusals():
    cores = os.cpu_count() or 1
    over = ",".join(["0.9"] * (int(cores / 0.9) + 1))
    cases = [
        (["--quota", "0,0.5"], ["quota 0", "> 0"]),
        (["--quota=-0.5"], ["-0.5", "> 0"]),
        (["--quota", "abc"], ["'abc'", "not a number"]),
        (["--quota", str(cores + 1)], [str(cores + 1), f"{cores} cores"]),
        (["--quota", over], ["contend", f"{cores} cores"]),
        (["--quota", "0.05"], ["0.05", "below the kernel minimum"]),
        (["--quota", "0.2,0.2", "--mem", "0,1G"], ["'0'", "> 0"]),
        (["--quota", "0.2,0.2", "--mem", "1024T,1G"], ["'1024T'", "physical memory"]),
        (["--quota", "0.2,0.2", "--mem", "12X,1G"], ["'12X'", "not a size"]),
        (["--quota", "0.2,0.2", "--mem", "1G,1G,1G"], ["3 sizes for 2 ranks"]),
        (["--quota", "0.2,0.2", "--change", "1s:5=0.1"], ["rank 5 does not exist", "2 ranks"]),
        (["--quota", "0.2,0.2", "--change", "-1s:0=0.1"], ["'-1s'", "negative"]),
        (["--quota", "0.2,0.2", "--change", "soon:0=0.1"], ["'soon'", "malformed"]),
        (["--quota", "0.2,0.2", "--change", "1s:0=0"], ["quota 0", "> 0"]),
        (["--quota", "0.2,0.2", "--period-us", "10ms"], ["'10ms'", "microseconds"]),
        (["--quota", "0.2,0.2", "--mem", "1" + "0" * 400 + ",1G"], ["too large", "physical memory"]),
        (["--check", "--period-us", "0"], ["--period-us 0", "1000..1000000"]),
    ]
    for args, expect in cases:
        p = subprocess.run(tool(*args, "--", "true"), capture_output=True, text=True,
                           timeout=30)
        problems = []
        if p.returncode != 2:
            problems.append(f"exit {p.returncode}, expected 2")
        problems += [f"message lacks {e!r}" for e in expect if e not in p.stderr]
        if "EMULATION" in p.stderr:
            problems.append("it started")
        check(not problems, f"refuses {' '.join(args)}: {p.stderr.strip()[:110]}"
              + (f"  <-- {problems}" if problems else ""))
    p = subprocess.run(tool("--quota", "0.2,0.2"), capture_output=True, text=True, timeout=30)
    check(p.returncode == 2 and "no command" in p.stderr, f"refuses a missing command: "
          f"exit {p.returncode}, {p.stderr.strip()[:100]}")


# ---------------------------------------------------------------- runs (need cgroups)

def test_quota():
    # Both ranks on one CPU: had a quota not been applied, the two would split that CPU
    # about evenly (0.75 s each in 1.5 s), far over the 0.25 rank's bound of ~0.39 s.
    rc, out, err = run_tool(["--quota", "0.5,0.25", "--mem", "256M,128M", "--no-pin", "--"]
                            + burner(1.5, "one-cpu"))
    check(rc == 0, f"quota run exits 0 (got {rc}; stderr: {err.strip()[-300:]})")
    res = results(out)
    if sorted(res) != [0, 1]:
        check(False, f"both ranks report (stdout: {out!r})")
        return
    check("EMULATION: 2 ranks with CPU quotas 0.5,0.25 of a core" in err, "prints the EMULATION line")
    for r, (quota, cap) in enumerate([(5000, 256 << 20), (2500, 128 << 20)]):
        g = res[r]
        check(g["cpu_path"].endswith(f"-rank{r}") and "/hetrain-" in g["cpu_path"],
              f"rank {r} runs in its own cpu cgroup ({g['cpu_path']})")
        check(g["cap"] == str(cap), f"rank {r} HETRAIN_MEMORY_CAP {g['cap']} == {cap}")
        check(g["memlim"] == str(cap), f"rank {r} cgroup memory limit {g['memlim']} == {cap}")
        check_segments(g, r, [quota])
    cpu = [sum(s["cpu_s"] for s in res[r]["segments"]) for r in (0, 1)]
    print(f"     CPU seconds in 1.5 s: rank 0 {cpu[0]:.3f}, rank 1 {cpu[1]:.3f}", flush=True)


def test_change():
    # The change lands 1.5 s after mpirun starts, inside rank 1's 3 s run (ranks start
    # about 0.5 s after launch on a quiet host).
    rc, out, err = run_tool(["--quota", "0.5,0.5", "--change", "1.5s:1=0.1", "--"] + burner(3.0))
    check(rc == 0, f"change run exits 0 (got {rc})")
    check("rank 1 quota 0.5 -> 0.1 (emulated)" in err, "prints the change line")
    res = results(out)
    if sorted(res) != [0, 1]:
        check(False, f"both ranks report (stdout: {out!r})")
        return
    check_segments(res[0], 0, [5000])
    segs = check_segments(res[1], 1, [5000, 1000])
    print("     rank 1 segments: " + "; ".join(f"{s['quota_us']} us: {s['cpu_s']:.2f} s CPU in "
                                                f"{s['wall_s']:.2f} s" for s in segs), flush=True)


def test_pinning():
    cpus = sorted(os.sched_getaffinity(0))
    # One write() per line, as in BURNER: mpirun must not run two ranks' lines together.
    report = [PY, "-c", "import os; os.write(1, f\"cpus {os.environ['OMPI_COMM_WORLD_RANK']} "
              "{','.join(map(str, sorted(os.sched_getaffinity(0))))}\\n\".encode())"]

    def affinity(out):
        return {int(f[1]): f[2] for f in (line.split() for line in out.splitlines())
                if len(f) == 3 and f[0] == "cpus"}

    every = ",".join(map(str, cpus))
    rc, out, err = run_tool(["--quota", "0.8,0.4,0.2,0.2", "--"] + report)
    check(rc == 0, f"pinned run exits 0 (got {rc}; stderr: {err.strip()[-300:]})")
    got = affinity(out)
    if len(cpus) < 2:
        check(got == {r: every for r in range(4)}, f"one CPU: nothing pinned ({got})")
        return
    a, b = str(cpus[0]), str(cpus[1])
    check(got == {0: a, 1: b, 2: b, 3: b}, f"0.8,0.4,0.2,0.2: rank 0 alone on cpu {a}, "
          f"ranks 1-3 on cpu {b} (got {got})")
    check(f"pinned: rank 0 on cpu {a}, ranks 1,2,3 on cpu {b}" in err, "the EMULATION line says so")
    rc, out, err = run_tool(["--quota", "0.8,0.4", "--no-pin", "--"] + report)
    check(rc == 0 and affinity(out) == {0: every, 1: every} and "pinned" not in err,
          f"--no-pin: every rank on cpus {every} ({affinity(out)})")
    over = ["0.6"] * (len(cpus) + 1)  # one core each cannot hold them
    if 0.6 * len(over) <= len(cpus):
        rc, out, err = run_tool(["--quota", ",".join(over), "--"] + report)
        check(rc == 0 and affinity(out) == {r: every for r in range(len(over))} and "pinned" not in err,
              f"quotas {','.join(over)}: not pinned ({affinity(out)}; exit {rc}; output {out!r})")


def test_exit_status():
    fail_rank1 = "import os, sys; sys.exit(7 * (os.environ['OMPI_COMM_WORLD_RANK'] == '1'))"
    rc, _, _ = run_tool(["--quota", "0.3,0.3", "--", PY, "-c", fail_rank1])
    check(rc == 7, f"a rank's exit status 7 comes back (got {rc})")


def test_signal(sig):
    p = subprocess.Popen(tool("--quota", "0.3,0.3", "--", *burner(30)),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        signal_run(p, sig)
    finally:
        if p.poll() is None:                # the test broke: let hetero-local clean up
            p.terminate()
            p.wait(timeout=30)


def signal_run(p, sig):
    lines = queue.Queue()
    threading.Thread(target=lambda: [lines.put(l) for l in p.stdout], daemon=True).start()
    threading.Thread(target=p.stderr.read, daemon=True).start()   # drain stderr
    pids = {}
    deadline = time.monotonic() + 15
    while len(pids) < 2 and time.monotonic() < deadline:
        try:
            f = lines.get(timeout=0.2).split()
        except queue.Empty:
            continue
        if len(f) == 3 and f[0] == "ready":
            pids[int(f[1])] = int(f[2])
    check(len(pids) == 2, f"{sig.name}: both ranks started (pids {pids})")
    time.sleep(0.3)
    groups_during = leftover_groups(p.pid)
    check(len(groups_during) >= 2, f"{sig.name}: cgroups exist mid-run ({len(groups_during)})")
    p.send_signal(sig)
    try:
        rc = p.wait(timeout=20)
    except subprocess.TimeoutExpired:
        p.kill()
        rc = p.wait()
        check(False, f"{sig.name}: hetero-local exits within 20 s")
    check(rc == 128 + sig, f"{sig.name}: exit status {rc} == {128 + sig}")
    left = leftover_groups(p.pid)
    check(not left, f"{sig.name}: no cgroups left {left}")
    time.sleep(0.2)
    running = [pid for pid in pids.values() if alive(pid)]
    check(not running, f"{sig.name}: no command process left (ranks' pids {sorted(pids.values())})")
    for pid in running:                     # only the ranks this test started
        os.kill(pid, signal.SIGKILL)


def main():
    t0 = time.monotonic()
    test_refusals()
    p = subprocess.run(tool("--check"), capture_output=True, text=True, timeout=30)
    if p.returncode == 3:
        if failures:
            print(f"{len(failures)} failure(s) in the refusal checks")
            return 1
        print(f"SKIP: cgroup CPU quotas unavailable here: {p.stderr.strip()}")
        return 77
    check(p.returncode == 0, f"--check exits 0 (got {p.returncode}: {p.stderr.strip()})")
    for name, fn in [("quota", test_quota), ("change", test_change), ("pinning", test_pinning),
                     ("exit status", test_exit_status),
                     ("SIGINT", lambda: test_signal(signal.SIGINT)),
                     ("SIGTERM", lambda: test_signal(signal.SIGTERM))]:
        try:
            fn()
        except Exception as e:              # report and go on with the other checks
            check(False, f"{name}: {type(e).__name__}: {e}")
    print(f"{len(failures)} failure(s) in {time.monotonic() - t0:.1f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
