// llm.c token shards, the dataset folder, the progress line, and `quiver prepare` end to
// end (with a SentencePiece vocabulary that prepare trains).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/progress.h"
#include "quiver/error.h"
#include "testing.h"
#include "text/tokenizer.h"
#include "train/shards.h"

using namespace quiver;
using namespace quiver::train;
namespace fs = std::filesystem;

namespace {

using TempDir = quiver::testing::ScratchDir;

void write_file(const std::string& path, const std::string& bytes) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream out(path, std::ios::binary);
  out << bytes;
  ASSERT_TRUE(out.good()) << path;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string quoted(const std::string& s) { return "'" + s + "'"; }

int run_shell(const std::string& command) {
  const int status = std::system(command.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// The message of the quiver::Error that fn throws ("no error" if none).
template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

std::vector<uint16_t> random_tokens(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint16_t> tokens(n);
  for (auto& t : tokens) t = static_cast<uint16_t>(rng());
  if (n >= 2) {
    tokens[0] = 0;
    tokens[n - 1] = 65535;
  }
  return tokens;
}

int32_t header_field(const std::string& bytes, int index) {
  int32_t v;
  std::memcpy(&v, bytes.data() + 4 * index, 4);
  return v;
}

std::string with_header_field(std::string bytes, int index, int32_t value) {
  std::memcpy(bytes.data() + 4 * index, &value, 4);
  return bytes;
}

}  // namespace

TEST(Shards, RoundTripWithTheLlmcLayout) {
  TempDir dir;
  for (size_t n : {size_t{0}, size_t{1}, size_t{1000}}) {
    const std::vector<uint16_t> tokens = random_tokens(n, static_cast<uint32_t>(n));
    const std::string path = dir / "s.bin";
    write_shard(path, tokens);
    EXPECT_EQ(read_shard(path), tokens);
    const std::string bytes = read_file(path);
    ASSERT_EQ(bytes.size(), 1024 + 2 * n);
    EXPECT_EQ(header_field(bytes, 0), 20240520);
    EXPECT_EQ(header_field(bytes, 1), 1);
    EXPECT_EQ(header_field(bytes, 2), static_cast<int32_t>(n));
    for (int i = 3; i < 256; ++i) ASSERT_EQ(header_field(bytes, i), 0);
    for (size_t i = 0; i < n; ++i) {
      const uint16_t t = static_cast<uint8_t>(bytes[1024 + 2 * i]) |
                         static_cast<uint16_t>(static_cast<uint8_t>(bytes[1025 + 2 * i]) << 8);
      ASSERT_EQ(t, tokens[i]);
    }
  }
  // No temporary file is left behind.
  int files = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir.path())) ++files;
  EXPECT_EQ(files, 1);
}

TEST(Shards, DamagedFilesAreErrorsThatNameTheFileAndProblem) {
  TempDir dir;
  const std::string good = dir / "good.bin";
  write_shard(good, random_tokens(100, 5));
  const std::string bytes = read_file(good);
  const std::string bad = dir / "bad.bin";
  const auto read_error = [&](const std::string& content) {
    write_file(bad, content);
    return error_of([&] { read_shard(bad); });
  };
  for (size_t cut : {size_t{0}, size_t{3}, size_t{512}, size_t{1023}}) {
    const std::string e = read_error(bytes.substr(0, cut));
    EXPECT_NE(e.find(bad), std::string::npos) << e;
    EXPECT_NE(e.find("shorter than the 1024-byte"), std::string::npos) << e;
  }
  for (size_t cut : {size_t{1024}, size_t{1025}, size_t{1100}, bytes.size() - 1}) {
    const std::string e = read_error(bytes.substr(0, cut));
    EXPECT_NE(e.find(bad), std::string::npos) << e;
    EXPECT_NE(e.find("header says 100 tokens"), std::string::npos) << e;
    EXPECT_NE(e.find("truncated"), std::string::npos) << e;
  }
  std::string e = read_error(bytes + "xy");
  EXPECT_NE(e.find("trailing data"), std::string::npos) << e;
  e = read_error(with_header_field(bytes, 0, 12345));
  EXPECT_NE(e.find("bad magic 12345"), std::string::npos) << e;
  e = read_error(with_header_field(bytes, 1, 2));
  EXPECT_NE(e.find("version 2"), std::string::npos) << e;
  e = read_error(with_header_field(bytes, 1, 7));
  EXPECT_NE(e.find("unsupported version 7"), std::string::npos) << e;
  e = read_error(with_header_field(bytes, 2, 101));
  EXPECT_NE(e.find("header says 101 tokens"), std::string::npos) << e;
  e = read_error(with_header_field(bytes, 2, -1));
  EXPECT_NE(e.find("header says -1 tokens"), std::string::npos) << e;
  e = error_of([&] { read_shard(dir / "missing.bin"); });
  EXPECT_NE(e.find("missing.bin"), std::string::npos) << e;
}

