#!/usr/bin/env bash
# CPU training and generation throughput of the tiny presets, written to
# bench/results/train-cpu-DATE.{md,json}. Needs a dataset made by `quiver prepare` with a
# 4096-token vocabulary (scripts/main.sh makes data/brown-sp4k).
# Usage: bench/train_cpu.sh [DATA] [STEPS]
set -euo pipefail
cd "$(dirname "$0")/.."
data="${1:-data/brown-sp4k}"
steps="${2:-60}"
Q=build/bin/quiver
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for preset in tiny tiny-dense tiny-mha tiny-relation; do
  $Q train --config "$preset" --data "$data" --out "$work/$preset" --steps "$steps" \
    --micro-batch 8 --seq-len 128 --eval-every "$steps" --quiet > "$work/$preset.train.txt" 2>&1
  $Q generate --ckpt "$work/$preset/model.safetensors" --prompt "The jury said" \
    --max-new-tokens 100 --seed 1 --json > "$work/$preset.gen.json" 2> /dev/null
done
python3 - "$work" "$steps" "$data" <<'PY'
import json, os, subprocess, sys, datetime, platform
work, steps, data = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rows = []
for preset in ["tiny", "tiny-dense", "tiny-mha", "tiny-relation"]:
    metrics = [json.loads(l) for l in open(os.path.join(work, preset, "metrics.jsonl"))]
    # Throughput over the steps after the first (warm-up) step, excluding evaluation.
    train = [m for m in metrics if "val_loss" not in m][1:]
    tok_s = sum(m["tokens_per_s"] for m in train) / len(train)
    gen = json.load(open(os.path.join(work, preset + ".gen.json")))
    t = gen["time_s"]
    rows.append({"preset": preset, "train_tok_s": round(tok_s), "gen_tok_s": round(gen["new_tokens_per_s"]),
                 "decode_share": round(t["decode"] / sum(t.values()), 3),
                 "sample_share": round(t["sample"] / sum(t.values()), 3),
                 "final_loss": round(metrics[-1]["loss"], 3)})
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
date = datetime.date.today().isoformat()
machine = f"{cpu}, {os.cpu_count()} hardware threads"
command = f"bench/train_cpu.sh {data} {steps}"
doc = {"benchmark": "train-cpu", "date": date, "machine": machine, "command": command,
       "settings": "micro-batch 8, seq-len 128, F32, all threads; generation batch 1, 100 new tokens, sampling",
       "rows": rows}
os.makedirs("bench/results", exist_ok=True)
json.dump(doc, open(f"bench/results/train-cpu-{date}.json", "w"), indent=2)
with open(f"bench/results/train-cpu-{date}.md", "w") as f:
    f.write(f"# train-cpu\n\n- date: {date}\n- machine: {machine}\n- command: `{command}`\n- {doc['settings']}\n\n")
    keys = list(rows[0].keys())
    f.write("| " + " | ".join(keys) + " |\n|" + "---|" * len(keys) + "\n")
    for r in rows:
        f.write("| " + " | ".join(str(r[k]) for k in keys) + " |\n")
print(open(f"bench/results/train-cpu-{date}.md").read())
PY
