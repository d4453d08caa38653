#!/usr/bin/env bash
# A/B of two quiver binaries on the algebraic-projection bench, on one GPU in one call: the two
# run in turn (A, B, A, B, ... for ROUNDS rounds, default 2), each calibrating afresh into its own
# kernel cache, so that machine drift shows up as the spread between rounds of one binary rather
# than as a difference between the binaries. Prints, and writes to OUT_DIR/ab.md, one row per
# shape: the chosen kernel and alg µs (speedup over dense in the same run) of every run.
#
#   scripts/algproj_ab.sh OUT_DIR BIN_A BIN_B [bench algproj flags]
#
# The flags default to `--paper-q --m-list 2048 --no-backward`; `--device cuda` and
# `--results-dir` are added. Example: scripts/algproj_ab.sh out main/quiver new/quiver --paper-q
# --model Qwen3-32B --m-list 2048 --no-backward --quick
set -uo pipefail
if [ $# -lt 3 ]; then
  sed -n '2,/^set -uo/p' "$0" | sed '$d'
  exit 2
fi
out=$1 a=$2 b=$3
shift 3
flags=("$@")
[ ${#flags[@]} -eq 0 ] && flags=(--paper-q --m-list 2048 --no-backward)
mkdir -p "$out"
runs=()
for ((r = 1; r <= ${ROUNDS:-2}; ++r)); do
  for side in A B; do
    bin=$a
    [ "$side" = B ] && bin=$b
    dir="$out/$side$r"
    mkdir -p "$dir/cache"
    start=$(date +%s)
    QUIVER_CACHE_DIR="$dir/cache" "$bin" bench algproj --device cuda --results-dir "$dir" "${flags[@]}" \
      > "$dir/log.txt" 2>&1
    echo "$side$r: rc=$? in $(($(date +%s) - start)) s (log: $dir/log.txt)"
    runs+=("$side$r")
  done
done
python3 - "$out" "$a" "$b" "${runs[@]}" <<'EOF' | tee "$out/ab.md"
import glob, json, sys
out, a, b, runs = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
table, order, machine = {}, [], ""
for run in runs:
    files = sorted(glob.glob(f"{out}/{run}/algproj-cuda-*.json"))
    if not files:
        continue
    d = json.load(open(files[-1]))
    machine = d.get("machine", machine)
    for row in d["rows"]:
        key = (row["model"], row["pass"], row["M"], row["q"])
        if key not in table:
            table[key] = {}
            order.append(key)
        ok = "" if row["correct"] else " WRONG"
        table[key][run] = f'{row["alg_us"]:.4g} ({row["speedup"]:.3g}×) {row["kernel"]}{ok}'
print(f"# algproj A/B\n\n- machine: {machine}\n- A: {a}\n- B: {b}\n- runs in this order: {', '.join(runs)}\n")
print("| model | pass | M | q | " + " | ".join(runs) + " |")
print("|---|---|---|---|" + "---|" * len(runs))
for key in order:
    cells = [table[key].get(run, "-") for run in runs]
    print("| " + " | ".join(str(k) for k in key) + " | " + " | ".join(cells) + " |")
EOF
