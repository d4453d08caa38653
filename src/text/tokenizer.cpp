#include "text/tokenizer.h"

#include <filesystem>

#include "quiver/error.h"
#include "text/gpt2_bpe.h"
#include "text/sentencepiece_tokenizer.h"

namespace quiver::text {

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  QV_CHECK(fs::exists(status), "tokenizer {} does not exist", path);
  if (fs::is_directory(status)) {
    const fs::path dir(path);
    const auto has = [&](const char* name) { return fs::is_regular_file(dir / name, ec); };
    if (has("vocab.json") && has("merges.txt")) {
      return std::make_unique<Gpt2BpeTokenizer>(path, (dir / "vocab.json").string(),
                                                (dir / "merges.txt").string());
    }
    if (has("encoder.json") && has("vocab.bpe")) {
      return std::make_unique<Gpt2BpeTokenizer>(path, (dir / "encoder.json").string(),
                                                (dir / "vocab.bpe").string());
    }
    if (has("vocab.json")) fail("tokenizer folder {} has vocab.json but no merges.txt", path);
    if (has("merges.txt")) fail("tokenizer folder {} has merges.txt but no vocab.json", path);
    if (has("encoder.json")) fail("tokenizer folder {} has encoder.json but no vocab.bpe", path);
    if (has("vocab.bpe")) fail("tokenizer folder {} has vocab.bpe but no encoder.json", path);
    if (has("tokenizer.model")) return load_tokenizer((dir / "tokenizer.model").string());
    fail(
        "tokenizer folder {} has neither vocab.json + merges.txt (Hugging Face GPT-2 layout) "
        "nor encoder.json + vocab.bpe (OpenAI layout) nor tokenizer.model (SentencePiece)",
        path);
  }
  QV_CHECK(fs::is_regular_file(status), "tokenizer {} is neither a folder nor a file", path);
  const fs::path file(path);
  if (file.filename() == "tokenizer.json") {
    fail(
        "{}: Hugging Face tokenizer.json is not supported; pass a folder with vocab.json + "
        "merges.txt, or a SentencePiece .model file",
        path);
  }
  return std::make_unique<SentencePieceTokenizer>(path);
}

}  // namespace quiver::text
