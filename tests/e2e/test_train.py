#!/usr/bin/env python3
"""End-to-end checks of `hetrain train` and `hetrain eval` on small configs:
exact resume (bit for bit), fallback past a corrupt checkpoint, a resume into a
different model, a full disk while checkpointing, damaged inputs (a metrics line cut short,
a config file name that is not UTF-8, a pipe for a checkpoint, an impossible step in a
signed checkpoint), a missing dataset, an unwritable run directory, the run directory's
files, and an evaluation too large for a memory cap.

usage: test_train.py HETRAIN"""
import filecmp
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HETRAIN = os.path.abspath(sys.argv[1])
FASHION = "/usr/share/datasets/fashion-mnist"
FORTUNES = "/usr/share/games/fortunes"
failures = []
skipped = []  # checks this machine cannot run: the test then exits 77 (skipped), not 0


def check(name, cond, detail=""):
    print(("ok   " if cond else "FAIL ") + name + ("" if cond else f"  [{detail}]"))
    if not cond:
        failures.append(name)


def run(args, extra_env=None, **kw):
    env = dict(os.environ, OMP_NUM_THREADS="1", **(extra_env or {}))
    return subprocess.run([HETRAIN] + args, capture_output=True, text=True, env=env, **kw)


def write_config(path, cfg):
    with open(path, "w") as f:
        json.dump(cfg, f)
    return path


def mlp_config(steps=20, hidden=(32,), schedule="cosine"):
    return {
        "model": {"type": "mlp", "hidden": list(hidden)},
        "data": {"dataset": "fashion_mnist", "dir": FASHION},
        "train": {"steps": steps, "batch_size": 32, "micro_batches": 2, "seed": 5,
                  "optimizer": {"type": "adamw", "lr": 0.002, "weight_decay": 0.01},
                  "schedule": {"type": schedule, "warmup_steps": 3},
                  "grad_clip": 1.0, "eval_every": 10, "eval_max_samples": 500, "log_every": 5},
        "checkpoint": {"every": 5, "keep": 3},
    }


def gpt_config(steps=12):
    return {
        "model": {"type": "gpt", "context": 16, "layers": 1, "heads": 2, "d_model": 16,
                  "dropout": 0.1},
        "data": {"dataset": "text", "paths": [FORTUNES], "skip_suffixes": [".dat", ".u8"]},
        "train": {"steps": steps, "batch_size": 8, "seed": 3,
                  "optimizer": {"type": "sgd", "lr": 0.05, "momentum": 0.9, "nesterov": True},
                  "eval_max_samples": 64, "log_every": 4},
        "checkpoint": {"every": 4, "keep": 2},
    }


def ckpt(run_dir, step):
    return os.path.join(run_dir, "checkpoints", f"ckpt-{step:08d}.safetensors")


def exact_resume(tmp, name, cfg, total, stop):
    path = write_config(os.path.join(tmp, name + ".json"), cfg)
    full, split = os.path.join(tmp, name + "-full"), os.path.join(tmp, name + "-split")
    r = run(["train", path, "--run-dir", full, "--quiet"])
    check(f"{name}: uninterrupted run succeeds", r.returncode == 0, r.stderr)
    r = run(["train", path, "--run-dir", split, "--quiet", "--stop-after", str(stop)])
    check(f"{name}: --stop-after {stop} exits 0", r.returncode == 0, r.stderr)
    check(f"{name}: stopped run left a checkpoint at step {stop}", os.path.exists(ckpt(split, stop)))
    check(f"{name}: stopped run wrote no summary", not os.path.exists(os.path.join(split, "summary.json")))
    r = run(["train", path, "--run-dir", split, "--resume", "--quiet"])
    check(f"{name}: resume succeeds", r.returncode == 0, r.stderr)
    same = os.path.exists(ckpt(split, total)) and filecmp.cmp(ckpt(full, total), ckpt(split, total), shallow=False)
    check(f"{name}: {total} steps == {stop} + resume, bit for bit (parameters and optimiser state)", same)
    return path, full, split


UNITS = {"bytes": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "kB": 1e3, "MB": 1e6, "GB": 1e9}


def names_bytes(text, prefix, want):
    """True when `text` has `prefix` followed by a size equal to `want` bytes to the
    precision it is printed with (half a unit in its last digit), in any unit."""
    m = re.search(re.escape(prefix) + r"([0-9]+(?:\.([0-9]+))?) ?(bytes|B|KiB|MiB|GiB|kB|MB|GB)\b", text)
    if not m:
        return False
    unit = UNITS[m.group(3)]
    half_digit = 0.5 * 10 ** -len(m.group(2) or "") * unit
    return abs(float(m.group(1)) * unit - want) <= half_digit


