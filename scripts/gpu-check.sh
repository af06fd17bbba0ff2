#!/usr/bin/env bash
# Runs the GPU tests from prebuilt binaries (builds nothing) and prints a
# summary. The GPU tests compare GPU f64 with CPU f64 at 1e-10 relative and
# GPU f32 with CPU f64 within the tolerance stated in crates/cuda/tests/gpu.rs.
#
# Usage: scripts/gpu-check.sh [DIR]
#   DIR (default target/gpu-check) holds the test executables to run, e.g.
#     cargo test -p ddmlip-cuda --no-run   # then copy target/debug/deps/gpu-* there
#   and optionally a `ddmlip` binary built with `--features cuda`, which is
#   then checked end to end (eval on cuda vs cpu, a bad device index).
# Environment: DDMLIP_FIXTURE_XYZ (the SevenNet-0 fixture frames, if the
# tests cannot find them next to the repository), DDMLIP_GPU_INDEX (device).
set -u
dir=${1:-target/gpu-check}
if [[ ! -d $dir ]]; then
    echo "gpu-check: no directory $dir with prebuilt test binaries" >&2
    exit 2
fi
export DDMLIP_GPU_TESTS=1
if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | sed 's/^/gpu: /'
fi
passed=0 failed=0 failures=()
for exe in "$dir"/*; do
    [[ -f $exe && -x $exe && $(basename "$exe") != ddmlip ]] || continue
    echo "== $(basename "$exe")"
    # --nocapture: the tests print the measured deviations and timings.
    out=$("$exe" --test-threads=1 --nocapture 2>&1)
    # What each test measured, and every panic with its message line.
    echo "$out" | awk '/panicked at/ {print; if ((getline line) > 0) print "    " line; next}
        /^test |lj (f64|f32) case|sevennet f(64|32) GPU|TIMING|systems, |SKIPPED/ {print}'

    counts=$(echo "$out" | sed -n 's/^test result: [a-zA-Z]*\. \([0-9]*\) passed; \([0-9]*\) failed.*/\1 \2/p')
    p=${counts% *} f=${counts#* }
    [[ -n $counts ]] || { p=0; f=1; }
    passed=$((passed + p)) failed=$((failed + f))
    if [[ $f -gt 0 ]] || ! echo "$out" | grep -q '^test result: ok'; then
        failures+=("$(basename "$exe")")
    fi
done
cli="$dir/ddmlip"
if [[ -x $cli ]]; then
    echo "== ddmlip CLI"
    xyz=$(mktemp --suffix=.xyz) log=$(mktemp)
    python3 - "$xyz" <<'PY' 2>/dev/null || printf '4\nLattice="10.6 0 0 0 10.6 0 0 0 10.6" Properties=species:S:1:pos:R:3 pbc="T T T"\nAr 0 0 0\nAr 2.7 2.6 0.1\nAr 2.6 0.1 2.65\nAr 0.05 2.6 2.7\n' > "$xyz"
import sys
print("4\nLattice=\"10.6 0 0 0 10.6 0 0 0 10.6\" Properties=species:S:1:pos:R:3 pbc=\"T T T\"\nAr 0 0 0\nAr 2.7 2.6 0.1\nAr 2.6 0.1 2.65\nAr 0.05 2.6 2.7", file=open(sys.argv[1], "w"))
PY
    check() { # name, expected status, text the output must contain, command...
        local name=$1 want=$2 text=$3; shift 3
        local got; "$@" >"$log" 2>&1; got=$?
        if [[ $got == "$want" ]] && grep -qF -- "$text" "$log"; then
            passed=$((passed + 1)); echo "cli $name ok (exit $got)";
        else failed=$((failed + 1)); failures+=("cli $name"); echo "cli $name FAILED (exit $got, want $want and \"$text\")"; fi
        sed 's/^/    /' "$log" | head -8
    }
    check "eval lj on cuda" 0 '"device":"cuda:' "$cli" eval --model lj --structure "$xyz" --device cuda --json
    check "eval lj on cpu" 0 '"energy"' "$cli" eval --model lj --structure "$xyz" --device cpu --json
    check "device index out of range" 2 "does not exist" "$cli" eval --model lj --structure "$xyz" --device cuda:99
    check "model without a CUDA path" 2 "has no CUDA path" "$cli" eval --model schnet-demo --structure "$xyz" --device cuda
    check "bench model lj on cuda" 0 "µs/atom/step" "$cli" bench model --model lj --crystal cu --repeat 4 --device cuda
    # SevenNet-0 (needs the checkpoint: DDMLIP_SEVENNET_CHECKPOINT or the cache).
    si=$(mktemp --suffix=.xyz)
    printf '2\nLattice="5.43 0 0 0 5.43 0 0 0 5.43" Properties=species:S:1:pos:R:3 pbc="T T T"\nSi 0.02 0 0\nSi 1.36 1.33 1.37\n' > "$si"
    check "eval sevennet-0 on cuda" 0 '"device":"cuda:' "$cli" eval --model sevennet-0 --structure "$si" --device cuda --json
    check "eval sevennet-0 on cuda f32" 0 '"dtype":"f32"' "$cli" eval --model sevennet-0 --structure "$si" --device cuda --dtype f32 --json
    check "bench model sevennet-0 on cuda" 0 "peak GPU memory" "$cli" bench model --model sevennet-0 --crystal si --repeat 10 --dtype f32 --device cuda --repeats 3
    check "sevennet-0 too large for the GPU" 2 "atoms of this system would fit" "$cli" bench model --model sevennet-0 --crystal si --repeat 150 --dtype f64 --device cuda --repeats 1
    rm -f "$si"
    rm -f "$xyz" "$log"
fi
echo "gpu-check summary: $passed passed, $failed failed${failures[*]:+ (${failures[*]})}"
[[ $failed -eq 0 && ${#failures[@]} -eq 0 ]]
