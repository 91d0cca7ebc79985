#!/usr/bin/env python3
"""The gpu_arch option: configures the project in scratch build directories and checks
the nvcc architecture flags it yields, and the error for a value CUDA 13 cannot build.

  test_gpu_arch.py SOURCE_ROOT    exit 0 when every check holds, 1 otherwise
"""
import os
import subprocess
import sys
import tempfile


def configure(source, build, value):
    """(exit status, output, the kernels' compile lines) of meson setup with gpu_arch=value."""
    run = subprocess.run(["meson", "setup", build, source, "--buildtype=release",
                          "-Dcuda=enabled", f"-Dgpu_arch={value}"],
                         capture_output=True, text=True)
    ninja = os.path.join(build, "build.ninja")
    text = open(ninja, encoding="utf-8").read() if run.returncode == 0 else ""
    return run.returncode, run.stdout + run.stderr, text


def main(source):
    failures = []

    def expect(ok, what):
        print(("ok: " if ok else "FAILED: ") + what)
        if not ok:
            failures.append(what)

    with tempfile.TemporaryDirectory() as scratch:
        for n, (value, wanted, unwanted) in enumerate([
                ("all", [f"-gencode=arch=compute_{a},code=sm_{a}" for a in (75, 80, 86, 89, 90)]
                 + ["-gencode=arch=compute_90,code=compute_90"], []),
                ("86, 89", ["-gencode=arch=compute_86,code=sm_86",
                            "-gencode=arch=compute_89,code=sm_89"],
                 ["sm_75", "code=compute_"])]):
            status, out, ninja = configure(source, os.path.join(scratch, f"ok{n}"), value)
            expect(status == 0, f"gpu_arch={value!r} configures")
            for flag in wanted:
                expect(flag in ninja, f"gpu_arch={value!r} passes {flag}")
            for flag in unwanted:
                expect(flag not in ninja, f"gpu_arch={value!r} does not pass {flag}")
        for n, (value, named) in enumerate([("70", '"70" in "70"'), ("80,x", '"x" in "80,x"'),
                                            ("80,", '"" in "80,"')]):
            status, out, _ = configure(source, os.path.join(scratch, f"bad{n}"), value)
            expect(status != 0, f"gpu_arch={value!r} is refused")
            expect(f"gpu_arch: {named} is not an architecture CUDA 13 builds for" in out
                   and "from 75 up" in out, f"gpu_arch={value!r}'s error names {named}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
