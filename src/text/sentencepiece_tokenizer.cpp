#include "text/sentencepiece_tokenizer.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <fstream>
#include <unordered_map>

#include "quiver/error.h"

// libsentencepiece logs every training step to stderr at INFO; its level switch is exported
// but not declared in the installed headers.
namespace sentencepiece::logging {
int GetMinLogLevel();
void SetMinLogLevel(int level);
}  // namespace sentencepiece::logging

namespace quiver::text {

SentencePieceTokenizer::SentencePieceTokenizer(const std::string& model_path)
    : Tokenizer(model_path), processor_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {
  const auto status = processor_->Load(model_path);
  QV_CHECK(status.ok(), "{}: not a SentencePiece model ({})", model_path, status.ToString());
}

SentencePieceTokenizer::~SentencePieceTokenizer() = default;

std::vector<int32_t> SentencePieceTokenizer::encode(std::string_view text) const {
  std::vector<int> ids;
  const auto status = processor_->Encode(text, &ids);
  QV_CHECK(status.ok(), "SentencePiece {} failed to encode: {}", source(), status.ToString());
  return {ids.begin(), ids.end()};
}

std::string SentencePieceTokenizer::decode(const std::vector<int32_t>& ids) const {
  const int64_t vocab = vocab_size();
  for (size_t i = 0; i < ids.size(); ++i) {
    QV_CHECK(ids[i] >= 0 && ids[i] < vocab,
             "token id {} (at position {}) is outside the vocabulary [0, {}) of {}", ids[i], i,
             vocab, source());
  }
  std::string text;
  const auto status = processor_->Decode(std::vector<int>(ids.begin(), ids.end()), &text);
  QV_CHECK(status.ok(), "SentencePiece {} failed to decode: {}", source(), status.ToString());
  return text;
}

int64_t SentencePieceTokenizer::vocab_size() const { return processor_->GetPieceSize(); }

int32_t SentencePieceTokenizer::eot_id() const { return processor_->eos_id(); }

namespace {

// The non-empty lines of a list of files, in order, for the trainer.
class FileLines : public sentencepiece::SentenceIterator {
 public:
  explicit FileLines(const std::vector<std::string>& files) : files_(files) { advance(); }
  bool done() const override { return done_; }
  void Next() override { advance(); }
  const std::string& value() const override { return line_; }
  sentencepiece::util::Status status() const override { return status_; }

 private:
  void advance() {
    while (true) {
      if (in_.is_open() && std::getline(in_, line_)) {
        if (!line_.empty() && line_.back() == '\r') line_.pop_back();
        if (!line_.empty()) return;
        continue;
      }
      if (in_.is_open()) {
        if (in_.bad()) {
          status_ = sentencepiece::util::Status(sentencepiece::util::StatusCode::kInternal,
                                                "error reading " + files_[next_file_ - 1]);
          done_ = true;
          return;
        }
        in_.close();
      }
      if (next_file_ == files_.size()) {
        done_ = true;
        return;
      }
      const std::string& path = files_[next_file_++];
      in_.open(path, std::ios::binary);
      if (!in_) {
        status_ = sentencepiece::util::Status(sentencepiece::util::StatusCode::kNotFound,
                                              "cannot open " + path);
        done_ = true;
        return;
      }
    }
  }

  const std::vector<std::string>& files_;
  size_t next_file_ = 0;
  std::ifstream in_;
  std::string line_;
  bool done_ = false;
  sentencepiece::util::Status status_;
};

// Restores libsentencepiece's log level when training ends or throws.
class QuietLogs {
 public:
  QuietLogs() : saved_(sentencepiece::logging::GetMinLogLevel()) {
    sentencepiece::logging::SetMinLogLevel(1);  // warnings and errors only
  }
  ~QuietLogs() { sentencepiece::logging::SetMinLogLevel(saved_); }

 private:
  int saved_;
};

}  // namespace

void train_sentencepiece(const std::vector<std::string>& text_files,
                         const std::string& model_prefix, int vocab_size,
                         const std::string& model_type) {
  QV_CHECK(!text_files.empty(), "train_sentencepiece: no text files");
  QV_CHECK(vocab_size > 0, "train_sentencepiece: vocab_size must be positive, got {}", vocab_size);
  QV_CHECK(model_type == "bpe" || model_type == "unigram" || model_type == "char" ||
               model_type == "word",
           "train_sentencepiece: model_type must be bpe, unigram, char or word, got \"{}\"",
           model_type);
  const std::unordered_map<std::string, std::string> options = {
      {"model_prefix", model_prefix},
      {"vocab_size", std::to_string(vocab_size)},
      {"model_type", model_type},
      {"byte_fallback", "true"},
      {"character_coverage", "0.9995"},
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"allow_whitespace_only_pieces", "true"},
      {"input_sentence_size", std::to_string(kMaxTrainingSentences)},
      {"shuffle_input_sentence", "true"},
      {"max_sentence_length", "16384"},
      {"num_threads", "2"},
      {"unk_id", "0"},
      {"bos_id", "1"},
      {"eos_id", "2"},
      {"pad_id", "-1"},
  };
  FileLines lines(text_files);
  QuietLogs quiet;
  sentencepiece::SetRandomGeneratorSeed(1234);  // the same sample of a large corpus every run
  const auto status = sentencepiece::SentencePieceTrainer::Train(options, &lines);
  QV_CHECK(status.ok(), "SentencePiece training of {} (vocab {}, {}) failed: {}", model_prefix,
           vocab_size, model_type, status.ToString());
}

}  // namespace quiver::text
