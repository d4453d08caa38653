#include "infer/generator.h"

#include <algorithm>
#include <chrono>
#include <map>

#include "quiver/error.h"
#include "text/tokenizer.h"

namespace quiver::infer {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

bool contains(const std::vector<int32_t>& ids, int32_t id) { return std::find(ids.begin(), ids.end(), id) != ids.end(); }

// The logits as F32 (the model may compute in F64 in tests).
const float* f32_rows(const Tensor& logits, Tensor& scratch) {
  if (logits.dtype() == DType::F32) return logits.data<float>();
  scratch = logits.to(DType::F32);
  return scratch.data<float>();
}

// The earliest occurrence of any stop string in text, or npos.
size_t first_stop(const std::string& text, const std::vector<std::string>& stops) {
  size_t best = std::string::npos;
  for (const std::string& s : stops) {
    if (s.empty()) continue;
    best = std::min(best, text.find(s));
  }
  return best;
}

// The text that the new tokens add after the prompt. Decoding them alone can differ from their
// part of the whole sequence (SentencePiece drops a leading space of the first piece), so the
// whole sequence is decoded and the decoded prompt removed from its front.
std::string completion_text(const text::Tokenizer& tokenizer, const std::vector<int32_t>& prompt,
                            const std::string& prompt_text, const std::vector<int32_t>& tokens) {
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), tokens.begin(), tokens.end());
  std::string full = tokenizer.decode(all);
  if (full.compare(0, prompt_text.size(), prompt_text) == 0) return full.substr(prompt_text.size());
  return tokenizer.decode(tokens);
}

}  // namespace

const char* stop_reason_name(StopReason r) {
  switch (r) {
    case StopReason::MaxTokens: return "max_new_tokens";
    case StopReason::StopToken: return "stop_token";
    case StopReason::StopString: return "stop_string";
  }
  return "?";
}

std::vector<int32_t> flatten_batch(const std::vector<std::vector<int32_t>>& prompts, size_t samplers,
                                   int64_t max_new_tokens, int64_t context) {
  const int64_t B = static_cast<int64_t>(prompts.size());
  QV_CHECK(B >= 1, "generate: no prompts");
  QV_CHECK(static_cast<int64_t>(samplers) == B, "generate: {} samplers for {} prompts", samplers, B);
  const int64_t L = static_cast<int64_t>(prompts[0].size());
  QV_CHECK(L >= 1, "generate: a prompt needs at least one token");
  for (const auto& p : prompts)
    QV_CHECK(static_cast<int64_t>(p.size()) == L, "generate: prompts of one batch must have equal lengths ({} vs {})",
             p.size(), L);
  QV_CHECK(max_new_tokens >= 1, "generate: max_new_tokens must be ≥ 1, got {}", max_new_tokens);
  QV_CHECK(L + max_new_tokens <= context,
           "a prompt of {} tokens plus {} new tokens needs {} positions, more than the model's context of {}", L,
           max_new_tokens, L + max_new_tokens, context);
  std::vector<int32_t> flat;
  flat.reserve(static_cast<size_t>(B * L));
  for (const auto& p : prompts) flat.insert(flat.end(), p.begin(), p.end());
  return flat;
}

