// `quiver prepare`: text files → llm.c token shards and dataset.json (see train/shards.h).
// Each input file is one document, preceded by the end-of-text token (as llm.c does); the
// last documents (a --val-fraction of them by count, at least one) form the val split.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "commands.h"
#include "core/progress.h"
#include "quiver/error.h"
#include "quiver/parallel.h"
#include "text/sentencepiece_tokenizer.h"
#include "text/tokenizer.h"
#include "train/shards.h"

namespace quiver::cli {
namespace {
namespace fs = std::filesystem;

constexpr int64_t kMaxShardVocab = 65536;  // llm.c shards store uint16 ids
constexpr int64_t kBinaryProbeBytes = 8192;
constexpr int64_t kBatchBytes = 4 << 20;  // documents encoded in parallel per batch
constexpr int64_t kBatchDocuments = 256;

struct PrepareArgs {
  std::string tokenizer;
  std::string out;
  double val_fraction = 0.05;
  int train_sentencepiece = 0;
  std::string shard_tokens = "100M";
  bool overwrite = false;
  std::vector<std::string> inputs;
};

struct Document {
  std::string path;
  int64_t bytes;
};

// "100M" → 100000000; K, M, G are powers of 1000.
int64_t parse_count(const std::string& text, const char* option) {
  const std::regex pattern("([0-9]+)([KMG]?)");
  std::smatch m;
  QV_CHECK(std::regex_match(text, m, pattern), "{}: \"{}\" is not a count like 1000000 or 100M",
           option, text);
  int64_t value = std::stoll(m[1].str());
  const std::string suffix = m[2].str();
  const int64_t scale = suffix == "K"   ? 1000
                        : suffix == "M" ? 1000000
                        : suffix == "G" ? 1000000000
                                        : 1;
  QV_CHECK(value <= INT64_MAX / scale, "{}: {} is too large", option, text);
  return value * scale;
}

// A file is treated as binary when its first 8 KB hold a NUL byte.
bool looks_binary(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  QV_CHECK(in, "cannot open {}", path);
  std::string head(kBinaryProbeBytes, '\0');
  in.read(head.data(), kBinaryProbeBytes);
  head.resize(static_cast<size_t>(in.gcount()));
  return head.find('\0') != std::string::npos;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  QV_CHECK(in, "cannot open {}", path);
  std::string text;
  in.seekg(0, std::ios::end);
  text.resize(static_cast<size_t>(in.tellg()));
  in.seekg(0);
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  QV_CHECK(in, "error reading {}", path);
  return text;
}

// The regular files named by the inputs: files as given, folders recursively, each
// folder's files sorted by path so that the result does not depend on the file system.
std::vector<std::string> input_files(const std::vector<std::string>& inputs) {
  std::vector<std::string> files;
  for (const std::string& input : inputs) {
    std::error_code ec;
    const fs::file_status status = fs::status(input, ec);
    QV_CHECK(fs::exists(status), "input {} does not exist", input);
    if (fs::is_regular_file(status)) {
      files.push_back(input);
      continue;
    }
    QV_CHECK(fs::is_directory(status), "input {} is neither a file nor a folder", input);
    std::vector<std::string> found;
    for (const auto& entry : fs::recursive_directory_iterator(input)) {
      if (entry.is_regular_file()) found.push_back(entry.path().string());
    }
    std::sort(found.begin(), found.end());
    files.insert(files.end(), found.begin(), found.end());
  }
  return files;
}

// Shards and dataset.json that an earlier run left in DIR; mixing them with a new run's
// would corrupt the dataset.
std::vector<fs::path> previous_outputs(const fs::path& dir) {
  std::vector<fs::path> found;
  if (!fs::is_directory(dir)) return found;
  const std::regex shard("(train|val)_[0-9]{6}\\.bin");
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (std::regex_match(name, shard) || name == "dataset.json") found.push_back(entry.path());
  }
  std::sort(found.begin(), found.end());
  return found;
}

void run(const PrepareArgs& args) {
  const int64_t shard_tokens = parse_count(args.shard_tokens, "--shard-tokens");
  QV_CHECK(args.val_fraction >= 0 && args.val_fraction < 1,
           "--val-fraction must be in [0, 1), got {}", args.val_fraction);
  const bool train_spm = args.train_sentencepiece > 0;
  QV_CHECK(train_spm || !args.tokenizer.empty(),
           "give --tokenizer PATH, or --train-sentencepiece VOCAB to train one");
  QV_CHECK(!(train_spm && !args.tokenizer.empty()),
           "--tokenizer and --train-sentencepiece exclude each other");
  QV_CHECK(args.train_sentencepiece <= kMaxShardVocab,
           "--train-sentencepiece {}: vocabularies above {} do not fit llm.c's uint16 shards",
           args.train_sentencepiece, kMaxShardVocab);

  // A given tokenizer is checked before any work; a trained one once it exists.
  std::unique_ptr<text::Tokenizer> tokenizer;
  const auto check_tokenizer = [](const text::Tokenizer& t) {
    QV_CHECK(t.vocab_size() <= kMaxShardVocab,
             "tokenizer {} has {} tokens; llm.c shards store uint16 ids (at most {})", t.source(),
             t.vocab_size(), kMaxShardVocab);
    QV_CHECK(t.eot_id() >= 0, "tokenizer {} has no end-of-text token to separate documents",
             t.source());
  };
  if (!train_spm) {
    tokenizer = text::load_tokenizer(args.tokenizer);
    check_tokenizer(*tokenizer);
  }

  const fs::path out(args.out);
  const std::vector<fs::path> previous = previous_outputs(out);
  if (!previous.empty()) {
    QV_CHECK(args.overwrite,
             "{} already holds a prepared dataset ({} and {} more); pass --overwrite to replace "
             "it, or choose another --out",
             args.out, previous.front().filename().string(), previous.size() - 1);
  }

  // Inputs: skip binary and empty files.
  std::vector<Document> documents;
  int64_t binary = 0, empty = 0, total_bytes = 0;
  const fs::path out_canonical = fs::weakly_canonical(fs::absolute(out));
  for (const std::string& path : input_files(args.inputs)) {
    // An output folder inside an input folder: its files are not documents.
    const fs::path canonical = fs::weakly_canonical(fs::absolute(path));
    if (std::mismatch(out_canonical.begin(), out_canonical.end(), canonical.begin(),
                      canonical.end())
            .first == out_canonical.end()) {
      continue;
    }
    const int64_t bytes = static_cast<int64_t>(fs::file_size(path));
    if (bytes == 0) {
      ++empty;
    } else if (looks_binary(path)) {
      ++binary;
    } else {
      documents.push_back({path, bytes});
      total_bytes += bytes;
    }
  }
  fmt::print(stderr, "prepare: {} text files ({}B)", documents.size(),
             human_count(static_cast<double>(total_bytes)));
  if (binary > 0) fmt::print(stderr, "; skipped {} binary files (NUL in the first 8 KB)", binary);
  if (empty > 0) fmt::print(stderr, "; skipped {} empty files", empty);
  fmt::print(stderr, "\n");
  QV_CHECK(!documents.empty(), "no text files among the inputs");
  const int64_t n_docs = static_cast<int64_t>(documents.size());
  const int64_t n_val =
      args.val_fraction > 0
          ? std::max<int64_t>(1, std::llround(static_cast<double>(n_docs) * args.val_fraction))
          : 0;
  QV_CHECK(n_val < n_docs,
           "cannot split {} document{} into train and val (--val-fraction {} leaves no train "
           "document); give more files, or --val-fraction 0",
           n_docs, n_docs == 1 ? "" : "s", args.val_fraction);

  for (const fs::path& p : previous) fs::remove(p);
  fs::create_directories(out);
  std::string tokenizer_path = args.tokenizer;
  if (train_spm) {
    const std::string prefix = (out / "tokenizer").string();
    fmt::print(stderr,
               "prepare: training a SentencePiece BPE vocabulary of {} on the text files "
               "(at most {} lines sampled)\n",
               args.train_sentencepiece, text::kMaxTrainingSentences);
    const auto start = std::chrono::steady_clock::now();
    std::vector<std::string> paths;
    for (const Document& d : documents) paths.push_back(d.path);
    text::train_sentencepiece(paths, prefix, args.train_sentencepiece, "bpe");
    fmt::print(
        stderr, "prepare: wrote {}.model in {}\n", prefix,
        human_duration(
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()));
    tokenizer_path = prefix + ".model";
    tokenizer = text::load_tokenizer(tokenizer_path);
    check_tokenizer(*tokenizer);
  }
  const int32_t eot = tokenizer->eot_id();

  train::ShardWriter train_writer(args.out, "train", shard_tokens);
  train::ShardWriter val_writer(args.out, "val", shard_tokens);
  Progress progress("prepare", total_bytes, "B");
  int64_t done_bytes = 0;
  std::vector<std::vector<int32_t>> encoded;
  for (int64_t begin = 0; begin < n_docs;) {
    int64_t end = begin, batch_bytes = 0;
    while (end < n_docs && end - begin < kBatchDocuments &&
           (end == begin || batch_bytes + documents[end].bytes <= kBatchBytes)) {
      batch_bytes += documents[end].bytes;
      ++end;
    }
    const int64_t count = end - begin;
    encoded.assign(static_cast<size_t>(count), {});
    parallel_for(count, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) {
        encoded[i] = tokenizer->encode(read_file(documents[begin + i].path));
      }
    });
    for (int64_t i = 0; i < count; ++i) {
      train::ShardWriter& writer = begin + i < n_docs - n_val ? train_writer : val_writer;
      writer.append_one(eot);
      writer.append(encoded[i]);
    }
    done_bytes += batch_bytes;
    progress.update(done_bytes);
    begin = end;
  }
  train_writer.close();
  val_writer.close();
  progress.finish();

  train::DatasetInfo info;
  info.tokenizer = tokenizer_path;
  info.tokenizer_kind = tokenizer->kind();
  info.vocab_size = tokenizer->vocab_size();
  info.eot_id = eot;
  info.train_tokens = train_writer.tokens();
  info.val_tokens = val_writer.tokens();
  info.train_documents = n_docs - n_val;
  info.val_documents = n_val;
  train::write_dataset_info(args.out, info);
  fmt::print("train: {} tokens, {} documents, {} shards\n", info.train_tokens, info.train_documents,
             train_writer.shards());
  fmt::print("val: {} tokens, {} documents, {} shards\n", info.val_tokens, info.val_documents,
             val_writer.shards());
  fmt::print("wrote {}\n", (out / "dataset.json").string());
}

}  // namespace

void register_prepare(CLI::App& app) {
  auto args = std::make_shared<PrepareArgs>();
  CLI::App* cmd = app.add_subcommand(
      "prepare", "Tokenize text files into llm.c token shards (train/val) and dataset.json");
  cmd->add_option("inputs", args->inputs, "text files or folders (read recursively)")->required();
  cmd->add_option("--tokenizer", args->tokenizer,
                  "GPT-2 BPE folder or SentencePiece .model (not with --train-sentencepiece)");
  cmd->add_option("--out", args->out, "output folder")->required();
  cmd->add_option("--val-fraction", args->val_fraction,
                  "fraction of the documents (the last ones) held out for val")
      ->capture_default_str();
  cmd->add_option("--train-sentencepiece", args->train_sentencepiece,
                  "first train a SentencePiece BPE of this vocabulary size on the inputs "
                  "(written to OUT/tokenizer.model) and use it");
  cmd->add_option("--shard-tokens", args->shard_tokens, "tokens per shard, e.g. 100M")
      ->capture_default_str();
  cmd->add_flag("--overwrite", args->overwrite, "replace the shards of an earlier run in OUT");
  cmd->callback([args] { run(*args); });
}

}  // namespace quiver::cli
