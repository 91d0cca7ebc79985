#!/usr/bin/env bash
# The hetrain binary's global surface: --version, --help, `info`, and a clear error
# with a nonzero exit for an unknown subcommand, a synth: cluster given to train and an
# unknown device.
set -u
hetrain=$1
fail=0
check() {  # check NAME CONDITION...
  local name=$1; shift
  if "$@"; then echo "ok   $name"; else echo "FAIL $name"; fail=1; fi
}

out=$("$hetrain" --version); rc=$?
check "--version exits 0" test $rc -eq 0
check "--version prints the version" grep -qE '^hetrain [0-9]+\.[0-9]+\.[0-9]+$' <<<"$out"

out=$("$hetrain" --help); rc=$?
check "--help exits 0" test $rc -eq 0
check "--help lists info" grep -q 'info' <<<"$out"

out=$("$hetrain" info --json); rc=$?
check "info --json exits 0" test $rc -eq 0
check "info --json is JSON with the cpu backend and its ops" python3 -c '
import json, sys
d = json.loads(sys.stdin.read())
cpu = [b for b in d["backends"] if b["name"] == "cpu"][0]
assert d["threads"] >= 1 and "gemm" in cpu["supported_ops"] and cpu["memory_total_bytes"] > 0
' <<<"$out"
check "info --json names the CUDA module where the build has one, a file beside hetrain" python3 -c '
import json, os, sys
d = json.loads(sys.stdin.read())
assert d["cuda_backend"] in (True, False)
assert (not d["cuda_backend"] and "cuda_module" not in d) or os.path.isfile(d["cuda_module"]), d
' <<<"$out"

# The products never run on a kernel set without the AVX2 the CPU has (blas_kernels.h):
# where OpenBLAS fell back (an unknown CPU model), hetrain re-executed itself with
# OPENBLAS_CORETYPE set; a user's own OPENBLAS_CORETYPE stands.
blas_check='
import json, sys
d = json.loads(sys.stdin.read())
flags = set()
for line in open("/proc/cpuinfo"):
    if line.startswith("flags"):
        flags = set(line.split(":", 1)[1].split())
        break
avx512 = {"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"} <= flags
avx2 = {"avx2", "fma"} <= flags
level = {"SkylakeX": 2, "Cooperlake": 2, "SapphireRapids": 2, "Haswell": 1, "Zen": 1, "Excavator": 1}.get(d["blas_kernels"], 0)
want = sys.argv[1]
if want:
    assert d["blas_kernels"] == want, d
else:
    assert level > 0 or not (avx2 or avx512), ("a kernel set without AVX2 on a CPU with it", d["blas_kernels"], d["blas_kernels_text"])
'
out=$(env -u OPENBLAS_CORETYPE -u HETRAIN_BLAS_FALLBACK "$hetrain" info --json); rc=$?
check "info --json names OpenBLAS's kernels, with AVX2 on a CPU that has it" python3 -c "$blas_check" "" <<<"$out"
out=$(OPENBLAS_CORETYPE=Prescott "$hetrain" info --json); rc=$?
check "a user's OPENBLAS_CORETYPE is kept" python3 -c "$blas_check" Prescott <<<"$out"

err=$("$hetrain" no-such-verb 2>&1); rc=$?
check "unknown subcommand exits nonzero" test $rc -ne 0
check "unknown subcommand is named" grep -q 'no-such-verb' <<<"$err"

err=$("$hetrain" plan "$(dirname "$0")/../../configs/fashion_mnist_mlp.json" --what-if-steps abc 2>&1); rc=$?
check "a rejected option exits 2, like a rejected config" test $rc -eq 2
check "a rejected option is one line naming it" test "$(wc -l <<<"$err")" -eq 1
check "... the option and its value" grep -q -- '--what-if-steps.*abc' <<<"$err"
out=$("$hetrain" plan "$(dirname "$0")/../../configs/fashion_mnist_mlp.json" --cluster synth:2xrtx3060 \
  --what-if stall:rank=0,at=1,for=1 --what-if-steps 0010 2>&1); rc=$?
check "a whole-number option is read in decimal (0010 is 10, not octal 8)" grep -q "what if, over 10 steps" <<<"$out"
for bad in "--seed -1" "--steps 99999999999999999999999" "--stop-after ''" "--steps 1.5"; do
  err=$(eval "\"\$hetrain\" train \"$(dirname "$0")/../../configs/fashion_mnist_mlp.json\" $bad" 2>&1); rc=$?
  check "train $bad: refused with exit 2 naming the option" test $rc -eq 2 -a -n "$(grep -- "${bad%% *}" <<<"$err")"
done
plan_cfg="$(dirname "$0")/../../configs/fashion_mnist_mlp.json"
# An option's value forgotten: the next option is not taken as it.
for bad in "train $plan_cfg --run-dir -q" "train $plan_cfg --inject --run-dir x" "plan $plan_cfg --json --svg" \
           "probe --json -h"; do
  err=$("$hetrain" $bad 2>&1); rc=$?
  check "$bad: refused (exit 2): the option's value is missing" \
    test $rc -eq 2 -a -n "$(grep -- "is an option of this command, not a value: its value is missing" <<<"$err")"
