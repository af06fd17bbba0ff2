#!/usr/bin/env bash
# Runs the GPU tests from prebuilt binaries (builds nothing) and prints a
# summary. The GPU tests compare GPU f64 with CPU f64 at 1e-10 relative and
# GPU f32 with CPU f64 within the tolerance stated in crates/cuda/tests/gpu.rs.
#
# Usage: scripts/gpu-check.sh [DIR]
#   DIR (default target/gpu-check) holds the test executables to run, e.g.
#     cargo test -p ddmlip-cuda --no-run   # then copy target/debug/deps/gpu-* there
#   and optionally a `ddmlip` binary built with `--features cuda`, which is
#   then checked end to end (eval on cuda vs cpu, a bad device index, md and
#   relax on cuda vs cpu, validate and eval split over ranks sharing the GPU,
#   models through the op engine on the GPU).
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
    [[ -f $exe && -x $exe && $(basename "$exe") != ddmlip* ]] || continue
    echo "== $(basename "$exe")"
    # --nocapture: the tests print the measured deviations and timings.
    out=$("$exe" --test-threads=1 --nocapture 2>&1)
    # What each test measured, and every panic with its message line.
    echo "$out" | awk '/panicked at/ {print; if ((getline line) > 0) print "    " line; next}
        /^test |lj (f64|f32) case|sevennet f(64|32) GPU|schnet f(64|32) |TIMING|systems, |ranks: energy|f32 vs f64:|split vs one rank|engine |SKIPPED/ {print}'

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
    # Models without CUDA kernels of their own run through the op engine on the GPU.
    check "eval eam-demo on cuda through the engine" 0 'op engine' "$cli" eval --model eam-demo --structure "$xyz" --device cuda --json
    check "eval schnet-demo --engine-ops on cuda" 0 'op engine' "$cli" eval --model schnet-demo --structure "$xyz" --device cuda --engine-ops --ranks 2 --json
    check "--engine-ops needs cuda" 2 "needs --device cuda" "$cli" eval --model schnet-demo --structure "$xyz" --engine-ops
    check "eval schnet-demo on cuda" 0 '"device":"cuda:' "$cli" eval --model schnet-demo --structure "$xyz" --device cuda --json
    check "bench model schnet-demo on cuda" 0 "µs/atom/step" "$cli" bench model --model schnet-demo --crystal si --repeat 8 --device cuda --repeats 2
    check "bench model lj on cuda" 0 "µs/atom/step" "$cli" bench model --model lj --crystal cu --repeat 4 --device cuda
    # SevenNet-0 (needs the checkpoint: DDMLIP_SEVENNET_CHECKPOINT or the cache).
    si=$(mktemp --suffix=.xyz)
    printf '2\nLattice="5.43 0 0 0 5.43 0 0 0 5.43" Properties=species:S:1:pos:R:3 pbc="T T T"\nSi 0.02 0 0\nSi 1.36 1.33 1.37\n' > "$si"
    check "eval sevennet-0 on cuda" 0 '"device":"cuda:' "$cli" eval --model sevennet-0 --structure "$si" --device cuda --json
    check "eval sevennet-0 on cuda f32" 0 '"dtype":"f32"' "$cli" eval --model sevennet-0 --structure "$si" --device cuda --dtype f32 --json
    check "bench model sevennet-0 on cuda" 0 "peak GPU memory" "$cli" bench model --model sevennet-0 --crystal si --repeat 10 --dtype f32 --device cuda --repeats 3
    check "sevennet-0 too large for the GPU" 2 "atoms of this system would fit" "$cli" bench model --model sevennet-0 --crystal si --repeat 150 --dtype f64 --device cuda --repeats 1
    rm -f "$si"
    # MD and FIRE with GPU forces follow the same runs with CPU forces (f64):
    # final positions within 1e-8 Å (40 NVE steps of a hot crystal; a short
    # relaxation). Argon 4x4x4 FCC for lj, silicon 2x2x2 diamond for schnet-demo
    # and SevenNet-0.
    ar=$(mktemp --suffix=.xyz) si64=$(mktemp --suffix=.xyz)
    python3 - "$ar" "$si64" <<'PY'
import sys
def crystal(path, symbol, a, n, basis):
    rows = []
    for i in range(n):
        for j in range(n):
            for k in range(n):
                for b in basis:
                    # a small deterministic rattle
                    d = ((len(rows) * 37) % 11 - 5) * 0.01
                    rows.append((a * (i + b[0]) + d, a * (j + b[1]) - d, a * (k + b[2]) + 0.5 * d))
    L = a * n
    with open(path, "w") as f:
        f.write(f"{len(rows)}\nLattice=\"{L} 0 0 0 {L} 0 0 0 {L}\" Properties=species:S:1:pos:R:3 pbc=\"T T T\"\n")
        for r in rows:
            f.write(f"{symbol} {r[0]:.10f} {r[1]:.10f} {r[2]:.10f}\n")
