#!/usr/bin/env bash
# Parallel efficiency of `lj` MD at 202,612 atoms (FCC Ar, 37³ cells): one
# rank pinned to one core against RANKS thread ranks (default: 16), runs
# alternating (1, RANKS, 1, RANKS, …) so that a machine whose speed drifts
# is sampled alike for both. Each run reports its first build (partition,
# ghosts, pair list, first force call) apart from its steady steps; the
# efficiency is over the steady steps:
#
#   efficiency = (1-rank s/step) / (RANKS × RANKS-rank s/step)
#
# with the median over the rounds, next to the minor page faults per step
# and the ceiling `ddmlip bench cores --threads RANKS` measures on this
# machine (identical work per thread, meeting every step: what no split
# run can beat here). Then rank 0's steady step phase by phase (`phase_s`
# of `md --json`, medians over the rounds) for both runs, with each phase's
# own efficiency (1-rank time / (RANKS × RANKS-rank time)): where the
# parallel run loses its time.
#
#   bash bench/md_scaling.sh target/release/ddmlip [STEPS]
#
# STEPS (default 20) are the steps of each run after its first; at about
# 1.2–2.3 s per step for one rank on one core the whole script takes 3–6
# minutes on 16 cores. Environment: RANKS (default 16), ROUNDS (default
# 3), STRUCTURE (an existing XYZ to use instead of the generated crystal),
# OUT (where the JSON of every run goes; default bench-out/md_scaling).
set -euo pipefail
if [ $# -lt 1 ]; then
  echo "usage: bash bench/md_scaling.sh DDMLIP_BINARY [STEADY_STEPS]" >&2
  exit 2
fi
B=$1
STEPS=${2:-20}
RANKS=${RANKS:-16}
ROUNDS=${ROUNDS:-3}
OUT=${OUT:-bench-out/md_scaling}
[ -x "$B" ] || { echo "error: $B is not an executable" >&2; exit 2; }
case "$STEPS" in ''|*[!0-9]*|0) echo "error: STEADY_STEPS must be a positive integer, got '$STEPS'" >&2; exit 2;; esac
mkdir -p "$OUT"

# The crystal: ASE's bulk("Ar", "fcc", a=5.26, cubic=True).repeat(37), atom
# for atom, written without Python.
S=${STRUCTURE:-$OUT/ar202k.xyz}
if [ ! -s "$S" ]; then
  awk -v n=37 -v a=5.26 'BEGIN {
    L = n * a
    printf "%d\nLattice=\"%.2f 0.0 0.0 0.0 %.2f 0.0 0.0 0.0 %.2f\" Properties=species:S:1:pos:R:3 pbc=\"T T T\"\n", 4 * n * n * n, L, L, L
    split("0 0 0 0 0.5 0.5 0.5 0 0.5 0.5 0.5 0", b, " ")
    for (i = 0; i < n; i++) for (j = 0; j < n; j++) for (k = 0; k < n; k++) for (q = 0; q < 4; q++)
      printf "Ar %16.8f %16.8f %16.8f\n", (i + b[3*q+1]) * a, (j + b[3*q+2]) * a, (k + b[3*q+3]) * a
  }' > "$S"
fi

echo "$(nproc) cores; $(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1)"
echo "lj NVE on $(head -1 "$S") atoms ($(basename "$S")), $((STEPS + 1)) steps per run, steady = the last $STEPS; $ROUNDS round(s) of 1 rank (taskset -c 0) and $RANKS thread ranks"
md() {
  # One run: ranks, pin prefix; prints the run's JSON summary into a file.
  local ranks=$1 file=$2; shift 2
  "$@" "$B" md --model lj --structure "$S" --ensemble nve --init-temperature 40 --seed 1 \
    --dt 5 --steps $((STEPS + 1)) --skin 1.0 --ranks "$ranks" --balance atoms --json > "$file"
}
for r in $(seq 1 "$ROUNDS"); do
  md 1 "$OUT/round${r}_1rank.json" taskset -c 0
  md "$RANKS" "$OUT/round${r}_${RANKS}ranks.json"
  echo "round $r done"
