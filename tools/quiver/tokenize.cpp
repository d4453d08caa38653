// `quiver tokenize --tokenizer PATH [--decode]`: text on stdin → ids on stdout (one line,
// space-separated), or with --decode ids on stdin → text. The text is taken byte for byte,
// trailing newline included, so `tokenize | tokenize --decode` gives back stdin exactly.
#include <charconv>
#include <cstdio>
#include <iostream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "commands.h"
#include "quiver/error.h"
#include "text/tokenizer.h"

namespace quiver::cli {
namespace {

struct TokenizeArgs {
  std::string tokenizer;
  bool decode = false;
};

std::string read_stdin() {
  std::ios::sync_with_stdio(false);
  return {std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>()};
}

// Ids separated by white space or commas; brackets are ignored, so a pasted list works.
std::vector<int32_t> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  const auto separator = [](char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == ',' || c == '[' || c == ']';
  };
  size_t i = 0;
  while (i < text.size()) {
    if (separator(text[i])) {
      ++i;
      continue;
    }
    size_t end = i;
    while (end < text.size() && !separator(text[end])) ++end;
    const std::string_view word(text.data() + i, end - i);
    int64_t id = 0;
    const auto [ptr, ec] = std::from_chars(word.data(), word.data() + word.size(), id);
    QV_CHECK(
        ec == std::errc() && ptr == word.data() + word.size() && id >= INT32_MIN && id <= INT32_MAX,
        "stdin: \"{}\" is not a token id (expected integers separated by spaces)", word);
    ids.push_back(static_cast<int32_t>(id));
    i = end;
  }
  return ids;
}

void run(const TokenizeArgs& args) {
  const std::unique_ptr<text::Tokenizer> tokenizer = text::load_tokenizer(args.tokenizer);
  const std::string input = read_stdin();
  std::string output;
  if (args.decode) {
    output = tokenizer->decode(parse_ids(input));
  } else {
    for (int32_t id : tokenizer->encode(input)) {
      if (!output.empty()) output += ' ';
      output += std::to_string(id);
    }
    output += '\n';
  }
  QV_CHECK(std::fwrite(output.data(), 1, output.size(), stdout) == output.size() &&
               std::fflush(stdout) == 0,
           "writing to stdout failed");
}

}  // namespace

void register_tokenize(CLI::App& app) {
  auto args = std::make_shared<TokenizeArgs>();
  CLI::App* cmd = app.add_subcommand(
      "tokenize", "Encode stdin to token ids (one line, space-separated), or decode ids to text");
  cmd->add_option("--tokenizer", args->tokenizer,
                  "a GPT-2 BPE folder (vocab.json + merges.txt, or encoder.json + vocab.bpe) or "
                  "a SentencePiece .model file")
      ->required();
  cmd->add_flag("--decode", args->decode, "read token ids from stdin and print the text");
  cmd->callback([args] { run(*args); });
}

}  // namespace quiver::cli