fcc = [(0, 0, 0), (0.5, 0.5, 0), (0.5, 0, 0.5), (0, 0.5, 0.5)]
diamond = fcc + [(x + 0.25, y + 0.25, z + 0.25) for x, y, z in fcc]
crystal(sys.argv[1], "Ar", 5.26, 4, fcc)
crystal(sys.argv[2], "Si", 5.43, 2, diamond)
PY
    same_final() { # name, the two output files: the last frames' positions agree to 1e-8 Å
        python3 - "$2" "$3" <<'PY' >"$log" 2>&1
import sys
def last_positions(path):
    lines = open(path).read().split("\n")
    i, frame = 0, None
    while i < len(lines) and lines[i].strip():
        n = int(lines[i]); frame = [list(map(float, l.split()[1:4])) for l in lines[i + 2:i + 2 + n]]; i += n + 2
    return frame
a, b = last_positions(sys.argv[1]), last_positions(sys.argv[2])
d = max(abs(x - y) for p, q in zip(a, b) for x, y in zip(p, q)) if a and b and len(a) == len(b) else float("inf")
print(f"largest position difference {d:.3e} A over {len(a or [])} atoms")
sys.exit(0 if d < 1e-8 else 1)
PY
        if [[ $? == 0 ]]; then passed=$((passed + 1)); echo "cli $1 ok"; else failed=$((failed + 1)); failures+=("cli $1"); echo "cli $1 FAILED"; fi
        sed 's/^/    /' "$log"
    }
    gpu=$(mktemp --suffix=.xyz) cpu=$(mktemp --suffix=.xyz)
    for case in "lj $ar" "schnet-demo $si64" "sevennet-0 $si64"; do
        set -- $case
        md=(md --model "$1" --structure "$2" --ensemble nve --dt 1 --steps 40 --init-temperature 900 --seed 3 --json)
        check "md $1 on cuda" 0 '"ensemble"' "$cli" "${md[@]}" --device cuda --output "$gpu"
        "$cli" "${md[@]}" --output "$cpu" >/dev/null 2>&1
        same_final "md $1 on cuda follows the cpu run" "$gpu" "$cpu"
        check "md --validate $1 on cuda, 3 ranks" 0 'PASS' "$cli" md --model "$1" --structure "$2" --ensemble langevin --temperature 600 --dt 1 --steps 20 --seed 4 --device cuda --ranks 3 --validate
        check "md $1 on cuda, 3 ranks sharing it" 0 '"ensemble"' "$cli" "${md[@]}" --device cuda --ranks 3 --output "$gpu"
        same_final "md $1 on cuda with 3 ranks follows the cpu run" "$gpu" "$cpu"
        rl=(relax --model "$1" --structure "$2" --fmax 0.01 --max-steps 300 --json)
        check "relax $1 on cuda" 0 '"converged":true' "$cli" "${rl[@]}" --device cuda --output "$gpu"
        "$cli" "${rl[@]}" --output "$cpu" >/dev/null 2>&1
        same_final "relax $1 on cuda follows the cpu run" "$gpu" "$cpu"
        check "relax $1 on cuda, 2 ranks sharing it" 0 '"converged":true' "$cli" "${rl[@]}" --device cuda --ranks 2 --output "$gpu"
        same_final "relax $1 on cuda with 2 ranks follows the cpu run" "$gpu" "$cpu"
    done
    # MD and FIRE through the op engine on the GPU (eam-demo has no CUDA kernels of its own).
    md=(md --model eam-demo --structure "$si64" --ensemble nve --dt 1 --steps 40 --init-temperature 900 --seed 3 --json)
    check "md eam-demo through the engine on cuda, 2 ranks" 0 '"ensemble"' "$cli" "${md[@]}" --device cuda --ranks 2 --output "$gpu"
    "$cli" "${md[@]}" --output "$cpu" >/dev/null 2>&1
    same_final "md eam-demo through the engine on cuda follows the cpu run" "$gpu" "$cpu"
    rl=(relax --model eam-demo --structure "$si64" --fmax 0.05 --max-steps 2000 --json)
    check "relax eam-demo through the engine on cuda" 0 '"converged":true' "$cli" "${rl[@]}" --device cuda --output "$gpu"
    "$cli" "${rl[@]}" --output "$cpu" >/dev/null 2>&1
    same_final "relax eam-demo through the engine on cuda follows the cpu run" "$gpu" "$cpu"
    check "md on cuda refuses --backend mpi" 2 "--backend mpi" "$cli" md --model lj --structure "$ar" --ensemble nve --dt 1 --steps 1 --backend mpi --device cuda
    # Split runs on one GPU: ranks sharing it give the one-rank answer.
    check "validate lj on cuda, 4 ranks" 0 "PASSED" "$cli" validate --model lj --structure "$ar" --device cuda --ranks 4
    check "validate sevennet-0 on cuda, 4 ranks" 0 "PASSED" "$cli" validate --model sevennet-0 --structure "$si64" --device cuda --ranks 4
    check "validate schnet-demo on cuda, 4 ranks" 0 "PASSED" "$cli" validate --model schnet-demo --structure "$si64" --device cuda --ranks 4
    check "validate eam-demo through the engine on cuda, 4 ranks" 0 "matches the single-process run" "$cli" validate --model eam-demo --structure "$si64" --device cuda --ranks 4
    check "validate schnet-demo --engine-ops on cuda, 3 ranks" 0 "matches the single-process run" "$cli" validate --model schnet-demo --structure "$si64" --device cuda --engine-ops --ranks 3
    check "eval sevennet-0 --engine-ops on cuda, 2 ranks" 0 'op engine' "$cli" eval --model sevennet-0 --structure "$si64" --device cuda --engine-ops --ranks 2 --json
    check "validate sevennet-0 --engine-ops on cuda, 3 ranks" 0 "matches the single-process run" "$cli" validate --model sevennet-0 --structure "$si64" --device cuda --engine-ops --ranks 3
    check "bench model sevennet-0 --engine-ops on cuda" 0 "µs/atom/step" "$cli" bench model --model sevennet-0 --crystal si --repeat 6 --device cuda --engine-ops --repeats 2
    check "bench model schnet-demo --engine-ops on cuda" 0 "µs/atom/step" "$cli" bench model --model schnet-demo --crystal si --repeat 8 --device cuda --engine-ops --repeats 2
    check "validate schnet-demo on cuda f32, 3 ranks" 0 "PASSED" "$cli" validate --model schnet-demo --structure "$si64" --device cuda --ranks 3 --dtype f32
    check "validate sevennet-0 on cuda f32, 3 ranks" 0 "PASSED" "$cli" validate --model sevennet-0 --structure "$si64" --device cuda --ranks 3 --dtype f32
    check "eval sevennet-0 on cuda, 2 ranks" 0 '"ranks":2' "$cli" eval --model sevennet-0 --structure "$si64" --device cuda --ranks 2 --json
    check "bench model sevennet-0 on cuda, 2 ranks" 0 "of which exchanging" "$cli" bench model --model sevennet-0 --crystal si --repeat 6 --dtype f32 --device cuda --ranks 1,2 --repeats 2
    check "validate sevennet-0, 4 ranks over --gpus 0,0" 0 "PASSED" "$cli" validate --model sevennet-0 --structure "$si64" --device cuda --ranks 4 --gpus 0,0
    # One MPI process per rank (here two sharing the one GPU), with a ddmlip
    # built with `--features mpi,cuda` next to the other as ddmlip-mpi.
    mpicli="$dir/ddmlip-mpi"
    if [[ -x $mpicli ]] && command -v mpirun >/dev/null; then
        export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
        "$cli" eval --model sevennet-0 --structure "$si64" --device cuda --json >"$gpu" 2>"$log"
        check "eval sevennet-0 --backend mpi on cuda, 2 processes" 0 '"ranks":2' \
            mpirun --oversubscribe -n 2 "$mpicli" eval --backend mpi --device cuda --gpus 0 --model sevennet-0 --structure "$si64" --json
        grep '^{' "$log" > "$cpu"
        python3 - "$gpu" "$cpu" <<'PY' >"$log" 2>&1
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
fa = [x for f in a["forces"] for x in f]; fb = [x for f in b["forces"] for x in f]
de = abs(a["energy"][0] - b["energy"][0]) / max(1.0, abs(a["energy"][0]))
df = max(abs(x - y) for x, y in zip(fa, fb)) / max(abs(x) for x in fa) if len(fa) == len(fb) else float("inf")
print(f"MPI split vs one GPU rank: energy {de:.1e}, forces {df:.1e} relative")
sys.exit(0 if de < 1e-10 and df < 1e-10 else 1)
PY
        if [[ $? == 0 ]]; then passed=$((passed + 1)); echo "cli mpi split equals one rank ok"; else failed=$((failed + 1)); failures+=("cli mpi split equals one rank"); echo "cli mpi split equals one rank FAILED"; fi
        sed 's/^/    /' "$log"
    fi
    rm -f "$ar" "$si64" "$gpu" "$cpu"
    rm -f "$xyz" "$log"
fi
echo "gpu-check summary: $passed passed, $failed failed${failures[*]:+ (${failures[*]})}"
[[ $failed -eq 0 && ${#failures[@]} -eq 0 ]]