def evaluation_memory(tmp):
    """Under a 100 MB cap one CNN step fits but evaluating in batches of 1000 does not (the
    first convolution's output alone is 100 MB): refused before the first step, with a
    batch that fits, which then runs."""
    cfg = {"model": {"type": "cnn", "channels": [32, 64], "fc_hidden": 128},
           "data": {"dataset": "fashion_mnist", "dir": FASHION},
           "train": {"steps": 1, "batch_size": 32, "optimizer": {"type": "adamw", "lr": 0.002},
                     "eval_max_samples": 2000, "log_every": 1},
           "checkpoint": {"every": 0, "keep": 1}}
    cap = {"HETRAIN_MEMORY_CAP": "100000000"}
    path = write_config(os.path.join(tmp, "eval-memory.json"), cfg)
    rdir = os.path.join(tmp, "eval-memory-run")
    r = run(["train", path, "--run-dir", rdir, "--quiet"], cap)
    m = re.search(r"set train\.eval_batch_size to at most (\d+)", r.stderr)
    check("evaluation memory: refused before training, naming rank 0, the batch, the cap and a batch that fits",
          r.returncode == 1 and "rank 0 would run out of memory evaluating the whole model in batches of 1000" in r.stderr
          and names_bytes(r.stderr, "cap of ", 100000000) and m is not None, r.stderr)
    check("... no step ran (no checkpoint)", not os.path.exists(os.path.join(rdir, "checkpoints"))
          or not os.listdir(os.path.join(rdir, "checkpoints")))
    if m:
        cfg["train"]["eval_batch_size"] = int(m.group(1))
        path = write_config(os.path.join(tmp, "eval-memory-fits.json"), cfg)
        r = run(["train", path, "--run-dir", rdir, "--quiet"], cap)
        check(f"... and in batches of {m.group(1)} it trains and evaluates under the cap, in the same run directory",
              r.returncode == 0 and os.path.exists(os.path.join(rdir, "summary.json")), r.stderr)


def unplanned_cap(tmp):
    """One process without a plan runs the config's micro-batches as they are: under an
    emulated cap (9 MB) the CNN's step of 8 samples runs out of memory, and the error says
    that nothing fitted them to the cap and what would; in 4 micro-batches it trains."""
    cfg = {"model": {"type": "cnn", "channels": [32, 64], "fc_hidden": 128},
           "data": {"dataset": "fashion_mnist", "dir": FASHION},
           "train": {"steps": 2, "batch_size": 8, "optimizer": {"type": "adamw", "lr": 0.002},
                     "eval_every": 1, "eval_batch_size": 2, "eval_max_samples": 20},
           "checkpoint": {"every": 0, "keep": 1}}
    cap = {"HETRAIN_MEMORY_CAP": "8991119"}
    rdir = os.path.join(tmp, "unplanned-run")
    r = run(["train", write_config(os.path.join(tmp, "unplanned.json"), cfg), "--run-dir", rdir, "--quiet"], cap)
    check("unplanned cap: one process out of memory under a cap says it was not fitted to it, and how to",
          r.returncode == 1 and "rank 0 ran out of memory training the cnn model in 1 micro-batch of 8 samples" in r.stderr
          and "not fitted to a memory cap: give it a cluster file to plan with, or raise train.micro_batches" in r.stderr,
          r.stderr)
    cfg["train"]["micro_batches"] = 4
    r = run(["train", write_config(os.path.join(tmp, "unplanned-4.json"), cfg), "--run-dir", rdir, "--quiet"], cap)
    check("... in 4 micro-batches it trains under the same cap", r.returncode == 0, r.stderr)


def changed_resume(tmp):
    """A resume continues the run's training: a changed batch size is refused by name and
    the run's recorded config kept; more steps and other evaluations are taken."""
    cfg = mlp_config(steps=20)
    path = write_config(os.path.join(tmp, "resume-a.json"), cfg)
    rdir = os.path.join(tmp, "resume-run")
    r = run(["train", path, "--run-dir", rdir, "--quiet", "--stop-after", "10"])
    check("changed resume: the first part stops at step 10", r.returncode == 0, r.stderr)
    with open(os.path.join(rdir, "config.json")) as f:
        recorded = f.read()
    cfg["train"]["batch_size"] = 64
    r = run(["train", write_config(os.path.join(tmp, "resume-b.json"), cfg), "--run-dir", rdir, "--resume", "--quiet"])
    check("changed resume: another batch size is refused (exit 2), naming it and both values",
          r.returncode == 2 and "train.batch_size is 64 but the run was trained with 32" in r.stderr, r.stderr)
    with open(os.path.join(rdir, "config.json")) as f:
        check("... and the run's config.json is as it was", f.read() == recorded)
    # A changed model is a config error too, named before the checkpoint is read (it was
    # refused as a checkpoint that does not fit the model, exit 1).
    other = json.loads(json.dumps(cfg))
    other["train"]["batch_size"] = 32
    other["model"]["hidden"] = [16]
    r = run(["train", write_config(os.path.join(tmp, "resume-m.json"), other), "--run-dir", rdir, "--resume", "--quiet"])
    check("changed resume: another model is refused (exit 2), naming model and both values",
          r.returncode == 2 and "resuming " + rdir + ": model is" in r.stderr, r.stderr)
    # A recorded config that cannot be read is refused, not replaced unchecked.
    with open(os.path.join(rdir, "config.json"), "w") as f:
        f.write("garbage\n")
    r = run(["train", write_config(os.path.join(tmp, "resume-b.json"), cfg), "--run-dir", rdir, "--resume", "--quiet"])
    check("changed resume: an unreadable config.json is refused (exit 2), naming it",
          r.returncode == 2 and os.path.join(rdir, "config.json") + ", the config the run was trained with, cannot be read"
          in r.stderr, r.stderr)
    with open(os.path.join(rdir, "config.json")) as f:
        check("... and left as it was", f.read() == "garbage\n")
    with open(os.path.join(rdir, "config.json"), "w") as f:
        f.write(recorded)
    cfg["train"].update(batch_size=32, steps=25, eval_every=5)
    r = run(["train", write_config(os.path.join(tmp, "resume-c.json"), cfg), "--run-dir", rdir, "--resume", "--quiet",
             "--inject", "nan:rank=0,at=3"])
    check("changed resume: more steps and other evaluations are taken", r.returncode == 0
          and os.path.exists(ckpt(rdir, 25)), r.stderr)
    check("... and a testing aid of steps before the resumed ones is said not to act",
          "testing aid nan:rank=0,at=3 acts before this run's first step (11): it does not act" in r.stderr, r.stderr)
    # One that is missing is said, and the resume goes on.
    os.remove(os.path.join(rdir, "config.json"))
    cfg["train"]["steps"] = 30
    r = run(["train", write_config(os.path.join(tmp, "resume-d.json"), cfg), "--run-dir", rdir, "--resume", "--quiet"])
    check("changed resume: a missing config.json is warned of, and the run resumes", r.returncode == 0
          and "config.json is missing: the resumed config is not compared" in r.stderr
          and os.path.exists(ckpt(rdir, 30)), r.stderr)
    # Fewer steps than the checkpoint's: a setting to raise, refused as a config error.
    r = run(["train", write_config(os.path.join(tmp, "resume-f.json"), cfg), "--run-dir", rdir, "--resume", "--quiet",
             "--steps", "20"])
    check("resume past the configured steps: exit 2 naming the checkpoint's step and train.steps",
          r.returncode == 2 and "is at step 30, past the configured 20 steps" in r.stderr
          and "raise train.steps" in r.stderr, r.stderr)
    # A resume of a directory with no checkpoint (a mistyped one) starts afresh, and says
    # so on stderr, --quiet or not.
    typo = os.path.join(tmp, "resume-rnu")
    cfg["train"]["steps"] = 2
    r = run(["train", write_config(os.path.join(tmp, "resume-e.json"), cfg), "--run-dir", typo, "--resume", "--quiet"])
    check("resume of a directory without checkpoints: warned of on stderr under --quiet, training from step 0",
          r.returncode == 0 and "no checkpoint in " + os.path.join(typo, "checkpoints") + " to resume from" in r.stderr,
          r.stderr)