TEST(Shards, IdsBeyondUint16AreErrors) {
  EXPECT_EQ(to_shard_tokens({0, 1, 65535}), (std::vector<uint16_t>{0, 1, 65535}));
  EXPECT_NE(error_of([] { to_shard_tokens({5, 65536}); }).find("65536"), std::string::npos);
  EXPECT_THROW(to_shard_tokens({-1}), Error);
  TempDir dir;
  ShardWriter writer(dir.path().string(), "train", 10);
  EXPECT_THROW(writer.append({70000}), Error);
}

TEST(Shards, WriterSplitsIntoNumberedShardsThatListInOrder) {
  TempDir dir;
  std::vector<int32_t> ids(25);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i * 2000);
  ShardWriter writer(dir.path().string(), "train", 10);
  writer.append(std::vector<int32_t>(ids.begin(), ids.begin() + 7));
  writer.append(std::vector<int32_t>(ids.begin() + 7, ids.end()));
  writer.close();
  EXPECT_EQ(writer.tokens(), 25);
  EXPECT_EQ(writer.shards(), 3);
  const std::vector<std::string> shards = list_shards(dir.path().string(), "train");
  ASSERT_EQ(shards.size(), 3u);
  std::vector<int32_t> back;
  std::vector<size_t> sizes;
  for (const std::string& s : shards) {
    const std::vector<uint16_t> t = read_shard(s);
    sizes.push_back(t.size());
    back.insert(back.end(), t.begin(), t.end());
  }
  EXPECT_EQ(sizes, (std::vector<size_t>{10, 10, 5}));
  EXPECT_EQ(back, ids);
  EXPECT_EQ(fs::path(shards[2]).filename(), "train_000002.bin");
}

TEST(Shards, ListShardsSortsAndAcceptsLlmcNames) {
  TempDir dir;
  for (const char* name : {"val_000010.bin", "val_000002.bin", "train_000000.bin", "val_000000.bin",
                           "val_000003.bin.tmp.99", "interval_000001.bin"}) {
    write_shard(dir / name, {1, 2});
  }
  std::vector<std::string> names;
  for (const std::string& s : list_shards(dir.path().string(), "val")) {
    names.push_back(fs::path(s).filename().string());
  }
  EXPECT_EQ(names,
            (std::vector<std::string>{"val_000000.bin", "val_000002.bin", "val_000010.bin"}));

  TempDir llmc;
  for (const char* name : {"fineweb_train_000002.bin", "fineweb_train_000001.bin",
                           "fineweb_val_000000.bin", "tiny_shakespeare_val.bin"}) {
    write_shard(llmc / name, {1});
  }
  names.clear();
  for (const std::string& s : list_shards(llmc.path().string(), "train")) {
    names.push_back(fs::path(s).filename().string());
  }
  EXPECT_EQ(names,
            (std::vector<std::string>{"fineweb_train_000001.bin", "fineweb_train_000002.bin"}));
  EXPECT_EQ(list_shards(llmc.path().string(), "val").size(), 2u);

  TempDir only_train;
  write_shard(only_train / "train_000000.bin", {1});
  const std::string e = error_of([&] { list_shards(only_train.path().string(), "val"); });
  EXPECT_NE(e.find("no val shards"), std::string::npos) << e;
  EXPECT_NE(e.find(only_train.path().string()), std::string::npos) << e;
  EXPECT_THROW(list_shards(dir / "absent", "train"), Error);
  EXPECT_THROW(list_shards(dir.path().string(), "test"), Error);
}

