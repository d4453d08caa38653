#include "train/shards.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>

#include "quiver/error.h"

namespace quiver::train {
namespace fs = std::filesystem;

static_assert(std::endian::native == std::endian::little,
              "llm.c shards are little-endian; quiver reads them in place");

namespace {

// write(2) all of `size` bytes or throw.
void write_all(int fd, const void* data, size_t size, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    QV_CHECK(n > 0, "writing {}: {}", path, std::strerror(errno));
    p += n;
    size -= static_cast<size_t>(n);
  }
}

// Makes a rename inside `dir` durable.
void sync_directory(const fs::path& dir) {
  const int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

}  // namespace

void write_shard(const std::string& path, const std::vector<uint16_t>& tokens) {
  QV_CHECK(tokens.size() <= static_cast<size_t>(INT32_MAX),
           "{}: {} tokens do not fit an llm.c shard (its header counts in int32)", path,
           tokens.size());
  int32_t header[256] = {};
  header[0] = kShardMagic;
  header[1] = kShardVersion;
  header[2] = static_cast<int32_t>(tokens.size());
  const std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  QV_CHECK(fd >= 0, "cannot create {}: {}", tmp, std::strerror(errno));
  try {
    write_all(fd, header, sizeof(header), tmp);
    write_all(fd, tokens.data(), tokens.size() * sizeof(uint16_t), tmp);
    QV_CHECK(::fsync(fd) == 0, "fsync {}: {}", tmp, std::strerror(errno));
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  QV_CHECK(::close(fd) == 0, "closing {}: {}", tmp, std::strerror(errno));
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    fail("cannot rename {} to {}: {}", tmp, path, std::strerror(err));
  }
  sync_directory(fs::path(path).parent_path());
}

std::vector<uint16_t> read_shard(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  QV_CHECK(in, "cannot open token shard {}", path);
  in.seekg(0, std::ios::end);
  const int64_t size = static_cast<int64_t>(in.tellg());
  in.seekg(0);
  QV_CHECK(size >= kShardHeaderBytes,
           "token shard {}: {} bytes, shorter than the {}-byte llm.c header (truncated?)", path,
           size, kShardHeaderBytes);
  int32_t header[256];
  in.read(reinterpret_cast<char*>(header), sizeof(header));
  QV_CHECK(in, "token shard {}: cannot read the header", path);
  QV_CHECK(header[0] == kShardMagic,
           "token shard {}: bad magic {} (expected {}; not an llm.c token shard)", path, header[0],
           kShardMagic);
  QV_CHECK(header[1] != 2,
           "token shard {}: version 2 (uint32 tokens, llm.c's Llama 3 format) is not supported; "
           "expected version {} (uint16 tokens)",
           path, kShardVersion);
  QV_CHECK(header[1] == kShardVersion, "token shard {}: unsupported version {} (expected {})", path,
           header[1], kShardVersion);
  const int64_t count = header[2];
  const int64_t payload = size - kShardHeaderBytes;
  QV_CHECK(count >= 0 && count * 2 == payload,
           "token shard {}: the header says {} tokens ({} bytes) but {} bytes follow it ({})", path,
           count, count * 2, payload, payload < count * 2 ? "truncated?" : "trailing data");
  std::vector<uint16_t> tokens(static_cast<size_t>(count));
  in.read(reinterpret_cast<char*>(tokens.data()), payload);
  QV_CHECK(in, "token shard {}: cannot read its {} tokens", path, count);
  return tokens;
}

std::vector<uint16_t> to_shard_tokens(const std::vector<int32_t>& ids) {
  std::vector<uint16_t> tokens(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    QV_CHECK(ids[i] >= 0 && ids[i] < 65536,
             "token id {} (at position {}) cannot be stored in an llm.c shard (uint16: 0..65535)",
             ids[i], i);
    tokens[i] = static_cast<uint16_t>(ids[i]);
  }
  return tokens;
}

namespace {

using json = nlohmann::ordered_json;

fs::path dataset_json(const std::string& dir) { return fs::path(dir) / "dataset.json"; }

}  // namespace

void write_dataset_info(const std::string& dir, const DatasetInfo& info) {
  // The tokenizer path relative to the dataset folder, so that the two can move together.
  std::error_code ec;
  fs::path tokenizer = fs::relative(fs::absolute(info.tokenizer), fs::absolute(dir), ec);
  if (ec || tokenizer.empty()) tokenizer = info.tokenizer;
  json j;
  j["format"] = "llm.c token shards, version 1 (uint16)";
  j["tokenizer"] = tokenizer.generic_string();
  j["tokenizer_kind"] = info.tokenizer_kind;
  j["vocab_size"] = info.vocab_size;
  j["eot_id"] = info.eot_id;
  j["train_tokens"] = info.train_tokens;
  j["val_tokens"] = info.val_tokens;
  j["train_documents"] = info.train_documents;
  j["val_documents"] = info.val_documents;
  const fs::path path = dataset_json(dir);
  const std::string tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    QV_CHECK(out, "cannot create {}", tmp);
    out << j.dump(2) << "\n";
    QV_CHECK(out.flush(), "writing {} failed", tmp);
  }
  fs::rename(tmp, path, ec);
  QV_CHECK(!ec, "cannot rename {} to {}: {}", tmp, path.string(), ec.message());
}

