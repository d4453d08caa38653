// `quiver generate`: completions from a checkpoint with the decode caches, and the
// throughput (prompt and generated tokens per second, tokenization and sampling included).
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <memory>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "infer/generator.h"
#include "quiver/error.h"
#include "quiver/parallel.h"
#include "core/blas.h"
#include "text/tokenizer.h"
#include "train/checkpoint.h"

#ifdef QUIVER_HAVE_CUDA
#include "cuda/backend.h"
#include "cuda/generate.h"
#include "cuda/model.h"
#endif

namespace quiver::cli {

namespace {

namespace fs = std::filesystem;

struct GenerateArgs {
  std::string checkpoint;
  std::vector<std::string> prompts;
  std::string prompts_file;
  std::string tokenizer;
  infer::GenerateOptions options;
  bool greedy = false;
  bool ignore_eot = false;
  int threads = 0;
  bool json = false;
  std::string device = "cpu";
};

// One prompt per line; empty lines are skipped; "\n" and "\\" in a line stand for a newline
// and a backslash, so that multi-line prompts fit on one line.
std::vector<std::string> read_prompts(const std::string& path) {
  std::ifstream in(path);
  QV_CHECK(in.good(), "cannot open prompts file '{}'", path);
  std::vector<std::string> out;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    std::string prompt;
    for (size_t i = 0; i < line.size(); ++i) {
      if (line[i] == '\\' && i + 1 < line.size() && (line[i + 1] == 'n' || line[i + 1] == '\\')) {
        prompt += line[i + 1] == 'n' ? '\n' : '\\';
        ++i;
      } else {
        prompt += line[i];
      }
    }
    out.push_back(std::move(prompt));
  }
  QV_CHECK(!out.empty(), "prompts file '{}' holds no prompts (one per line)", path);
  return out;
}

void run(GenerateArgs& a) {
  if (a.threads > 0) {
    set_num_threads(a.threads);
    blas::set_threads(a.threads);
  }
  QV_CHECK(a.prompts.empty() != a.prompts_file.empty(), "give either --prompt TEXT (repeatable) or --prompts FILE");
  std::string path = a.checkpoint;
  if (fs::is_directory(path)) path = (fs::path(path) / "model.safetensors").string();
  std::map<std::string, std::string> meta;
  auto model = train::load_checkpoint(path, &meta);
  std::string tokenizer_path = a.tokenizer;
  if (tokenizer_path.empty()) {
    auto it = meta.find(train::kMetaTokenizer);
    QV_CHECK(it != meta.end() && !it->second.empty(),
             "checkpoint '{}' names no tokenizer (metadata '{}'); give --tokenizer PATH", path, train::kMetaTokenizer);
    tokenizer_path = it->second;
  }
  auto tokenizer = text::load_tokenizer(tokenizer_path);
  const std::vector<std::string> prompts = a.prompts_file.empty() ? a.prompts : read_prompts(a.prompts_file);

  infer::GenerateOptions o = a.options;
  if (a.greedy) o.sampling.greedy = true;
  o.stop_at_eot = !a.ignore_eot;
  infer::TextGeneration out;
  if (a.device == "cuda") {
#ifdef QUIVER_HAVE_CUDA
    QV_CHECK(cuda::device_count() > 0, "generate --device cuda: no CUDA device was found");
    cuda::GpuModel gpu(model->config());
    gpu.load_params(model->params());
    out = infer::generate_text(model->config(), *tokenizer, prompts, o,
                               [&](const std::vector<std::vector<int32_t>>& batch, int64_t max_new,
                                   std::vector<infer::Sampler>& samplers, const std::vector<int32_t>& stop_ids,
                                   const infer::StopCheck& stop_check, infer::DecodeTiming* timing) {
                                 return cuda::generate_tokens(gpu, batch, max_new, samplers, stop_ids, stop_check,
                                                              timing);
                               });
#else
    fail("generate --device cuda: this build has no CUDA backend");
#endif
  } else {
    QV_CHECK(a.device == "cpu", "generate --device {}: expected cpu or cuda", a.device);
    out = infer::generate_text(*model, *tokenizer, prompts, o);
  }
  const infer::GenerationStats& s = out.stats;

  if (a.json) {
    nlohmann::ordered_json j;
    j["checkpoint"] = path;
    j["tokenizer"] = tokenizer_path;
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (const infer::Completion& c : out.completions) {
      nlohmann::ordered_json e;
      e["prompt"] = c.prompt;
      e["completion"] = c.text;
      e["prompt_tokens"] = c.prompt_tokens.size();
      e["new_tokens"] = c.tokens.size();
      e["stop"] = infer::stop_reason_name(c.reason);
      list.push_back(e);
    }
    j["completions"] = list;
    j["prompt_tokens"] = s.prompt_tokens;
    j["new_tokens"] = s.new_tokens;
    j["prompt_tokens_per_s"] = s.prompt_tokens_per_s();
    j["new_tokens_per_s"] = s.new_tokens_per_s();
    j["time_s"] = {{"tokenize", s.tokenize_s},       {"prefill", s.decode.prefill_s},
                   {"decode", s.decode.decode_s},    {"sample", s.decode.sample_s},
                   {"stop_check", s.decode.stop_check_s}, {"detokenize", s.detokenize_s}};
    fmt::print("{}\n", j.dump(2));
    return;
  }
  for (size_t i = 0; i < out.completions.size(); ++i) {
    const infer::Completion& c = out.completions[i];
    fmt::print("--- completion {} ({} prompt tokens, {} new, stop: {})\n{}{}\n", i + 1, c.prompt_tokens.size(),
               c.tokens.size(), infer::stop_reason_name(c.reason), c.prompt, c.text);
  }
  fmt::print(
      "--- throughput: prompt {} tokens at {:.1f} tok/s (tokenize + prefill), generated {} tokens at {:.1f} tok/s "
      "(decode + sampling + detokenize)\n",
      s.prompt_tokens, s.prompt_tokens_per_s(), s.new_tokens, s.new_tokens_per_s());
}

}  // namespace