TEST(Shards, DatasetInfoRoundTripsWithTheTokenizerRelativeToTheFolder) {
  TempDir root;
  const std::string dir = root / "data/tiny";
  fs::create_directories(dir);
  DatasetInfo info;
  info.tokenizer = root / "gpt2";
  info.tokenizer_kind = "gpt2-bpe";
  info.vocab_size = 50257;
  info.eot_id = 50256;
  info.train_tokens = 123456789012;
  info.val_tokens = 42;
  info.train_documents = 9;
  info.val_documents = 1;
  write_dataset_info(dir, info);
  const auto stored = nlohmann::json::parse(read_file(dir + "/dataset.json"));
  EXPECT_EQ(stored["tokenizer"], "../../gpt2");
  const DatasetInfo back = read_dataset_info(dir);
  EXPECT_EQ(fs::weakly_canonical(back.tokenizer), fs::weakly_canonical(info.tokenizer));
  EXPECT_EQ(back.tokenizer_kind, info.tokenizer_kind);
  EXPECT_EQ(back.vocab_size, info.vocab_size);
  EXPECT_EQ(back.eot_id, info.eot_id);
  EXPECT_EQ(back.train_tokens, info.train_tokens);
  EXPECT_EQ(back.val_tokens, info.val_tokens);
  EXPECT_EQ(back.train_documents, info.train_documents);
  EXPECT_EQ(back.val_documents, info.val_documents);

  auto edited = stored;
  edited["shuffle"] = true;
  write_file(dir + "/dataset.json", edited.dump());
  EXPECT_NE(error_of([&] { read_dataset_info(dir); }).find("unknown field \"shuffle\""),
            std::string::npos);
  edited = stored;
  edited.erase("eot_id");
  write_file(dir + "/dataset.json", edited.dump());
  EXPECT_NE(error_of([&] { read_dataset_info(dir); }).find("missing field \"eot_id\""),
            std::string::npos);
  edited = stored;
  edited["vocab_size"] = "big";
  write_file(dir + "/dataset.json", edited.dump());
  EXPECT_NE(error_of([&] { read_dataset_info(dir); }).find("\"vocab_size\" has the wrong type"),
            std::string::npos);
  EXPECT_NE(error_of([&] { read_dataset_info(root / "none"); }).find("dataset.json"),
            std::string::npos);
}

TEST(Progress, FormatsCountsRatesAndTimes) {
  EXPECT_EQ(human_count(999), "999");
  EXPECT_EQ(human_count(1234), "1.23K");
  EXPECT_EQ(human_count(56.7e6), "56.7M");
  EXPECT_EQ(human_count(2.5e9), "2.50G");
  EXPECT_EQ(human_duration(9.5), "9.5s");
  EXPECT_EQ(human_duration(75), "1m15s");
  EXPECT_EQ(human_duration(3725), "1h02m");
  Progress bytes("prepare", 2000000, "B", nullptr, false);
  EXPECT_EQ(bytes.line(500000, 2.0), "prepare  25% 500K/2.00MB  250KB/s  ETA 6.0s");
  EXPECT_EQ(bytes.line(2000000, 4.0), "prepare 100% 2.00M/2.00MB  500KB/s  in 4.0s");
  Progress tokens("train", 0, "tok", nullptr, false);
  EXPECT_EQ(tokens.line(3000, 1.5), "train 3.00K tok  2.00K tok/s  1.5s");
}