done
"$B" bench cores --threads "$RANKS" --json > "$OUT/cores.json"

python3 - "$OUT" "$ROUNDS" "$RANKS" <<'EOF'
import json, statistics, sys
out, rounds, ranks = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def load(name):
    with open(f"{out}/{name}") as f:
        return json.load(f)
rows = []
for r in range(1, rounds + 1):
    one, many = load(f"round{r}_1rank.json"), load(f"round{r}_{ranks}ranks.json")
    eff = one["step_s"] / (ranks * many["step_s"])
    rows.append((one, many, eff))
    print(f"round {r}: 1 rank {one['step_s']:.4f} s/step (setup {one['setup_s']:.2f} s, cpu {one['cpu_s_per_step']:.3f} s/step, "
          f"{one['faults_per_step']:.0f} faults/step) | {ranks} ranks {many['step_s']:.4f} s/step "
          f"(setup {many['setup_s']:.2f} s, {many['faults_per_step']:.0f} faults/step, "
          f"cpu {many['cpu_s_per_step']:.3f} s/step) | efficiency {100 * eff:.1f} %")
    if one["rebuilds"] != many["rebuilds"]:
        print(f"  warning: 1 rank rebuilt {one['rebuilds']} times, {ranks} ranks {many['rebuilds']}")
med = lambda xs: statistics.median(xs)
cores = {c["kernel"]: c for c in load("cores.json")["records"]}
print(f"median: 1 rank {med([o['step_s'] for o, _, _ in rows]):.4f} s/step, "
      f"{ranks} ranks {med([m['step_s'] for _, m, _ in rows]):.4f} s/step, "
      f"efficiency {100 * med([e for _, _, e in rows]):.1f} % "
      f"(faults/step {med([o['faults_per_step'] for o, _, _ in rows]):.0f} and "
      f"{med([m['faults_per_step'] for _, m, _ in rows]):.0f})")
print("ceiling (bench cores --threads %d): " % ranks + ", ".join(
    f"{k} {100 * c['ceiling']:.1f} % (balanced {100 * c['balanced_ceiling']:.1f} %)"
    for k, c in cores.items()))
if all("phase_s" in o and "phase_s" in m for o, m, _ in rows):
    print(f"rank 0's steady step by phase, ms (median over rounds): 1 rank | {ranks} ranks | phase efficiency")
    for name in rows[0][0]["phase_s"]:
        one_ms = 1e3 * med([o["phase_s"][name] for o, _, _ in rows])
        many_ms = 1e3 * med([m["phase_s"][name] for _, m, _ in rows])
        eff = f"{100 * one_ms / (ranks * many_ms):.1f} %" if many_ms > 0 else "-"
        print(f"  {name:<13} {one_ms:10.2f} | {many_ms:10.2f} | {eff}")
if all("rank_busy_s" in m for _, m, _ in rows):
    # Each rank's own compute (filter + forward + gradient pass): a max
    # well above the min is imbalance, and the rest of the force return.
    b = {k: 1e3 * med([m["rank_busy_s"][k] for _, m, _ in rows]) for k in ("min", "mean", "max")}
    one_busy = 1e3 * med([o["rank_busy_s"]["max"] for o, _, _ in rows])
    print(f"{ranks} ranks' own compute per step, ms (median over rounds): min {b['min']:.2f}, "
          f"mean {b['mean']:.2f}, max {b['max']:.2f}; 1 rank {one_busy:.2f} "
          f"(efficiency at the mean {100 * one_busy / (ranks * b['mean']):.1f} %, "
          f"at the max {100 * one_busy / (ranks * b['max']):.1f} %)")
same = {(o["total_energy"], m["total_energy"]) for o, m, _ in rows}
if any(abs(a - b) > 1e-10 * abs(a) for a, b in same):
    print(f"warning: 1-rank and {ranks}-rank total energies differ: {sorted(same)}")
EOF