def timeline_stops(tmp):
    """--timeline is written at the end of the invocation's sixth step; a stop before it
    says that nothing was written (it left no file and no word)."""
    path = write_config(os.path.join(tmp, "timeline.json"), mlp_config(steps=20))
    early, late = os.path.join(tmp, "timeline-early.json"), os.path.join(tmp, "timeline-late.json")
    r = run(["train", path, "--run-dir", os.path.join(tmp, "timeline-a"), "--quiet", "--stop-after", "3",
             "--timeline", early])
    check("--timeline, stopped at step 3: no file, and a note naming it and the traced step 6",
          r.returncode == 0 and not os.path.exists(early)
          and f"no timeline written to {early}: the run stopped at step 3, before its traced step 6 ended" in r.stderr,
          r.stderr)
    r = run(["train", path, "--run-dir", os.path.join(tmp, "timeline-b"), "--quiet", "--stop-after", "6",
             "--timeline", late])
    check("--timeline, stopped at step 6: written, no note",
          r.returncode == 0 and os.path.exists(late) and "no timeline written" not in r.stderr, r.stderr)


def failed_starts(tmp):
    """A run that fails before its first step worth keeping takes its run directory back,
    so the next try is not refused as "already holds a run"; a directory of the user's
    keeps its own files."""
    cfg = {"model": {"type": "mlp", "hidden": [16]}, "data": {"dataset": "fashion_mnist", "dir": FASHION},
           "train": {"epochs": 1e17, "optimizer": {"type": "adamw", "lr": 0.001}}}
    rdir = os.path.join(tmp, "epochs-run")
    r = run(["train", write_config(os.path.join(tmp, "epochs.json"), cfg), "--run-dir", rdir, "--quiet"])
    check("1e17 epochs: exit 2 naming train.epochs and the steps (it trained 1 step)",
          r.returncode == 2 and "train.epochs: 1e+17 epochs of 60000 samples in batches of 128" in r.stderr, r.stderr)
    check("... and no run directory is left", not os.path.exists(rdir))
    # A batch of 1e10 samples is past the config's bound (it held the planner for minutes).
    cfg["train"] = {"steps": 2, "batch_size": 10 ** 10, "optimizer": {"type": "adamw", "lr": 0.001}}
    r = run(["train", write_config(os.path.join(tmp, "huge-batch.json"), cfg), "--run-dir", rdir, "--quiet"])
    check("a batch of 1e10: exit 2 naming train.batch_size and its bound",
          r.returncode == 2 and "train.batch_size: 10000000000 samples; expected at most 16777216" in r.stderr, r.stderr)
    # The largest batch allowed, 2^24 images of 784 floats, is 52.6 GB of input alone: more
    # than a machine of under 48 GB can allocate (skipped on a larger one, which might).
    with open("/proc/meminfo") as f:
        kb = {line.split(":")[0]: int(line.split()[1]) for line in f}
    if kb["MemTotal"] + kb.get("SwapTotal", 0) >= 48 * 2 ** 20:
        print("SKIP: a batch too large for memory (this machine has 48 GB or more)")
        skipped.append("a batch too large for memory")
        return
    cfg["train"]["batch_size"] = 2 ** 24
    mine = os.path.join(tmp, "users-dir")
    os.makedirs(mine)
    with open(os.path.join(mine, "notes.txt"), "w") as f:
        f.write("the user's\n")
    r = run(["train", write_config(os.path.join(tmp, "huge-batch.json"), cfg), "--run-dir", mine, "--quiet"])
    check("a batch too large for memory: exit 1 naming train.batch_size (it said only std::bad_alloc)",
          r.returncode == 1 and "ran out of host memory" in r.stderr and "train.batch_size" in r.stderr, r.stderr)
    check("... and the user's directory holds only the user's file again",
          sorted(os.listdir(mine)) == ["notes.txt"], os.listdir(mine))