done
test ! -e ./-q -a ! -e ./x
check "... and nothing was written" test $? -eq 0
tl_dir=$(mktemp -d)
for bad in "--timeline $tl_dir" "--timeline $tl_dir/missing/t.json" "--run-dir ''"; do
  err=$(eval "\"\$hetrain\" train \"$(dirname "$0")/../../configs/fashion_mnist_mlp.json\" --run-dir $tl_dir/run $bad" 2>&1); rc=$?
  check "train $bad: refused before any work (exit 2, no run directory)" test $rc -eq 2 -a ! -e "$tl_dir/run"
done
# plan's outputs: checked before any is written, and written only once all are made.
plan_cfg="$(dirname "$0")/../../configs/fashion_mnist_mlp.json"
for bad in "--json $tl_dir/same --svg $tl_dir/same" "--json ''" "--json $tl_dir" \
           "--json $tl_dir/p.json --svg $tl_dir/missing/p.svg"; do
  err=$(eval "\"\$hetrain\" plan \"$plan_cfg\" --cluster synth:2xrtx3060 $bad" 2>&1); rc=$?
  check "plan $bad: refused with exit 2 naming the option, nothing written" \
    test $rc -eq 2 -a -n "$(grep -- '^hetrain: config error: --' <<<"$err")" -a ! -e "$tl_dir/same" -a ! -e "$tl_dir/p.json"
done
for bad in "--json ''" "--json $tl_dir/missing/f.json"; do
  err=$(eval "\"\$hetrain\" probe --quick $bad" 2>&1); rc=$?
  check "probe $bad: refused before probing (exit 2, one line naming the option)" \
    test $rc -eq 2 -a "$(wc -l <<<"$err")" -eq 1 -a -n "$(grep -- '^hetrain: config error: --json' <<<"$err")"
done
# No output replaces a run's state: its lock (a second run could share the directory),
# its own files, its checkpoints, or a checkpoint anywhere, through a link too. A user's
# own file in a run directory may be written.
run=$tl_dir/run-state
mkdir -p "$run/checkpoints"
printf 'lock' >"$run/.hetrain.lock"
printf '{}\n' >"$run/metrics.jsonl"
printf 'checkpoint bytes' >"$run/checkpoints/ckpt-00000005.safetensors"
printf 'checkpoint bytes' >"$tl_dir/kept.safetensors"
ln -s "$run/checkpoints/ckpt-00000005.safetensors" "$tl_dir/link.json"
before=$(cat "$run/.hetrain.lock" "$run/metrics.jsonl" "$run/checkpoints/ckpt-00000005.safetensors" "$tl_dir/kept.safetensors" | md5sum)
for bad in "plan $plan_cfg --cluster synth:2xrtx3060 --json $run/checkpoints/ckpt-00000005.safetensors" \
           "plan $plan_cfg --cluster synth:2xrtx3060 --trace $run/.hetrain.lock" \
           "plan $plan_cfg --cluster synth:2xrtx3060 --svg $run/metrics.jsonl" \
           "plan $plan_cfg --cluster synth:2xrtx3060 --json $tl_dir/link.json" \
           "plan $plan_cfg --cluster synth:2xrtx3060 --json $tl_dir/kept.safetensors" \
           "probe --quick --json $run/checkpoints/new.json" \
           "train $plan_cfg --run-dir $tl_dir/other-run --timeline $run/checkpoints/ckpt-00000005.safetensors"; do
  err=$("$hetrain" $bad 2>&1); rc=$?
  check "${bad%% *} ${bad##* }: refused with exit 2, a run's state named" \
    test $rc -eq 2 -a -n "$(grep -- 'which writing there would replace; expected a path outside a run' <<<"$err")"
done
after=$(cat "$run/.hetrain.lock" "$run/metrics.jsonl" "$run/checkpoints/ckpt-00000005.safetensors" "$tl_dir/kept.safetensors" | md5sum)
check "... and every file of the run state is as it was" test "$before" = "$after" -a ! -e "$run/checkpoints/new.json"
"$hetrain" plan "$plan_cfg" --cluster synth:2xrtx3060 --json "$run/my-plan.json" >/dev/null 2>&1; rc=$?
check "a user's own file in a run directory is written" test $rc -eq 0 -a -s "$run/my-plan.json"
rm -rf "$tl_dir"
"$hetrain" --help >/dev/null; rc=$?
check "--help exits 0" test $rc -eq 0

configs=$(dirname "$0")/../../configs
err=$("$hetrain" train "$configs/fashion_mnist_mlp.json" --cluster synth:2xrtx4090 --run-dir /nonexistent/never 2>&1); rc=$?
check "train --cluster synth: is refused as a config error (exit 2)" test $rc -eq 2
check "train --cluster synth: names the option and value and points to plan" \
  grep -q -- '--cluster synth:2xrtx4090: train runs on the devices it is started on.*hetrain plan --cluster synth:2xrtx4090' <<<"$err"
check "train --cluster synth: is one line" test "$(wc -l <<<"$err")" -eq 1

err=$("$hetrain" plan "$configs/fashion_mnist_mlp.json" --cluster synth:1xv100 2>&1); rc=$?
check "plan with an unknown device exits 2" test $rc -eq 2
check "an unknown device suggests its family first" grep -qF '(did you mean "v100-16g" or "v100-32g"?)' <<<"$err"

exit $fail