std::vector<TokenCompletion> generate_tokens(
    model::Model& model, const std::vector<std::vector<int32_t>>& prompts, int64_t max_new_tokens,
    std::vector<Sampler>& samplers, const std::vector<int32_t>& stop_ids,
    const std::function<bool(size_t, const std::vector<int32_t>&)>& stop_check, DecodeTiming* timing) {
  const std::vector<int32_t> flat = flatten_batch(prompts, samplers.size(), max_new_tokens, model.config().context);
  const int64_t B = static_cast<int64_t>(prompts.size()), L = static_cast<int64_t>(prompts[0].size());
  const int64_t V = model.config().vocab_size;
  DecodeTiming local;
  DecodeTiming& time = timing ? *timing : local;

  // The last new token is never fed back, so the caches need L + max_new − 1 positions.
  auto state = model.new_decode_state(B, L + max_new_tokens - 1);
  Tensor logits, scratch;
  Clock::time_point t0 = Clock::now();
  model.prefill(*state, flat.data(), B, L, logits);
  time.prefill_s += seconds_since(t0);

  std::vector<TokenCompletion> out(static_cast<size_t>(B));
  std::vector<bool> done(static_cast<size_t>(B), false);
  std::vector<int32_t> next(static_cast<size_t>(B), 0);
  int64_t active = B;
  for (int64_t i = 0; i < max_new_tokens && active > 0; ++i) {
    t0 = Clock::now();
    const float* rows = f32_rows(logits, scratch);
    for (int64_t b = 0; b < B; ++b) {
      if (done[b]) continue;
      const int32_t id = samplers[b].sample(rows + b * V, V);
      out[b].tokens.push_back(id);
      next[b] = id;
    }
    time.sample_s += seconds_since(t0);
    for (int64_t b = 0; b < B; ++b) {
      if (done[b]) continue;
      TokenCompletion& c = out[b];
      bool stop = false;
      if (contains(stop_ids, c.tokens.back())) {
        c.reason = StopReason::StopToken;
        stop = true;
      } else if (stop_check) {
        t0 = Clock::now();
        stop = stop_check(static_cast<size_t>(b), c.tokens);
        time.stop_check_s += seconds_since(t0);
        if (stop) c.reason = StopReason::StopString;
      }
      if (!stop && static_cast<int64_t>(c.tokens.size()) == max_new_tokens) {
        c.reason = StopReason::MaxTokens;
        stop = true;
      }
      if (stop) {
        done[b] = true;
        --active;
      }
    }
    if (active == 0) break;
    // Finished rows keep feeding their last token; their logits are ignored.
    t0 = Clock::now();
    model.decode_step(*state, next.data(), logits);
    time.decode_s += seconds_since(t0);
  }
  return out;
}

std::vector<int32_t> generate_greedy_uncached(model::Model& model, const std::vector<int32_t>& prompt,
                                              int64_t max_new_tokens, const std::vector<int32_t>& stop_ids) {
  QV_CHECK(!prompt.empty(), "generate: a prompt needs at least one token");
  const int64_t V = model.config().vocab_size;
  std::vector<int32_t> seq = prompt, out;
  Tensor logits, scratch;
  for (int64_t i = 0; i < max_new_tokens; ++i) {
    const int64_t T = static_cast<int64_t>(seq.size());
    logits = Tensor();
    model.forward_logits(seq.data(), 1, T, logits);
    const int32_t id = argmax(f32_rows(logits, scratch) + (T - 1) * V, V);
    out.push_back(id);
    if (contains(stop_ids, id)) break;
    seq.push_back(id);
  }
  return out;
}

double GenerationStats::prompt_tokens_per_s() const {
  const double s = tokenize_s + decode.prefill_s;
  return s > 0 ? static_cast<double>(prompt_tokens) / s : 0;
}

double GenerationStats::new_tokens_per_s() const {
  const double s = decode.decode_s + decode.sample_s + decode.stop_check_s + detokenize_s;
  return s > 0 ? static_cast<double>(new_tokens) / s : 0;
}

TextGeneration generate_text(model::Model& model, const text::Tokenizer& tokenizer,
                             const std::vector<std::string>& prompts, const GenerateOptions& options) {
  return generate_text(model.config(), tokenizer, prompts, options,
                       [&](const std::vector<std::vector<int32_t>>& batch, int64_t max_new, std::vector<Sampler>& samplers,
                           const std::vector<int32_t>& stop_ids, const StopCheck& stop_check, DecodeTiming* timing) {
                         return generate_tokens(model, batch, max_new, samplers, stop_ids, stop_check, timing);
                       });
}