void register_generate(CLI::App& app) {
  auto a = std::make_shared<GenerateArgs>();
  infer::SamplerOptions& s = a->options.sampling;
  // The algebra paper's generation protocol as the default sampling.
  s.temperature = 0.8;
  s.top_k = 50;
  s.top_p = 0.95;
  CLI::App* cmd = app.add_subcommand(
      "generate",
      "Complete prompts with a checkpoint, decoding with caches (KV, Relation Cache, linear state).\n"
      "Prompts with equal token counts run as one batch; others one group at a time. Each prompt i\n"
      "samples with seed + i. Prints each completion, then prompt and generated tokens per second.");
  cmd->add_option("--ckpt", a->checkpoint, "checkpoint .safetensors (or a run folder)")->required();
  cmd->add_option("--prompt", a->prompts, "prompt text (repeatable)");
  cmd->add_option("--prompts", a->prompts_file, "file with one prompt per line (\\n for a newline)");
  cmd->add_option("--tokenizer", a->tokenizer, "tokenizer path (default: the checkpoint's quiver.tokenizer)");
  cmd->add_option("--max-new-tokens", a->options.max_new_tokens,
                  "new tokens per prompt (default: min(256, context − prompt length))");
  cmd->add_option("--temperature", s.temperature, "sampling temperature (0 = greedy)")->capture_default_str();
  cmd->add_option("--top-k", s.top_k, "keep the k most likely tokens (0 = all)")->capture_default_str();
  cmd->add_option("--top-p", s.top_p, "nucleus: keep the most likely tokens up to this mass")->capture_default_str();
  cmd->add_option("--seed", s.seed, "sampling seed")->capture_default_str();
  cmd->add_flag("--greedy", a->greedy, "argmax decoding");
  cmd->add_option("--stop", a->options.stop_strings, "stop when the completion contains this text (repeatable)");
  cmd->add_option("--stop-id", a->options.stop_ids, "stop at this token id (repeatable)");
  cmd->add_flag("--ignore-eot", a->ignore_eot, "do not stop at the tokenizer's end-of-text token");
  cmd->add_option("--device", a->device, "cpu, or cuda (bf16, CUDA-graph decoding, sampling on the GPU)")
      ->capture_default_str();
  cmd->add_option("--threads", a->threads, "CPU threads");
  cmd->add_flag("--json", a->json, "print JSON");
  cmd->callback([a] { run(*a); });
}

}  // namespace quiver::cli