def without_datasets(tmp):
    """Checks that need no dataset: they fail before any data is read."""
    # A missing dataset names the package; no run directory is created.
    missing = mlp_config()
    missing["data"]["dir"] = os.path.join(tmp, "no-such-dir")
    mpath = write_config(os.path.join(tmp, "missing.json"), missing)
    mdir = os.path.join(tmp, "missing-run")
    r = run(["train", mpath, "--run-dir", mdir, "--quiet"])
    check("missing dataset: exit 1 naming the path and the Debian package",
          r.returncode == 1 and "no-such-dir" in r.stderr and "dataset-fashion-mnist" in r.stderr, r.stderr)
    check("... and no run directory is created", not os.path.exists(mdir))

    # Overrides are validated like the config.
    r = run(["train", mpath, "--run-dir", os.path.join(tmp, "x"), "--steps", "-3"])
    check("--steps -3: exit 2 naming the option", r.returncode == 2 and "--steps" in r.stderr, r.stderr)
    r = run(["train", mpath, "--run-dir", os.path.join(tmp, "x"), "--stop-after", "-1"])
    check("--stop-after -1: exit 2 naming the option",
          r.returncode == 2 and "--stop-after" in r.stderr and not os.path.exists(os.path.join(tmp, "x")), r.stderr)
    # Options that would do nothing are refused, not ignored.
    r = run(["train", mpath, "--run-dir", os.path.join(tmp, "x"), "--inject", "nan:rank=0,at=100"])
    check("--inject after the last step: exit 2 naming it and the run's length",
          r.returncode == 2 and "at=100 is after the run's last step 20" in r.stderr, r.stderr)
    r = run(["train", mpath, "--run-dir", os.path.join(tmp, "x"), "--plan", "p.json", "--cluster", "c.json"])
    check("--plan with --cluster: exit 2 (the cluster file would be unused)",
          r.returncode == 2 and "the cluster file would be unused" in r.stderr, r.stderr)


def write_signed(path, data, head):
    """Writes a checkpoint of `data`'s length prefix and data section with header `head`
    (of the same length), signed as the writer does: crc32 over the file with its own 8
    digits zeroed. Damage its checksum cannot see (or another writer's file)."""
    import zlib
    n = int.from_bytes(data[:8], "little")
    at = head.index(b'"hetrain.crc32":"') + len(b'"hetrain.crc32":"')
    head = head[:at] + b"00000000" + head[at + 8:]
    crc = zlib.crc32(bytes(data[:8]) + head + bytes(data[8 + n:])) & 0xFFFFFFFF
    head = head[:at] + f"{crc:08x}".encode() + head[at + 8:]
    with open(path, "wb") as f:
        f.write(bytes(data[:8]) + head + bytes(data[8 + n:]))


def poison(path):
    """Sets the checkpoint's first float to NaN and signs the file again."""
    data = bytearray(open(path, "rb").read())
    n = int.from_bytes(data[:8], "little")
    data[8 + n:8 + n + 4] = b"\x00\x00\xc0\x7f"  # a quiet NaN, little-endian
    write_signed(path, data, bytes(data[8:8 + n]))


def resign(path, old, new):
    """Replaces `old` by `new` (the same length) in a checkpoint's header text and signs it
    again."""
    data = open(path, "rb").read()
    n = int.from_bytes(data[:8], "little")
    head = data[8:8 + n]
    assert len(old) == len(new) and head.count(old) == 1, (old, new)
    write_signed(path, data, head.replace(old, new))


def set_element(path, suffix, fmt, value):
    """Sets element 0 of the first tensor whose name ends with `suffix` to `value`
    (struct format `fmt`) and signs the file again; returns its name."""
    import struct
    data = bytearray(open(path, "rb").read())
    n = int.from_bytes(data[:8], "little")
    table = json.loads(bytes(data[8:8 + n]))
    name = next(k for k in table if k.endswith(suffix))
    begin = 8 + n + table[name]["data_offsets"][0]
    data[begin:begin + 4] = struct.pack("<" + fmt, value)
    write_signed(path, data, bytes(data[8:8 + n]))
    return name


