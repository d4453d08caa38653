#!/usr/bin/env bash
# The main job on a fresh machine: install, build, then the algebra tour and the CPU
# benchmark of the algebraic projection (results land in bench/results/).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
Q=build/bin/quiver
echo "== the complete-graph law Q4 =="
$Q algebra Q4
echo
echo "== the pilot's recursive law Q2⊗Q2 with the pilot's FFN widths (768 → 4×192, 1536 → 4×384) =="
$Q algebra Q2xQ2 --in-groups 192,192,192,192 --out-groups 384,384,384,384
echo
echo "== a path graph law, as JSON =="
$Q algebra 'graph:4:0>1,1>2,2>3' --json
echo
echo "== algebraic projection against OpenBLAS sgemm on this CPU =="
$Q bench algproj --device cpu
