// Text generation with the model's decode caches (KV for attention, the Relation Cache for
// Full Relation, the linear state for Linear Relation): one prefill of the prompt, then one
// decode_step per new token, so positions and algebraic row types continue from the prompt.
//
// Several prompts: prompts whose token counts are equal run together as the rows of one
// batch; groups of different lengths run one after another. Each prompt has its own sampler
// seeded with seed + its index, so a prompt's completion does not depend on the other
// prompts or on how they were grouped.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "infer/sampler.h"
#include "model/model.h"
#include "text/tokenizer.h"

namespace quiver::infer {

// Why a row stopped.
enum class StopReason { MaxTokens, StopToken, StopString };
const char* stop_reason_name(StopReason r);  // "max_new_tokens" | "stop_token" | "stop_string"

struct TokenCompletion {
  std::vector<int32_t> tokens;  // the new tokens; a stop token that ended the row is the last one
  StopReason reason = StopReason::MaxTokens;
};

struct DecodeTiming {
  double prefill_s = 0;     // the prompt through the model (the first new token's logits)
  double decode_s = 0;      // decode steps
  double sample_s = 0;      // sampling
  double stop_check_s = 0;  // the caller's stop check (decoding text for stop strings)
};

// Checks one batch of generate_tokens (B ≥ 1 prompts of one length L ≥ 1, one sampler each,
// max_new_tokens ≥ 1, L + max_new_tokens ≤ context; errors name the numbers) and returns the
// prompts row by row, [B, L].
std::vector<int32_t> flatten_batch(const std::vector<std::vector<int32_t>>& prompts, size_t samplers,
                                   int64_t max_new_tokens, int64_t context);

// One batch: B prompts of equal length L, each row at most max_new_tokens new tokens
// (L + max_new_tokens ≤ the context). samplers[b] draws row b. A row ends at a token in
// stop_ids, or when stop_check(b, its new tokens) returns true, or at max_new_tokens.
std::vector<TokenCompletion> generate_tokens(
    model::Model& model, const std::vector<std::vector<int32_t>>& prompts, int64_t max_new_tokens,
    std::vector<Sampler>& samplers, const std::vector<int32_t>& stop_ids,
    const std::function<bool(size_t row, const std::vector<int32_t>& tokens)>& stop_check = {},
    DecodeTiming* timing = nullptr);

// The reference without caches: greedy decoding that runs forward_logits over the whole
// sequence for every new token. Stops after a token in stop_ids (included) or max_new_tokens.
std::vector<int32_t> generate_greedy_uncached(model::Model& model, const std::vector<int32_t>& prompt,
                                              int64_t max_new_tokens, const std::vector<int32_t>& stop_ids);

struct GenerateOptions {
  int64_t max_new_tokens = -1;  // -1: min(256, context − prompt length)
  SamplerOptions sampling;
  bool stop_at_eot = true;                 // the tokenizer's end-of-text id ends a completion
  std::vector<int32_t> stop_ids;           // more ids that end a completion
  std::vector<std::string> stop_strings;   // text that ends a completion (the text is cut before it)
};

struct Completion {
  std::string prompt;
  std::vector<int32_t> prompt_tokens;
  std::vector<int32_t> tokens;  // new tokens, a final stop token included
  std::string text;             // the completion's text, without a stop token or stop string
  StopReason reason = StopReason::MaxTokens;
};

struct GenerationStats {
  int64_t prompt_tokens = 0, new_tokens = 0;
  double tokenize_s = 0, detokenize_s = 0;
  DecodeTiming decode;
  // Prompt tokens per second of tokenization + prefill; new tokens per second of decode steps,
  // sampling and detokenization (stop checks and the final text).
  double prompt_tokens_per_s() const;
  double new_tokens_per_s() const;
};

struct TextGeneration {
  std::vector<Completion> completions;  // in the order of the prompts
  GenerationStats stats;
};

// Tokenizes, generates and detokenizes. An empty prompt starts from the end-of-text token
// (GPT-2's convention) or is an error when the tokenizer has none. Errors: a prompt that does
// not leave room for the new tokens in the context (naming the lengths), a tokenizer whose
// vocabulary differs from the model's.
TextGeneration generate_text(model::Model& model, const text::Tokenizer& tokenizer,
                             const std::vector<std::string>& prompts, const GenerateOptions& options);

// The same with another decoder (the GPU's, cuda/generate.h): generate_batch runs one batch of
// equal-length prompts as generate_tokens does.
using StopCheck = std::function<bool(size_t row, const std::vector<int32_t>& tokens)>;
using BatchGenerator = std::function<std::vector<TokenCompletion>(
    const std::vector<std::vector<int32_t>>& prompts, int64_t max_new_tokens, std::vector<Sampler>& samplers,
    const std::vector<int32_t>& stop_ids, const StopCheck& stop_check, DecodeTiming* timing)>;
TextGeneration generate_text(const model::ModelConfig& cfg, const text::Tokenizer& tokenizer,
                             const std::vector<std::string>& prompts, const GenerateOptions& options,
                             const BatchGenerator& generate_batch);

}  // namespace quiver::infer