def damaged_inputs(tmp, full):
    """What a failure or an odd file leaves behind is refused or repaired, never a crash,
    a hang or a broken record: a metrics line cut short, a config file name that is not
    UTF-8, a checkpoint 'file' that is a pipe, and a signed checkpoint whose step is
    impossible."""
    path = write_config(os.path.join(tmp, "mlp.json"), mlp_config())
    cut = os.path.join(tmp, "mlp-cut")
    r = run(["train", path, "--run-dir", cut, "--quiet", "--stop-after", "10"])
    with open(os.path.join(cut, "metrics.jsonl"), "a") as f:
        f.write('{"loss":0.5,"samp')  # a record cut short (a full disk, a kill mid-line)
    r = run(["train", path, "--run-dir", cut, "--resume", "--quiet"])
    lines = open(os.path.join(cut, "metrics.jsonl")).read().splitlines()
    bad = []
    for line in lines:
        try:
            json.loads(line)
        except ValueError:
            bad.append(line)
    check("a metrics line cut short: the resumed run drops it and every line is JSON",
          r.returncode == 0 and not bad and any('"resume"' in x for x in lines), (r.stderr, bad[:2]))
    check("... and the run still ends exactly", filecmp.cmp(ckpt(full, 20), ckpt(cut, 20), shallow=False))

    odd = os.path.join(tmp.encode(), b"mlp-\xff.json")
    with open(odd, "w") as f:
        json.dump(mlp_config(), f)
    odd_run = os.path.join(tmp, "mlp-odd-name")
    r = subprocess.run([HETRAIN.encode(), b"train", odd, b"--run-dir", odd_run.encode(), b"--quiet",
                        b"--stop-after", b"5"], capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    ok = r.returncode == 0 and os.path.exists(ckpt(odd_run, 5))
    if ok:
        data = open(ckpt(odd_run, 5), "rb").read()
        meta = json.loads(data[8:8 + int.from_bytes(data[:8], "little")])["__metadata__"]
        ok = meta.get("config") == "mlp-\ufffd"
    check("a config file name that is not UTF-8: the run checkpoints, the name's bad byte as U+FFFD", ok, r.stderr)

    fifo = os.path.join(tmp, "a-pipe")
    os.mkfifo(fifo)
    try:
        r = run(["eval", path, "--checkpoint", fifo], timeout=60)
        check("eval --checkpoint of a pipe: exit 1 naming it, no wait for a writer",
              r.returncode == 1 and "a-pipe" in r.stderr and "not a regular file" in r.stderr, r.stderr)
    except subprocess.TimeoutExpired:
        check("eval --checkpoint of a pipe: exit 1 naming it, no wait for a writer", False, "hung 60 s")

    # SIGTERM (a scheduler's stop, or mpirun passing on a Ctrl-C) stops as Ctrl-C does:
    # at a step boundary, after a checkpoint, with the shell's status for the signal.
    # Its log steps far apart, so that the step it stops at is not one of them.
    long_cfg = mlp_config(steps=1000000)
    long_cfg["train"]["log_every"] = 100000
    long_path = write_config(os.path.join(tmp, "mlp-long.json"), long_cfg)
    term_dir = os.path.join(tmp, "mlp-term")
    job = subprocess.Popen([HETRAIN, "train", long_path, "--run-dir", term_dir, "--quiet"], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    metrics = os.path.join(term_dir, "metrics.jsonl")
    deadline = time.monotonic() + 60
    while job.poll() is None and time.monotonic() < deadline and not (
            os.path.exists(metrics) and '"eval"' in open(metrics).read()):
        time.sleep(0.05)
    job.send_signal(signal.SIGTERM)
    try:
        _, err = job.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        job.kill()
        _, err = job.communicate()
    m = re.search(r"terminated at step (\d+)", err)
    check("SIGTERM: exit 143 after a checkpoint at the step it stopped at",
          job.returncode == 143 and m is not None and os.path.exists(ckpt(term_dir, int(m.group(1)))), err[-600:])
    logged = [json.loads(x) for x in open(metrics)] if m else []
    logged = [x["step"] for x in logged if x["type"] == "train"]
    check("SIGTERM: the window it stopped in is logged (its guard records and loss are not logged again on resume)",
          m is not None and logged and logged[-1] == int(m.group(1)), str(logged[-3:]))

    # A directory of the user's files: a new run neither overwrites nor deletes them.
    users = os.path.join(tmp, "users-files")
    os.makedirs(users)
    for name, text in (("config.json", '{"mine": true}'), (".write-test", "precious")):
        with open(os.path.join(users, name), "w") as f:
            f.write(text)
    r = run(["train", path, "--run-dir", users, "--quiet", "--stop-after", "1"])
    check("a new run into a directory holding a config.json: refused naming it, the file intact",
          r.returncode == 1 and "already holds a run (config.json)" in r.stderr
          and open(os.path.join(users, "config.json")).read() == '{"mine": true}', r.stderr)
    check("... and a file named as hetrain's old write probe is left alone",
          open(os.path.join(users, ".write-test")).read() == "precious")
    check("... and nothing of the refused run's is left there (no lock file, no checkpoints/)",
          sorted(os.listdir(users)) == [".write-test", "config.json"], str(sorted(os.listdir(users))))

    # Plan files edited by hand: no replica, or another batch than the config's.
    planned = os.path.join(tmp, "mlp-plan.json")
    r = run(["plan", path, "--cluster", "synth:1xcpu-8c", "--json", planned])
    good = json.load(open(planned))
    no_replica = json.loads(json.dumps(good))
    no_replica["layout"]["replicas"] = []
    small = json.loads(json.dumps(good))
    small["global_batch"] = small["layout"]["samples"][0] = small["ranks"][0]["samples"] = 1
    small["layout"]["micro_batches"] = [1] * len(small["layout"]["micro_batches"])
    small["ranks"][0]["micro_batches"] = 1
    zero_mbs = json.loads(json.dumps(good))
    zero_mbs["ranks"][0]["micro_batch_size"] = 0
    for name, edited, want in (("no replica", no_replica, "layout.replicas is empty"),
                               ("micro-batches of 0 samples", zero_mbs,
                                "ranks[0].micro_batch_size: 0 is out of range; expected an integer >= 1"),
                               ("a global batch of 1", small, "global_batch is 1 but this run's train.batch_size is 32")):
        edited_path = write_config(os.path.join(tmp, "mlp-plan-edited.json"), edited)
        r = run(["train", path, "--plan", edited_path, "--run-dir", os.path.join(tmp, "mlp-edited"), "--quiet"], timeout=60)
        check(f"a plan file with {name}: exit 2 naming it", r.returncode == 2 and want in r.stderr, r.stderr[-600:])

    bad_step = os.path.join(tmp, "mlp-bad-step")
    r = run(["train", path, "--run-dir", bad_step, "--quiet", "--stop-after", "10"])
    resign(ckpt(bad_step, 10), b'"step":"10"', b'"step":"-5"')
    r = run(["eval", path, "--checkpoint", ckpt(bad_step, 10)])
    check("a signed checkpoint at step -5: eval refuses it, naming the step",
          r.returncode == 1 and "metadata 'step' is -5" in r.stderr, r.stderr)
    r = run(["train", path, "--run-dir", bad_step, "--resume", "--quiet"])
    check("... and a resume passes over it, naming it and its step, to the one before",
          r.returncode == 0 and "ckpt-00000010.safetensors: its metadata is of step -5, its name of step 10" in r.stderr
          and "using ckpt-00000005.safetensors" in r.stderr, r.stderr)
    check("... and keeps it aside when it writes step 10's", os.path.exists(ckpt(bad_step, 10) + ".unreadable"),
          sorted(os.listdir(os.path.dirname(ckpt(bad_step, 10)))))
    resign(ckpt(bad_step, 10), b'"model":"mlp"', b'"model":"cnn"')
    r = run(["eval", path, "--checkpoint", ckpt(bad_step, 10)])
    check("a signed checkpoint naming another model: eval refuses it, naming both",
          r.returncode == 1 and "holds a cnn model but the config builds a mlp model" in r.stderr, r.stderr)

    # A warm-up as long as the run (the config's 3 steps, run for 3) is said on stderr,
    # --quiet or not; one step more and it is not.
    r = run(["train", path, "--run-dir", os.path.join(tmp, "mlp-warmup"), "--quiet", "--steps", "3"])
    check("a warm-up as long as the run: trained, with a warning naming both counts",
          r.returncode == 0 and "train.schedule.warmup_steps 3 is not below the run's 3 steps" in r.stderr, r.stderr)
    r = run(["train", path, "--run-dir", os.path.join(tmp, "mlp-warmup-4"), "--quiet", "--steps", "4"])
    check("... and none where it ends before the run", r.returncode == 0 and "warmup_steps" not in r.stderr, r.stderr)

    # Signed optimiser state that training cannot produce: a resume names the checkpoint
    # and the value, where it had trained on NaN weights (a negative exp_avg_sq) or failed
    # only at the next checkpoint, its counter run past int32 (a step count far ahead).
    bad_state = os.path.join(tmp, "mlp-bad-state")
    r = run(["train", path, "--run-dir", bad_state, "--quiet", "--stop-after", "10"])
    name = set_element(ckpt(bad_state, 10), ".exp_avg_sq", "f", -1.0)
    r = run(["train", path, "--run-dir", bad_state, "--resume", "--quiet"])
    check("a signed checkpoint with a negative exp_avg_sq: resume exits 1 naming the file, the tensor and the value",
          r.returncode == 1 and "ckpt-00000010.safetensors: its optimizer state is refused" in r.stderr
          and f"'{name[len('optim.'):]}' holds -1 at element 0; expected values >= 0" in r.stderr, r.stderr[-800:])
    r = run(["train", path, "--run-dir", bad_state + "-step", "--quiet", "--stop-after", "10"])
    set_element(ckpt(bad_state + "-step", 10), "optim.step", "i", 2147483647)
    r = run(["train", path, "--run-dir", bad_state + "-step", "--resume", "--quiet"])
    check("a signed checkpoint whose optimizer counts 2^31 - 1 steps at step 10: resume exits 1 naming both",
          r.returncode == 1 and "ckpt-00000010.safetensors" in r.stderr
          and "optimizer state counts 2147483647 steps, past the checkpoint's step 10" in r.stderr, r.stderr[-800:])

    # A signed checkpoint holding a NaN: eval refuses it; resume passes over it to the one
    # before (it trained on, and then could never checkpoint again).
    nan_run = os.path.join(tmp, "mlp-nan")
    r = run(["train", path, "--run-dir", nan_run, "--quiet", "--stop-after", "15"])
    poison(ckpt(nan_run, 15))
    r = run(["eval", path, "--checkpoint", ckpt(nan_run, 15)])
    check("a signed checkpoint holding a NaN: eval exits 1 naming the tensor and the value",
          r.returncode == 1 and "holds nan at element 0" in r.stderr, r.stderr)
    r = run(["train", path, "--run-dir", nan_run, "--resume", "--quiet"])
    check("... and resume passes over it, naming it, to step 10's, and ends exactly",
          r.returncode == 0 and "ckpt-00000015" in r.stderr
          and filecmp.cmp(ckpt(full, 20), ckpt(nan_run, 20), shallow=False), r.stderr[-800:])


def main():
    tmp = tempfile.mkdtemp(prefix="hetrain-e2e-")
    try:
        without_datasets(tmp)
        absent = [d for d in (FASHION, FORTUNES) if not os.path.isdir(d)]
        if absent:
            # The checks above ran; the rest train, and cannot run here.
            print(f"SKIP: {', '.join(absent)} not installed (tools/setup installs them)")
            return 1 if failures else 77
        path, full, split = exact_resume(tmp, "mlp", mlp_config(), 20, 10)
        timeline_stops(tmp)
        _, gpt_full, _ = exact_resume(tmp, "gpt", gpt_config(), 12, 5)
        # The GPT's heads do not shape its weights: eval checks the model the checkpoint
        # records (it evaluated 4 heads' worth of another model without a word).
        other = gpt_config()
        other["model"]["heads"] = 4
        r = run(["eval", write_config(os.path.join(tmp, "gpt-heads.json"), other), "--checkpoint", ckpt(gpt_full, 12)])
        check("eval with another head count: exit 1 naming both models",
              r.returncode == 1 and '"heads":2' in r.stderr and '"heads":4' in r.stderr
              and "was trained with the model" in r.stderr, r.stderr)
        other["model"]["dropout"] = 0.5  # off when evaluating: not a difference
        other["model"]["heads"] = 2
        r = run(["eval", write_config(os.path.join(tmp, "gpt-dropout.json"), other), "--checkpoint", ckpt(gpt_full, 12)])
        check("... another dropout is no difference", r.returncode == 0, r.stderr)

        # The run directory's files.
        with open(os.path.join(full, "metrics.jsonl")) as f:
            records = [json.loads(line) for line in f]
        train = [r for r in records if r["type"] == "train"]
        evals = [r for r in records if r["type"] == "eval"]
        check("metrics: a train record every log_every steps", [r["step"] for r in train] == [5, 10, 15, 20])
        check("metrics: train records carry step, loss, lr, samples/s, wall time",
              all({"step", "loss", "lr", "samples_per_s", "wall_s"} <= r.keys() for r in train))
        check("metrics: evaluations at eval_every and the end", [r["step"] for r in evals] == [10, 20])
        check("metrics: evaluations carry accuracy and loss",
              all(0 <= r["test_accuracy"] <= 1 and r["test_loss"] > 0 for r in evals))
        with open(os.path.join(full, "summary.json")) as f:
            summary = json.load(f)
        check("summary: steps, samples, wall time, samples/s, final metrics",
              summary["steps"] == 20 and summary["samples"] == 640 and summary["wall_s"] > 0
              and summary["mean_samples_per_s"] > 0 and "test_accuracy" in summary["final"])
        with open(os.path.join(full, "config.json")) as f:
            resolved = json.load(f)
        check("config.json: the resolved config with defaults filled",
              resolved["train"]["steps"] == 20 and resolved["model"]["hidden"] == [32]
              and "keep" in resolved["checkpoint"])
        ckpts = sorted(os.listdir(os.path.join(full, "checkpoints")))
        check("checkpoints: the newest `keep` are kept", ckpts == [os.path.basename(ckpt(full, s)) for s in (10, 15, 20)], ckpts)

        # eval on a checkpoint gives the run's final figures.
        r = run(["eval", path, "--checkpoint", ckpt(full, 20)])
        ok = r.returncode == 0
        if ok:
            got = json.loads(r.stdout)
            ok = abs(got["test_accuracy"] - summary["final"]["test_accuracy"]) < 1e-12 and got["step"] == 20
        check("eval --checkpoint reproduces the final evaluation", ok, r.stderr + r.stdout)

        # A new run refuses to overwrite an existing one.
        before = sorted(os.listdir(os.path.join(full, "checkpoints")))
        r = run(["train", path, "--run-dir", full, "--quiet"])
        check("a new run into a used run directory is refused, naming --resume",
              r.returncode == 1 and "--resume" in r.stderr and full in r.stderr, r.stderr)
        check("... and the earlier run is untouched", sorted(os.listdir(os.path.join(full, "checkpoints"))) == before)

        # Corrupt newest checkpoint: reported, the previous one is used, result still exact.
        corrupt = os.path.join(tmp, "mlp-corrupt")
        r = run(["train", path, "--run-dir", corrupt, "--quiet", "--stop-after", "10"])
        with open(ckpt(corrupt, 10), "r+b") as f:
            f.seek(-3, os.SEEK_END)
            b = f.read(1)
            f.seek(-3, os.SEEK_END)
            f.write(bytes([b[0] ^ 0xFF]))
        r = run(["train", path, "--run-dir", corrupt, "--resume"])
        check("corrupt newest checkpoint: resume succeeds from the previous one",
              r.returncode == 0 and "checksum" in r.stderr and "at step 5" in r.stdout, r.stdout + r.stderr)
        check("corrupt newest checkpoint: the final result is still exact",
              filecmp.cmp(ckpt(full, 20), ckpt(corrupt, 20), shallow=False))

        # A changed step/data position in the newest header: caught by the checksum, which
        # covers the header, and the previous checkpoint is used; the result is still exact.
        header = os.path.join(tmp, "mlp-header")
        r = run(["train", path, "--run-dir", header, "--quiet", "--stop-after", "10"])
        with open(ckpt(header, 10), "rb") as f:
            data = f.read()
        n = int.from_bytes(data[:8], "little")
        meta = json.loads(data[8:8 + n])["__metadata__"]
        norm = json.loads(meta.get("input_normalization", "{}"))
        check("checkpoint metadata: the input normalisation and the model config",
              norm.get("mean") == 0.286 and norm.get("std") == 0.353
              and json.loads(meta.get("model_config", "{}")) == {"type": "mlp", "hidden": [32]}, meta)
        old_pos = f'"sample_position":"{meta["sample_position"]}"'.encode()
        new_pos = f'"sample_position":"{int(meta["sample_position"]) - 32:0{len(meta["sample_position"])}d}"'.encode()
        with open(ckpt(header, 10), "wb") as f:
            f.write(data.replace(old_pos, new_pos, 1))
        r = run(["train", path, "--run-dir", header, "--resume"])
        check("header-corrupted newest checkpoint: resume succeeds from the previous one",
              r.returncode == 0 and "checksum" in r.stderr and "at step 5" in r.stdout, r.stdout + r.stderr)
        check("header-corrupted newest checkpoint: the final result is still exact",
              filecmp.cmp(ckpt(full, 20), ckpt(header, 20), shallow=False))

        # Resume into a different model names the mismatching tensor and changes nothing.
        other = write_config(os.path.join(tmp, "mlp-wide.json"), mlp_config(hidden=(48,)))
        snapshot = {n: open(os.path.join(split, "checkpoints", n), "rb").read()
                    for n in os.listdir(os.path.join(split, "checkpoints"))}
        r = run(["train", other, "--run-dir", split, "--resume", "--quiet"])
        check("resume with another model is refused by the recorded config (exit 2), naming both",
              r.returncode == 2 and '"hidden":[48]' in r.stderr and '"hidden":[32]' in r.stderr, r.stderr)
        # Without the recorded config, the checkpoint's own record of its model is checked.
        recorded = os.path.join(split, "config.json")
        os.rename(recorded, recorded + ".away")
        r = run(["train", other, "--run-dir", split, "--resume", "--quiet"])
        os.rename(recorded + ".away", recorded)
        check("resume with another model and no config.json fails by the checkpoint's model_config, naming both",
              r.returncode == 1 and "was trained with the model" in r.stderr and '"hidden":[32]' in r.stderr
              and '"hidden":[48]' in r.stderr, r.stderr)
        after = {n: open(os.path.join(split, "checkpoints", n), "rb").read()
                 for n in os.listdir(os.path.join(split, "checkpoints"))}
        check("... and the run's checkpoints are unchanged", snapshot == after)

        # A full disk while checkpointing: a clear error, earlier checkpoints intact, resumable.
        disk = os.path.join(tmp, "mlp-disk")
        r = run(["train", path, "--run-dir", disk, "--quiet", "--stop-after", "5"])
        kept = open(ckpt(disk, 5), "rb").read()
        size_kib = len(kept) // 1024

        def limit_file_size():
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            import resource
            resource.setrlimit(resource.RLIMIT_FSIZE, (len(kept) // 2, len(kept) // 2))

        env = dict(os.environ, OMP_NUM_THREADS="1")
        r = subprocess.run([HETRAIN, "train", path, "--run-dir", disk, "--resume", "--quiet"],
                           capture_output=True, text=True, env=env, preexec_fn=limit_file_size)
        check(f"full disk (file size limit {size_kib // 2} KiB): nonzero exit naming the checkpoint and the reason",
              r.returncode == 1 and "ckpt-00000010" in r.stderr and "File too large" in r.stderr, r.stderr)
        check("... the earlier checkpoint is byte for byte intact", open(ckpt(disk, 5), "rb").read() == kept)
        check("... no temporary file is left behind",
              not any(n.endswith(".tmp") for n in os.listdir(os.path.join(disk, "checkpoints"))))
        r = run(["train", path, "--run-dir", disk, "--resume", "--quiet"])
        check("... and the run resumes and finishes exactly once space is back",
              r.returncode == 0 and filecmp.cmp(ckpt(full, 20), ckpt(disk, 20), shallow=False), r.stderr)

        # An unwritable run directory.
        blocker = os.path.join(tmp, "a-file")
        open(blocker, "w").close()
        r = run(["train", path, "--run-dir", os.path.join(blocker, "run"), "--quiet"])
        check("unwritable run directory: exit 1 naming it", r.returncode == 1 and "a-file/run" in r.stderr, r.stderr)

        damaged_inputs(tmp, full)
        evaluation_memory(tmp)
        unplanned_cap(tmp)
        failed_starts(tmp)
        changed_resume(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{len(failures)} failed")
    if failures:
        return 1
    if skipped:
        print("SKIP: some checks need what this machine lacks: " + "; ".join(skipped))
        return 77
    return 0


if __name__ == "__main__":
    sys.exit(main())
