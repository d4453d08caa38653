// Token shards in llm.c's .bin format and the dataset folder that `quiver prepare` writes.
//
// A shard: a header of 256 little-endian int32 (magic 20240520, version 1, token count,
// the rest 0), then `count` uint16 token ids. A dataset folder DIR holds
// DIR/train_000000.bin, ..., DIR/val_000000.bin, ... and DIR/dataset.json.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace quiver::train {

inline constexpr int32_t kShardMagic = 20240520;
inline constexpr int32_t kShardVersion = 1;
inline constexpr int64_t kShardHeaderBytes = 256 * 4;

// Writes atomically: a temporary file beside `path`, fsync, rename.
void write_shard(const std::string& path, const std::vector<uint16_t>& tokens);
// Validates the size (at least the header), magic, version and that the token count
// matches the bytes after the header; errors name the file and the problem.
std::vector<uint16_t> read_shard(const std::string& path);

// Token ids as stored in a shard; throws if an id is outside [0, 65536).
std::vector<uint16_t> to_shard_tokens(const std::vector<int32_t>& ids);

struct DatasetInfo {
  // The tokenizer path. dataset.json stores it relative to the dataset folder;
  // read_dataset_info returns it joined with the folder, ready for load_tokenizer.
  std::string tokenizer;
  std::string tokenizer_kind;  // "gpt2-bpe" | "sentencepiece"
  int64_t vocab_size = 0;
  int32_t eot_id = -1;
  int64_t train_tokens = 0, val_tokens = 0;
  int64_t train_documents = 0, val_documents = 0;
};

// DIR/dataset.json written by `quiver prepare`; unknown or missing fields are errors.
DatasetInfo read_dataset_info(const std::string& dir);
// `info.tokenizer` is a path as seen from the current directory (or absolute).
void write_dataset_info(const std::string& dir, const DatasetInfo& info);

// The shards of a split ("train" | "val") in DIR, sorted by name: quiver's
// <split>_NNNNNN.bin and llm.c's *_<split>_NNNNNN.bin and *_<split>.bin. Errors if none.
std::vector<std::string> list_shards(const std::string& dir, const std::string& split);

// Appends token ids to numbered shards DIR/<split>_000000.bin, ... of `shard_tokens` tokens
// each (the last one shorter).
class ShardWriter {
 public:
  ShardWriter(std::string dir, std::string split, int64_t shard_tokens);
  void append(const std::vector<int32_t>& ids);  // throws on ids outside [0, 65536)
  void append_one(int32_t id);
  void close();  // writes the last, partial shard
  int64_t tokens() const { return tokens_; }
  int shards() const { return shards_; }

 private:
  void flush();
  std::string dir_, split_;
  int64_t shard_tokens_;
  std::vector<uint16_t> buffer_;
  int64_t tokens_ = 0;
  int shards_ = 0;
};

}  // namespace quiver::train
