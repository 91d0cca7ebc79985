#!/usr/bin/env python3
"""End-to-end check of the dynamic loss scale (train.loss_scale) on 2 CPU ranks in fp32,
where it can run without a GPU: the same wiring serves train.precision fp16 on one.

- Exactness. The scales are powers of two, so seeding the backward pass with 2^16 and
  unscaling the reduced gradients changes no bit while nothing overflows or underflows
  (every op of the backward pass is linear in its incoming gradient, and multiplying a
  float by a power of two is exact away from the ends of its range; this MLP's
  gradients lie nowhere near them). A 40-step run with a dynamic scale that doubles
  every 10 steps must end with checkpoints bit-identical to the run without one, and
  with the scale at 2^16 x 2^4.
- Resume. Stopped at step 20 and resumed, the run's checkpoint carries the scale and its
  clean steps: it ends at the same scale and the same bits as the run in one go.
- Overflow. A NaN injected into rank 1's gradient in steps 10 to 20, with the scale
  starting at 16 (min 1): while the scale is above its least each NaN is an overflow:
  rank 1 is left out, the scale halves on both ranks (16, 8, 4, 2, 1: four steps), and
  no offence counts. At the least scale the NaN is the guard's non-finite gradient:
  three offences (steps 14-16) quarantine rank 1. The loss stays finite and every
  checkpoint holds finite values.
- The same under parallel.sync deadline (exactness, the scale's records, the overflow).

usage: test_loss_scale.py HETRAIN"""
import array
import glob
import json
import math
import os
import sys
import tempfile

from e2e_util import ROOT, check, finish, have_fashion_mnist, load, mpirun, records, safetensors

HETRAIN = os.path.abspath(sys.argv[1])
RANKS = 2
STEPS = 40


def config(path, loss_scale=None, guard=None, sync="sync"):
    cfg = load(os.path.join(ROOT, "configs", "fashion_mnist_mlp.json"))
    cfg["train"].pop("epochs")
    cfg["train"].update(steps=STEPS, eval_every=0, log_every=10)
    cfg["train"]["schedule"] = {"type": "constant"}
    if loss_scale is not None:
        cfg["train"]["loss_scale"] = loss_scale
    cfg["checkpoint"] = {"every": 10, "keep": 100}
    cfg["parallel"] = {"strategy": "equal", "sync": sync}
    if sync == "deadline":  # a budget of a thousand steps: a step closes when both ranks are in
        cfg["parallel"]["deadline_slack"] = 1000
    if guard is not None:
        cfg["guard"] = guard
    with open(path, "w") as f:
        json.dump(cfg, f)
    return path


def checkpoint(path):
    """(metadata, {name: raw bytes}) of a safetensors checkpoint."""
    meta, tensors = safetensors(path)
    return meta, {k: raw for k, (_, raw) in tensors.items()}


def final_checkpoint(run_dir):
    return os.path.join(run_dir, "checkpoints", f"ckpt-{STEPS:08d}.safetensors")


