#!/usr/bin/env python3
"""Every config in bad_configs.json is rejected by `hetrain train` before any work:
exit status 2, exactly one stderr line `hetrain: config error: ...` holding the
expected substrings, and no run directory. (test_config.cpp checks the same table
in-process through parse_config.)

usage: test_bad_configs.py HETRAIN BAD_CONFIGS_JSON
"""
import json
import os
import subprocess
import sys
import tempfile


def run_case(hetrain, case, tmp):
    """Returns a list of failure descriptions (empty when the case passes)."""
    if "file" in case:
        config = case["file"]
    else:
        # The file name is safe on a command line; the case name stays in messages.
        config = os.path.join(tmp, "case.json")
        with open(config, "w", encoding="utf-8") as f:
            f.write(case["text"] if "text" in case else json.dumps(case["config"], indent=2))
    run_dir = os.path.join(tmp, "run")
    proc = subprocess.run([hetrain, "train", config, "--run-dir", run_dir],
                          capture_output=True, text=True, timeout=60)
    lines = proc.stderr.splitlines()
    problems = []
    if proc.returncode != 2:
        problems.append(f"exit status {proc.returncode}; expected 2")
    if len(lines) != 1:
        problems.append(f"{len(lines)} stderr lines; expected exactly 1")
    if not proc.stderr.startswith("hetrain: config error: "):
        problems.append("stderr does not start with 'hetrain: config error: '")
    wanted = list(case["expect"]) + ([config] if case.get("names_file") else [])
    problems += [f"missing {w!r}" for w in wanted if w not in proc.stderr]
    if os.path.exists(run_dir):
        problems.append(f"the run directory {run_dir} was created")
    if problems:
        problems.append(f"stderr: {proc.stderr.strip()!r}")
    return problems


def main():
    hetrain, table = sys.argv[1], sys.argv[2]
    with open(table, encoding="utf-8") as f:
        cases = json.load(f)
    failed = 0
    for case in cases:
        with tempfile.TemporaryDirectory() as tmp:
            problems = run_case(hetrain, case, tmp)
        print(("FAIL " if problems else "ok   ") + case["name"])
        for p in problems:
            print("     " + p)
        failed += bool(problems)
    print(f"{len(cases) - failed} of {len(cases)} bad configs rejected as expected")
    if len(cases) < 35:
        print(f"FAIL the table has {len(cases)} cases; expected at least 35")
        return 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
