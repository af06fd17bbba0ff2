#!/usr/bin/env bash
# Two or more ddmlip builds on the same `bench model` run, alternating
# (A B A B …) so that a machine whose speed drifts biases none of them;
# prints each run's line (median s, CPU s, µs/atom/step, peak memory,
# page faults per step) and, per build, the median over the rounds; then
# each build's per-round wall and CPU ratios to the first build (median,
# least and largest).
#
#   bash bench/compare_builds.sh NAME=BINARY NAME=BINARY [...] -- BENCH_MODEL_ARGS...
#
# e.g. the SevenNet-0 CPU figure of docs/benchmarks.md, two builds, 3 rounds:
#   ROUNDS=3 bash bench/compare_builds.sh old=old/ddmlip new=target/release/ddmlip \
#     -- --model sevennet-0 --crystal si --repeat 10 --dtype f32 --threads 16 --repeats 3
#
# A NAME may carry environment settings for its runs after a colon,
# e.g. `tuned=target/release/ddmlip:GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432`.
# Environment: ROUNDS (default 2).
set -euo pipefail
builds=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do builds+=("$1"); shift; done
if [ $# -eq 0 ] || [ ${#builds[@]} -lt 1 ]; then
  echo "usage: bash bench/compare_builds.sh NAME=BINARY [NAME=BINARY ...] -- BENCH_MODEL_ARGS..." >&2
  exit 2
fi
shift
rounds=${ROUNDS:-2}
results=$(mktemp)
trap 'rm -f "$results"' EXIT
for ((r = 1; r <= rounds; r++)); do
  for b in "${builds[@]}"; do
    name=${b%%=*} rest=${b#*=}
    bin=${rest%%:*} envs=()
    [ "$rest" != "$bin" ] && envs=(${rest#*:})
    if [ ! -x "$bin" ]; then echo "compare_builds: $bin is not an executable" >&2; exit 2; fi
    out=$(env "${envs[@]}" "$bin" bench model "$@" 2>&1) || { echo "$out" >&2; exit 2; }
    # The table row of the run (the line after the column header).
    row=$(echo "$out" | awk '/^ranks +thr\/rk/ {getline; print; exit}')
    echo "$name round $r: $row"
    echo "$name $row" >> "$results"
  done
done
echo
echo "median over $rounds rounds: build, wall s/step, CPU s/step, µs/atom/step, peak KiB/atom, faults/step"
python3 - "$results" <<'PY'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    f = line.split()
    # name ranks thr median_s cpu_s us/atom atom.step/s peak_MiB KiB/atom ghost MiB/step faults ...
    runs.setdefault(f[0], []).append([float(f[3]), float(f[4]), float(f[5]), float(f[8]), float(f[11])])
for name, rows in runs.items():
    med = [statistics.median(c) for c in zip(*rows)]
    print(f"{name:>12} {med[0]:9.4f} {med[1]:9.3f} {med[2]:10.2f} {med[3]:9.2f} {med[4]:10.0f}")
# On a host whose speed drifts, the ratio of runs next to each other in a
# round says more than the ratio of medians taken over the whole call.
names = list(runs)
if len(names) > 1:
    base = runs[names[0]]
    print(f"per-round ratios to {names[0]} (wall, CPU): median [min, max]")
    for name in names[1:]:
        pairs = list(zip(runs[name], base))
        for col, what in ((0, "wall"), (1, "CPU")):
            r = [a[col] / b[col] for a, b in pairs if b[col] > 0]
            if r:
                print(f"{name:>12} {what:>4} {statistics.median(r):6.3f} [{min(r):.3f}, {max(r):.3f}] over {len(r)} rounds")
PY
