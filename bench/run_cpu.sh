#!/usr/bin/env bash
# The CPU benchmark set of docs/benchmarks.md, in one go (about 9 minutes on
# 16 cores): GEMM rate, SevenNet-0 on Si at 1k/8k/32k atoms, upstream sevenn
# on the same cores (when its Python package imports), and rank scaling of
# lj / schnet-demo at 202,612 atoms. Results are appended as JSON objects to
# files in $OUT (default ./bench-out); `python3 bench/summarize.py FILE`
# turns them into tables.
#
#   DDMLIP=target/release/ddmlip OUT=bench-out bash bench/run_cpu.sh
#
# SevenNet-0 needs its checkpoint (bash scripts/fetch-sevennet.sh, or
# DDMLIP_SEVENNET_CHECKPOINT). The upstream comparison needs `sevenn` 0.13.0,
# ase and matscipy importable and UPSTREAM_SCRIPT pointing at the anchor
# timing script (sevennet0_anchor_timing.py); it is skipped otherwise.
set -u
B=${DDMLIP:-target/release/ddmlip}
OUT=${OUT:-bench-out}
mkdir -p "$OUT"
# matrixmultiply's own threads nest inside the engine's rayon tasks and
# oversubscribe the cores (2.2x slower SevenNet-0, see docs/benchmarks.md).
export MATMUL_NUM_THREADS=${MATMUL_NUM_THREADS:-1}
N=$(nproc)
L=$OUT/log.txt
t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
log() { echo "[$(el)s] $*" | tee -a "$L"; }
log "$N cores"
lscpu | grep -E 'Model name|Thread|Core|Socket|L3' >> "$L"
"$B" bench gemm --threads "$N" --json > "$OUT/gemm.json" 2>>"$L"
sev() { "$B" bench model --model sevennet-0 --crystal si --dtype f32 "$@" --json >> "$OUT/sev.json" 2>>"$L"; log "sevennet-0 $*"; }
sev --repeat 5 --threads "$N" --repeats 5
MATMUL_NUM_THREADS= sev --repeat 5 --threads "$N" --repeats 3
sev --repeat 10 --ranks 1,4,"$N" --repeats 3
if [ -n "${UPSTREAM_SCRIPT:-}" ]; then
  PYTHONUNBUFFERED=1 python3 "$UPSTREAM_SCRIPT" --out "$OUT/upstream.json" --sizes 5 --cpu-size 5 >> "$L" 2>&1
  log upstream
fi
for m in lj schnet-demo; do
  for rt in "$N:1" 8:1 4:1 2:1 "1:$N" 1:1; do
    "$B" bench model --model "$m" --crystal cu --repeat 37 --dtype f32 --ranks "${rt%:*}" \
      --threads "${rt#*:}" --repeats 2 --json >> "$OUT/scale_$m.json" 2>>"$L"
    log "$m ranks:threads $rt"
  done
done
sev --repeat 16 --threads "$N" --repeats 2
log end