def main():
    if not have_fashion_mnist():
        print("SKIP: Fashion-MNIST is not installed")
        return finish(missing=["Fashion-MNIST"])
    scratch = tempfile.mkdtemp(prefix="hetrain-e2e-loss-scale-")
    dynamic = {"mode": "dynamic", "initial": 65536, "growth_interval": 10}
    plain_cfg = config(os.path.join(scratch, "plain.json"))
    scaled_cfg = config(os.path.join(scratch, "scaled.json"), dynamic)
    plain, scaled, resumed = (os.path.join(scratch, d) for d in ("plain", "scaled", "resumed"))
    runs = [mpirun(HETRAIN, RANKS, ["train", plain_cfg, "--run-dir", plain], timeout=300),
            mpirun(HETRAIN, RANKS, ["train", scaled_cfg, "--run-dir", scaled], timeout=300),
            mpirun(HETRAIN, RANKS, ["train", scaled_cfg, "--run-dir", resumed, "--stop-after", "20"], timeout=300)]
    for name, r in zip(("without a loss scale", "with a dynamic loss scale", "stopped at step 20"), runs):
        check(f"2 ranks train {name}", r.returncode == 0, r.stderr[-2000:])
    if any(r.returncode for r in runs):
        return finish(scratch)
    meta20, _ = checkpoint(os.path.join(resumed, "checkpoints", "ckpt-00000020.safetensors"))
    check("the step-20 checkpoint holds the scale (2^18) and its clean steps",
          meta20.get("loss_scale_log2") == "18" and meta20.get("loss_scale_clean_steps") == "0", meta20)
    r = mpirun(HETRAIN, RANKS, ["train", scaled_cfg, "--run-dir", resumed, "--resume"], timeout=300)
    check("the stopped run resumes to step 40", r.returncode == 0, r.stderr[-2000:])
    if r.returncode:
        return finish(scratch)

    _, want = checkpoint(final_checkpoint(plain))
    for name, run_dir in (("the scaled run", scaled), ("the resumed run", resumed)):
        _, got = checkpoint(final_checkpoint(run_dir))
        differ = sorted(k for k in want if got.get(k) != want[k])
        check(f"{name}'s final checkpoint is bit-identical to the unscaled run's (weights and optimiser state)",
              len(got) == len(want) > 0 and not differ, differ[:5])
        summary = load(os.path.join(run_dir, "summary.json"))
        check(f"{name} ends at 2^16 x 2^4 with no overflow",
              summary.get("loss_scale") == {"final": 2.0 ** 20, "overflow_steps": 0}, summary.get("loss_scale"))
    check("the unscaled run's summary has no loss scale", "loss_scale" not in load(os.path.join(plain, "summary.json")))
    scales = [(m["step"], m.get("loss_scale")) for m in records(scaled) if m["type"] == "train"]
    check("each train record gives the scale after its step (doubled on every 10th)",
          scales == [(10, 2.0 ** 17), (20, 2.0 ** 18), (30, 2.0 ** 19), (40, 2.0 ** 20)], scales)
    check("the unscaled run's train records give none",
          not any("loss_scale" in m for m in records(plain) if m["type"] == "train"))

    # Overflow: the scale halves while it can, then the guard takes over.
    nan_cfg = config(os.path.join(scratch, "nan.json"), {"mode": "dynamic", "initial": 16, "min": 1},
                     {"quarantine_after": 3, "quarantine_steps": 10})
    poisoned = os.path.join(scratch, "poisoned")
    b = mpirun(HETRAIN, RANKS, ["train", nan_cfg, "--run-dir", poisoned, "--inject", "nan:rank=1,at=10,steps=11"],
               timeout=300)
    check("the run with a NaN in rank 1's gradient in steps 10-20 succeeds", b.returncode == 0, b.stderr[-2000:])
    if b.returncode:
        return finish(scratch)
    metrics = records(poisoned)
    losses = [m["loss"] for m in metrics if m["type"] == "train"]
    check("every logged loss is finite", len(losses) == STEPS // 10 and all(math.isfinite(x) for x in losses), losses)
    guard = [m for m in metrics if m["type"] == "guard"]
    overflows = [m["step"] for m in guard if m.get("reason") == "overflow (loss scale halved)"]
    check("rank 1's NaN is an overflow in steps 10-13, while the scale halves from 16 to 1",
          overflows == [10, 11, 12, 13] and all(m["rank"] == 1 for m in guard), guard)
    offences = [m["step"] for m in guard if m.get("reason") == "non-finite gradient"]
    check("at the least scale it is a non-finite gradient (steps 14-16)", offences == [14, 15, 16], guard)
    quarantine = [(m["rank"], m["step"]) for m in guard if "quarantined_steps" in m]
    check("the overflows count no offence: rank 1 is quarantined at step 16, after three non-finite steps",
          quarantine == [(1, 16)], guard)
    summary = load(os.path.join(poisoned, "summary.json"))
    check("the summary gives the final scale and the four overflow steps",
          summary.get("loss_scale") == {"final": 1.0, "overflow_steps": 4}, summary.get("loss_scale"))
    check("rank 0 prints each overflow, naming the rank",
          "step 10: rank 1 left out of the step (overflow (loss scale halved), 64 samples)" in b.stdout,
          b.stdout[-3000:])
    bad = []
    for path in sorted(glob.glob(os.path.join(poisoned, "checkpoints", "*.safetensors"))):
        _, ts = checkpoint(path)
        for name, raw in ts.items():
            if not all(math.isfinite(x) for x in array.array("f", raw)):
                bad.append((os.path.basename(path), name))
    check("every checkpoint holds only finite values", not bad, bad[:5])
    deadline(scratch)
    return finish(scratch)


def finite_checkpoints(run_dir):
    """The (checkpoint, tensor) pairs that hold a non-finite value."""
    bad = []
    for path in sorted(glob.glob(os.path.join(run_dir, "checkpoints", "*.safetensors"))):
        for name, raw in checkpoint(path)[1].items():
            if not all(math.isfinite(x) for x in array.array("f", raw)):
                bad.append((os.path.basename(path), name))
    return bad


def deadline(scratch):
    """The same under parallel.sync deadline, where every rank updates the scale from the
    verdicts in each step's record and a contribution goes out unscaled. Exactness holds
    when both runs closed every step with both ranks (the budget is a thousand steps
    long): then the leader summed the same contributions in the same order. The
    overflow's steps are derived from the contributions records: rank 1's first four
    contributions from step 10 on are overflows, the next three non-finite gradients, the
    third of which quarantines it (with both ranks in every step: 10-13, 14-16, as under
    sync)."""
    dynamic = {"mode": "dynamic", "initial": 65536, "growth_interval": 10}
    plain, scaled = os.path.join(scratch, "deadline-plain"), os.path.join(scratch, "deadline-scaled")
    runs = [mpirun(HETRAIN, RANKS, ["train", config(os.path.join(scratch, "dl-plain.json"), sync="deadline"),
                                    "--run-dir", plain], timeout=300),
            mpirun(HETRAIN, RANKS, ["train", config(os.path.join(scratch, "dl-scaled.json"), dynamic, sync="deadline"),
                                    "--run-dir", scaled], timeout=300)]
    for name, r in zip(("without a loss scale", "with a dynamic loss scale"), runs):
        check(f"deadline: 2 ranks train {name}", r.returncode == 0, r.stderr[-2000:])
    if any(r.returncode for r in runs):
        return
    summary = load(os.path.join(scaled, "summary.json"))
    check("deadline: the scaled run ends at 2^16 x 2^4 with no overflow",
          summary.get("loss_scale") == {"final": 2.0 ** 20, "overflow_steps": 0}, summary.get("loss_scale"))
    scales = [(m["step"], m.get("loss_scale")) for m in records(scaled) if m["type"] == "train"]
    check("deadline: each train record gives the scale after its step",
          scales == [(10, 2.0 ** 17), (20, 2.0 ** 18), (30, 2.0 ** 19), (40, 2.0 ** 20)], scales)
    whole = [load(os.path.join(d, "summary.json"))["deadline"] for d in (plain, scaled)]
    if all(w["steps_closed_short"] == 0 and w["catch_ups"] == 0 and w["steps_led_by_a_backup"] == 0 for w in whole):
        _, want = checkpoint(final_checkpoint(plain))
        _, got = checkpoint(final_checkpoint(scaled))
        differ = sorted(k for k in want if got.get(k) != want[k])
        check("deadline: the scaled run's final checkpoint is bit-identical to the unscaled run's",
              len(got) == len(want) > 0 and not differ, differ[:5])
    else:
        print(f"note: the deadline runs' checkpoints not compared: a step closed short or was led elsewhere {whole}")

    # A catch-up carries the scale: rank 0, stalled 3 s at step 15 under the default
    # slack, is left out and then takes rank 1's state, with its scale; its summary must
    # end at the chain's 2^20 (40 clean steps), not at the 2^17 it had when it stopped.
    stalled = os.path.join(scratch, "deadline-stalled")
    cfg = load(os.path.join(scratch, "dl-scaled.json"))
    cfg["parallel"].pop("deadline_slack")
    with open(os.path.join(scratch, "dl-stalled.json"), "w") as f:
        json.dump(cfg, f)
    r = mpirun(HETRAIN, RANKS, ["train", os.path.join(scratch, "dl-stalled.json"), "--run-dir", stalled,
                                "--inject", "stall:rank=0,at=15,for=3"], timeout=300)
    check("deadline: the run with rank 0 stalled 3 s at step 15 succeeds", r.returncode == 0, r.stderr[-2000:])
    if r.returncode == 0:
        summary = load(os.path.join(stalled, "summary.json"))
        check("deadline: rank 0 was caught up", summary["deadline"]["catch_ups"] >= 1, summary["deadline"])
        check("deadline: rank 0 ends at the chain's scale, 2^20, which the catch-up carried",
              summary.get("loss_scale") == {"final": 2.0 ** 20, "overflow_steps": 0}, summary.get("loss_scale"))

    nan_cfg = config(os.path.join(scratch, "dl-nan.json"), {"mode": "dynamic", "initial": 16, "min": 1},
                     {"quarantine_after": 3, "quarantine_steps": 10}, sync="deadline")
    poisoned = os.path.join(scratch, "deadline-poisoned")
    b = mpirun(HETRAIN, RANKS, ["train", nan_cfg, "--run-dir", poisoned, "--inject", "nan:rank=1,at=10,steps=11"],
               timeout=300)
    check("deadline: the run with a NaN in rank 1's gradient in steps 10-20 succeeds", b.returncode == 0,
          b.stderr[-2000:])
    if b.returncode:
        return
    metrics = records(poisoned)
    losses = [m["loss"] for m in metrics if m["type"] == "train"]
    check("deadline: every logged loss is finite", len(losses) == STEPS // 10 and all(math.isfinite(x) for x in losses),
          losses)
    fresh = {m["step"]: {c[0] for c in m["contributors"] if c[2] == 0} for m in metrics if m["type"] == "contributions"}
    poisoned_steps = [s for s in sorted(fresh) if 10 <= s <= 20 and 1 in fresh[s]]
    check("deadline: rank 1 contributed to at least seven of its poisoned steps", len(poisoned_steps) >= 7,
          poisoned_steps)
    if len(poisoned_steps) < 7:
        return
    guard = [m for m in metrics if m["type"] == "guard"]
    check("deadline: rank 1's NaN is an overflow in its first four poisoned steps, while the scale halves to 1",
          [m["step"] for m in guard if m.get("reason") == "overflow (loss scale halved)"] == poisoned_steps[:4]
          and all(m["rank"] == 1 for m in guard), guard)
    check("deadline: at the least scale it is a non-finite gradient in the next three",
          [m["step"] for m in guard if m.get("reason") == "non-finite gradient"] == poisoned_steps[4:7], guard)
    check("deadline: the overflows count no offence: rank 1 is quarantined at the third non-finite step",
          [(m["rank"], m["step"]) for m in guard if "quarantined_steps" in m] == [(1, poisoned_steps[6])], guard)
    summary = load(os.path.join(poisoned, "summary.json"))
    check("deadline: the summary gives the final scale and the four overflow steps",
          summary.get("loss_scale") == {"final": 1.0, "overflow_steps": 4}, summary.get("loss_scale"))
    bad = finite_checkpoints(poisoned)
    check("deadline: every checkpoint holds only finite values", not bad, bad[:5])


if __name__ == "__main__":
    sys.exit(main())