DatasetInfo read_dataset_info(const std::string& dir) {
  const fs::path path = dataset_json(dir);
  std::ifstream in(path, std::ios::binary);
  QV_CHECK(in, "cannot open {} (is {} a folder made by `quiver prepare`?)", path.string(), dir);
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {
    fail("{}: not valid JSON ({})", path.string(), e.what());
  }
  QV_CHECK(j.is_object(), "{}: expected a JSON object", path.string());
  const char* known[] = {"format",       "tokenizer",  "tokenizer_kind",  "vocab_size",   "eot_id",
                         "train_tokens", "val_tokens", "train_documents", "val_documents"};
  for (const auto& [key, value] : j.items()) {
    QV_CHECK(std::find_if(std::begin(known), std::end(known),
                          [&](const char* k) { return key == k; }) != std::end(known),
             "{}: unknown field \"{}\"", path.string(), key);
  }
  const auto get = [&](const char* field, auto& out) {
    QV_CHECK(j.contains(field), "{}: missing field \"{}\"", path.string(), field);
    try {
      j.at(field).get_to(out);
    } catch (const json::exception&) {
      fail("{}: field \"{}\" has the wrong type ({})", path.string(), field,
           j.at(field).type_name());
    }
  };
  DatasetInfo info;
  std::string tokenizer;
  get("tokenizer", tokenizer);
  get("tokenizer_kind", info.tokenizer_kind);
  get("vocab_size", info.vocab_size);
  get("eot_id", info.eot_id);
  get("train_tokens", info.train_tokens);
  get("val_tokens", info.val_tokens);
  get("train_documents", info.train_documents);
  get("val_documents", info.val_documents);
  const fs::path stored(tokenizer);
  info.tokenizer =
      stored.is_absolute() ? tokenizer : (fs::path(dir) / stored).lexically_normal().string();
  return info;
}

std::vector<std::string> list_shards(const std::string& dir, const std::string& split) {
  QV_CHECK(split == "train" || split == "val",
           "shard split must be \"train\" or \"val\", got \"{}\"", split);
  std::error_code ec;
  QV_CHECK(fs::is_directory(dir, ec), "dataset folder {} does not exist", dir);
  const std::regex name("(.*_)?" + split + "(_[0-9]+)?\\.bin");
  std::vector<std::string> shards;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (!entry.is_regular_file()) continue;
    if (std::regex_match(entry.path().filename().string(), name)) {
      shards.push_back(entry.path().string());
    }
  }
  QV_CHECK(!shards.empty(),
           "no {} shards in {} (expected {}_NNNNNN.bin, or llm.c's *_{}_NNNNNN.bin)", split, dir,
           split, split);
  std::sort(shards.begin(), shards.end());
  return shards;
}

ShardWriter::ShardWriter(std::string dir, std::string split, int64_t shard_tokens)
    : dir_(std::move(dir)), split_(std::move(split)), shard_tokens_(shard_tokens) {
  QV_CHECK(shard_tokens_ > 0 && shard_tokens_ <= INT32_MAX,
           "tokens per shard must be in [1, {}], got {}", INT32_MAX, shard_tokens_);
}

void ShardWriter::append_one(int32_t id) {
  QV_CHECK(id >= 0 && id < 65536,
           "token id {} cannot be stored in an llm.c shard (uint16: 0..65535)", id);
  buffer_.push_back(static_cast<uint16_t>(id));
  ++tokens_;
  if (static_cast<int64_t>(buffer_.size()) == shard_tokens_) flush();
}

void ShardWriter::append(const std::vector<int32_t>& ids) {
  for (int32_t id : ids) append_one(id);
}

void ShardWriter::flush() {
  write_shard((fs::path(dir_) / fmt::format("{}_{:06d}.bin", split_, shards_)).string(), buffer_);
  ++shards_;
  buffer_.clear();
}

void ShardWriter::close() {
  if (!buffer_.empty()) flush();
}

}  // namespace quiver::train
