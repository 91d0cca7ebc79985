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


def config(path, loss_scale=None, guard=None):
    cfg = load(os.path.join(ROOT, "configs", "fashion_mnist_mlp.json"))
    cfg["train"].pop("epochs")
    cfg["train"].update(steps=STEPS, eval_every=0, log_every=10)
    cfg["train"]["schedule"] = {"type": "constant"}
    if loss_scale is not None:
        cfg["train"]["loss_scale"] = loss_scale
    cfg["checkpoint"] = {"every": 10, "keep": 100}
    cfg["parallel"] = {"strategy": "equal", "sync": "sync"}
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
    return finish(scratch)


if __name__ == "__main__":
    sys.exit(main())