TEST(Progress, LogOutputIsThrottledAndFinishesOnce) {
  std::FILE* log = std::tmpfile();
  ASSERT_NE(log, nullptr);
  {
    Progress p("job", 100, "B", log, false);
    for (int i = 1; i <= 100; ++i) p.update(i);
    p.finish();
    p.finish();
  }
  std::rewind(log);
  std::string text;
  for (int c; (c = std::fgetc(log)) != EOF;) text += static_cast<char>(c);
  std::fclose(log);
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 1) << text;
  EXPECT_EQ(text.rfind("job 100% 100/100B", 0), 0u) << text;
}

namespace {

std::string document_text(int index, int lines) {
  const std::vector<std::string> words = {"the",   "river", "runs",  "past",   "old",   "stone",
                                          "walls", "and",   "green", "fields", "under", "sky"};
  std::mt19937 rng(static_cast<uint32_t>(index));
  std::uniform_int_distribution<size_t> pick(0, words.size() - 1);
  std::string text = "Document " + std::to_string(index) + ".\n";
  for (int l = 0; l < lines; ++l) {
    for (int w = 0; w < 8; ++w) text += words[pick(rng)] + (w < 7 ? " " : ".\n");
  }
  return text;
}

// Concatenation of all shards of a split.
std::vector<int32_t> split_tokens(const std::string& dir, const std::string& split,
                                  std::vector<size_t>* sizes = nullptr) {
  std::vector<int32_t> all;
  for (const std::string& s : list_shards(dir, split)) {
    const std::vector<uint16_t> t = read_shard(s);
    if (sizes) sizes->push_back(t.size());
    all.insert(all.end(), t.begin(), t.end());
  }
  return all;
}

}  // namespace

TEST(PrepareCli, TrainsSentencePieceAndWritesSplitShards) {
  TempDir dir;
  // Six documents in nested folders (sorted by path: a/, b/, b/c/), a binary and an empty file.
  const std::vector<std::string> paths = {"corpus/a/01.txt",   "corpus/a/02.txt",
                                          "corpus/b/03.txt",   "corpus/b/04.md",
                                          "corpus/b/c/05.txt", "corpus/b/c/06.txt"};
  std::vector<std::string> docs;
  for (size_t i = 0; i < paths.size(); ++i) {
    docs.push_back(document_text(static_cast<int>(i), 40 + 30 * static_cast<int>(i)));
    write_file(dir / paths[i], docs.back());
  }
  write_file(dir / "corpus/a/image.bin", std::string("\x89PNG\r\n\x1a\n\0\0\0", 11) + "data");
  write_file(dir / "corpus/b/empty.txt", "");

  const std::string cli = quoted(quiver::testing::cli_path());
  const std::string out = dir / "data";
  const std::string command = cli + " prepare --train-sentencepiece 320 --val-fraction 0.3 " +
                              "--shard-tokens 500 --out " + quoted(out) + " " +
                              quoted(dir / "corpus");
  ASSERT_EQ(
      run_shell(command + " > " + quoted(dir / "stdout.txt") + " 2> " + quoted(dir / "stderr.txt")),
      0)
      << read_file(dir / "stderr.txt");
  const std::string log = read_file(dir / "stderr.txt");
  EXPECT_NE(log.find("skipped 1 binary"), std::string::npos) << log;
  EXPECT_NE(log.find("skipped 1 empty"), std::string::npos) << log;
  EXPECT_NE(log.find("prepare 100%"), std::string::npos) << log;

  const DatasetInfo info = read_dataset_info(out);
  EXPECT_EQ(info.tokenizer_kind, "sentencepiece");
  EXPECT_EQ(fs::weakly_canonical(info.tokenizer), fs::weakly_canonical(out + "/tokenizer.model"));
  EXPECT_EQ(info.vocab_size, 320);
  EXPECT_EQ(info.eot_id, 2);
  EXPECT_EQ(info.train_documents, 4);  // round(6 × 0.3) = 2 documents for val
  EXPECT_EQ(info.val_documents, 2);

  // Independently: each document encoded by the trained model, preceded by EOT, in order.
  const auto tokenizer = text::load_tokenizer(info.tokenizer);
  std::vector<int32_t> expected_train, expected_val;
  for (size_t i = 0; i < docs.size(); ++i) {
    std::vector<int32_t>& stream = i < 4 ? expected_train : expected_val;
    stream.push_back(2);
    const std::vector<int32_t> ids = tokenizer->encode(docs[i]);
    stream.insert(stream.end(), ids.begin(), ids.end());
  }
  std::vector<size_t> sizes;
  const std::vector<int32_t> train = split_tokens(out, "train", &sizes);
  EXPECT_EQ(train, expected_train);
  EXPECT_EQ(static_cast<int64_t>(train.size()), info.train_tokens);
  ASSERT_GE(sizes.size(), 2u);
  for (size_t i = 0; i + 1 < sizes.size(); ++i) EXPECT_EQ(sizes[i], 500u);
  const std::vector<int32_t> val = split_tokens(out, "val");
  EXPECT_EQ(val, expected_val);
  EXPECT_EQ(static_cast<int64_t>(val.size()), info.val_tokens);
  EXPECT_EQ(std::count(train.begin(), train.end(), 2), 4);
  EXPECT_EQ(std::count(val.begin(), val.end(), 2), 2);
  // The last val document decodes back to its text.
  const auto last_eot = std::find(val.rbegin(), val.rend(), 2).base();
  EXPECT_EQ(tokenizer->decode(std::vector<int32_t>(last_eot, val.end())), docs.back());

  // A second run into the same folder needs --overwrite.
  EXPECT_EQ(run_shell(command + " > /dev/null 2> " + quoted(dir / "stderr2.txt")), 1);
  EXPECT_NE(read_file(dir / "stderr2.txt").find("--overwrite"), std::string::npos);
}

