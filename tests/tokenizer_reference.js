// The reference for quiver's GPT-2 byte-level BPE: the npm package gpt-3-encoder, which
// scripts/setup.sh installs into third_party/npm. Used by tests/test_tokenizer.cpp.
//
//   node tests/tokenizer_reference.js encode SAMPLES.json IDS.json
//       SAMPLES.json holds a JSON array of strings; IDS.json receives a JSON array with
//       gpt-3-encoder's ids for each string.
//   node tests/tokenizer_reference.js classes OUT.json
//       Writes {"unicode": version, "ranges": [[first, last, "L"|"N"|"S"], ...]}: the code
//       points that the encoder's regex sees as \p{L}, \p{N} and \s (with the u flag),
//       as sorted maximal ranges.
//   node tests/tokenizer_reference.js unicode-table
//       Prints the L/N range table of src/text/gpt2_bpe.cpp as C++.
'use strict';
const fs = require('fs');
const path = require('path');

const packageDir = process.env.QUIVER_GPT3_ENCODER_DIR ||
    path.join(__dirname, '..', 'third_party', 'npm', 'node_modules', 'gpt-3-encoder');

function classRanges() {
  const letter = /^\p{L}$/u, number = /^\p{N}$/u, space = /^\s$/u;
  const ranges = [];
  let open = null;
  for (let c = 0; c <= 0x10ffff; c++) {
    if (c >= 0xd800 && c <= 0xdfff) {  // surrogates: never a code point of UTF-8 text
      open = null;
      continue;
    }
    const s = String.fromCodePoint(c);
    const cls = letter.test(s) ? 'L' : number.test(s) ? 'N' : space.test(s) ? 'S' : null;
    if (cls !== null && open !== null && open[2] === cls && open[1] === c - 1) {
      open[1] = c;
    } else if (cls !== null) {
      open = [c, c, cls];
      ranges.push(open);
    } else {
      open = null;
    }
  }
  return ranges;
}

function hex(c) {
  return '0x' + c.toString(16).toUpperCase().padStart(4, '0');
}

function main(argv) {
  const mode = argv[0];
  if (mode === 'encode' && argv.length === 3) {
    if (!fs.existsSync(path.join(packageDir, 'Encoder.js'))) {
      throw new Error(`gpt-3-encoder not found in ${packageDir}; run scripts/setup.sh`);
    }
    const encoder = require(path.join(packageDir, 'Encoder.js'));
    const samples = JSON.parse(fs.readFileSync(argv[1], 'utf-8'));
    fs.writeFileSync(argv[2], JSON.stringify(samples.map(s => encoder.encode(s))));
  } else if (mode === 'classes' && argv.length === 2) {
    fs.writeFileSync(argv[1], JSON.stringify({unicode: process.versions.unicode,
                                              ranges: classRanges()}));
  } else if (mode === 'unicode-table' && argv.length === 1) {
    const entries = classRanges().filter(r => r[2] !== 'S')
                        .map(r => `{${hex(r[0])}, ${hex(r[1])}, ${r[2]}}`);
    const lines = [];
    for (let i = 0; i < entries.length; i += 4) {
      lines.push('    ' + entries.slice(i, i + 4).join(', ') + ',');
    }
    console.log(`// Unicode ${process.versions.unicode}: ${entries.length} ranges.`);
    console.log(lines.join('\n'));
  } else {
    throw new Error('usage: tokenizer_reference.js encode SAMPLES.json IDS.json | ' +
                    'classes OUT.json | unicode-table');
  }
}

main(process.argv.slice(2));
