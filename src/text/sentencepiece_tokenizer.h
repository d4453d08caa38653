// SentencePiece models (the small 4K/32K vocabularies of the Relation paper) through
// libsentencepiece, and training such a model on text files.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "text/tokenizer.h"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace quiver::text {

class SentencePieceTokenizer : public Tokenizer {
 public:
  explicit SentencePieceTokenizer(const std::string& model_path);
  ~SentencePieceTokenizer() override;

  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  int64_t vocab_size() const override;
  int32_t eot_id() const override;  // the model's eos id, -1 when it has none
  std::string kind() const override { return "sentencepiece"; }

 private:
  std::unique_ptr<sentencepiece::SentencePieceProcessor> processor_;
};

// Trains a SentencePiece model on the lines of `text_files` and writes
// MODEL_PREFIX.model and MODEL_PREFIX.vocab. model_type: "bpe" | "unigram" | "char" |
// "word". Settings chosen so that any text round-trips: byte_fallback (unseen characters
// become byte pieces), identity normalization, white space kept as written; plus
// character_coverage 0.9995, at most kMaxTrainingSentences sentences (sampled), 2 threads,
// unk 0, bos 1, eos 2 (the end-of-text id).
void train_sentencepiece(const std::vector<std::string>& text_files,
                         const std::string& model_prefix, int vocab_size,
                         const std::string& model_type = "bpe");

// The training sample's cap: a 4K vocabulary trains in seconds, larger corpora are sampled.
inline constexpr int64_t kMaxTrainingSentences = 300000;

}  // namespace quiver::text