TEST(PrepareCli, RejectsVocabulariesBeyondUint16BeforeAnyWork) {
  TempDir dir;
  write_file(dir / "corpus/a.txt", document_text(0, 5));
  write_file(dir / "corpus/b.txt", document_text(1, 5));
  const std::string cli = quoted(quiver::testing::cli_path());
  EXPECT_EQ(run_shell(cli + " prepare --train-sentencepiece 70000 --out " + quoted(dir / "out") +
                      " " + quoted(dir / "corpus") + " 2> " + quoted(dir / "err.txt")),
            1);
  EXPECT_NE(read_file(dir / "err.txt").find("65536"), std::string::npos)
      << read_file(dir / "err.txt");
  EXPECT_FALSE(fs::exists(dir / "out"));
  EXPECT_EQ(run_shell(cli + " prepare --out " + quoted(dir / "out") + " " + quoted(dir / "corpus") +
                      " 2> " + quoted(dir / "err.txt")),
            1);
  EXPECT_NE(read_file(dir / "err.txt").find("--tokenizer"), std::string::npos);
}

TEST(PrepareCli, IgnoresItsOwnOutputInsideAnInputFolder) {
  TempDir dir;
  write_file(dir / "corpus/a.txt", document_text(0, 30));
  write_file(dir / "corpus/b.txt", document_text(1, 30));
  const std::string command = quoted(quiver::testing::cli_path()) +
                              " prepare --train-sentencepiece 300 --val-fraction 0.5 --overwrite "
                              "--out " +
                              quoted(dir / "corpus/prepared") + " " + quoted(dir / "corpus") +
                              " > /dev/null 2> " + quoted(dir / "err.txt");
  for (int run = 0; run < 2; ++run) {
    ASSERT_EQ(run_shell(command), 0) << read_file(dir / "err.txt");
    const DatasetInfo info = read_dataset_info(dir / "corpus/prepared");
    EXPECT_EQ(info.train_documents, 1) << "run " << run;
    EXPECT_EQ(info.val_documents, 1) << "run " << run;
  }
}