TextGeneration generate_text(const model::ModelConfig& cfg, const text::Tokenizer& tokenizer,
                             const std::vector<std::string>& prompts, const GenerateOptions& options,
                             const BatchGenerator& generate_batch) {
  QV_CHECK(tokenizer.vocab_size() == cfg.vocab_size,
           "vocabulary mismatch: the tokenizer '{}' has {} tokens but the model '{}' has vocab_size {}",
           tokenizer.source(), tokenizer.vocab_size(), cfg.name, cfg.vocab_size);
  QV_CHECK(!prompts.empty(), "no prompts to generate from");
  options.sampling.validate();
  TextGeneration result;
  result.completions.resize(prompts.size());

  std::vector<int32_t> stop_ids = options.stop_ids;
  if (options.stop_at_eot && tokenizer.eot_id() >= 0) stop_ids.push_back(tokenizer.eot_id());
  for (int32_t id : stop_ids)
    QV_CHECK(id >= 0 && id < cfg.vocab_size, "stop token id {} lies outside the vocabulary [0, {})", id,
             cfg.vocab_size);

  Clock::time_point t0 = Clock::now();
  std::map<int64_t, std::vector<size_t>> by_length;  // prompts grouped by token count
  for (size_t i = 0; i < prompts.size(); ++i) {
    Completion& c = result.completions[i];
    c.prompt = prompts[i];
    c.prompt_tokens = tokenizer.encode(prompts[i]);
    if (c.prompt_tokens.empty()) {
      QV_CHECK(tokenizer.eot_id() >= 0,
               "prompt {} is empty and the tokenizer has no end-of-text token to start from", i + 1);
      c.prompt_tokens = {tokenizer.eot_id()};
    }
    by_length[static_cast<int64_t>(c.prompt_tokens.size())].push_back(i);
    result.stats.prompt_tokens += static_cast<int64_t>(c.prompt_tokens.size());
  }
  result.stats.tokenize_s = seconds_since(t0);

  // Every prompt is checked before any generation starts.
  for (size_t i = 0; i < prompts.size(); ++i) {
    const int64_t L = static_cast<int64_t>(result.completions[i].prompt_tokens.size());
    if (options.max_new_tokens < 0) {
      QV_CHECK(L < cfg.context,
               "prompt {} has {} tokens, which fills the model's context of {}; no room for new tokens", i + 1, L,
               cfg.context);
    } else {
      QV_CHECK(options.max_new_tokens >= 1, "--max-new-tokens must be ≥ 1, got {}", options.max_new_tokens);
      QV_CHECK(L + options.max_new_tokens <= cfg.context,
               "prompt {} has {} tokens; with --max-new-tokens {} it needs {} positions, more than the model's "
               "context of {} (shorten the prompt or lower --max-new-tokens to at most {})",
               i + 1, L, options.max_new_tokens, L + options.max_new_tokens, cfg.context,
               std::max<int64_t>(0, cfg.context - L));
    }
  }

  for (const auto& [L, members] : by_length) {
    const int64_t max_new =
        options.max_new_tokens >= 0 ? options.max_new_tokens : std::min<int64_t>(256, cfg.context - L);
    std::vector<std::vector<int32_t>> batch;
    std::vector<Sampler> samplers;
    for (size_t i : members) {
      batch.push_back(result.completions[i].prompt_tokens);
      SamplerOptions s = options.sampling;
      s.seed = options.sampling.seed + i;
      samplers.emplace_back(s);
    }
    std::vector<std::string> prompt_texts;
    t0 = Clock::now();
    for (size_t i : members) prompt_texts.push_back(tokenizer.decode(result.completions[i].prompt_tokens));
    result.stats.detokenize_s += seconds_since(t0);
    std::function<bool(size_t, const std::vector<int32_t>&)> stop_check;
    if (!options.stop_strings.empty())
      stop_check = [&](size_t row, const std::vector<int32_t>& tokens) {
        const std::string text =
            completion_text(tokenizer, batch[row], prompt_texts[row], tokens);
        return first_stop(text, options.stop_strings) != std::string::npos;
      };
    auto completions = generate_batch(batch, max_new, samplers, stop_ids, stop_check, &result.stats.decode);
    t0 = Clock::now();
    for (size_t k = 0; k < members.size(); ++k) {
      Completion& c = result.completions[members[k]];
      c.tokens = std::move(completions[k].tokens);
      c.reason = completions[k].reason;
      result.stats.new_tokens += static_cast<int64_t>(c.tokens.size());
      std::vector<int32_t> text_tokens = c.tokens;
      if (c.reason == StopReason::StopToken) text_tokens.pop_back();
      c.text = completion_text(tokenizer, c.prompt_tokens, prompt_texts[k], text_tokens);
      const size_t cut = first_stop(c.text, options.stop_strings);
      if (cut != std::string::npos) c.text.resize(cut);
    }
    result.stats.detokenize_s += seconds_since(t0);
  }
  return result;
}

}  // namespace quiver::infer
