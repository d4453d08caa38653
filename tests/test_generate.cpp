// Sampling and generation: the sampler's distribution against a direct computation and its
// draws against that distribution; greedy generation with caches against generation that
// recomputes the full forward at every step, for each mixer and an algebraic FFN whose row
// types must continue from the prompt; text generation with a tiny GPT-2 BPE tokenizer
// (grouping, stop tokens and strings, seeds) and its errors.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "infer/generator.h"
#include "infer/sampler.h"
#include "model/model.h"
#include "quiver/rng.h"
#include "text/tokenizer.h"
#include "train/checkpoint.h"
#include "train/shards.h"
#include "train/trainer.h"

using namespace quiver;
using namespace quiver::infer;
namespace fs = std::filesystem;

namespace {

// Softmax(logits / temperature), then top-k by logit, then the smallest most-likely set whose
// mass reaches top_p, renormalized: written out directly in double.
std::vector<double> reference_distribution(const std::vector<float>& logits, double temperature, int64_t top_k,
                                           double top_p) {
  const size_t V = logits.size();
  std::vector<size_t> order(V);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return logits[a] > logits[b]; });
  const size_t k = top_k > 0 ? std::min<size_t>(top_k, V) : V;
  std::vector<double> p(V, 0.0);
  double sum = 0;
  for (size_t i = 0; i < k; ++i) sum += p[order[i]] = std::exp((double(logits[order[i]]) - double(logits[order[0]])) / temperature);
  double mass = 0;
  size_t kept = 0;
  for (; kept < k && mass < top_p; ++kept) mass += p[order[kept]] / sum;
  double kept_sum = 0;
  for (size_t i = 0; i < kept; ++i) kept_sum += p[order[i]];
  std::vector<double> out(V, 0.0);
  for (size_t i = 0; i < kept; ++i) out[order[i]] = p[order[i]] / kept_sum;
  return out;
}

std::vector<float> random_logits(size_t V, uint64_t seed, double scale = 2.0) {
  Rng rng(seed);
  std::vector<float> v(V);
  for (float& x : v) x = static_cast<float>(scale * rng.normal());
  return v;
}

model::ModelConfig config(const std::string& pattern, const std::string& law, const std::string& schedule) {
  model::ModelConfig c;
  c.name = "gen-" + pattern;
  c.vocab_size = 37;
  c.context = 32;
  c.d_model = 16;
  c.n_heads = 2;
  c.n_layers = static_cast<int64_t>(pattern.size());
  c.pattern = pattern;
  c.ffn.width = 32;
  c.ffn.law = law;
  c.ffn.schedule = schedule;
  c.init_std = 0.3;  // spread logits: greedy choices far from ties
  c.tied_head = false;
  return c;
}

// Initializes, then perturbs every parameter (norm weights, biases and angles included) so
// that greedy decoding wanders instead of repeating one token.
void randomize(model::Model& m, uint64_t seed) {
  m.init(seed);
  // Noise drawn in parameter order, whatever the gaps of the flat layout.
  Rng rng(seed + 1);
  Tensor noise = Tensor::empty({model::count_params(m.config())}, DType::F64);
  rng.fill_normal(noise, 0.0, 0.3);
  Tensor p = m.params().to(DType::F64);
  double* pp = p.data<double>();
  const double* n = noise.data<double>();
  for (const model::ParamInfo& info : m.param_table())
    for (int64_t i = 0; i < info.numel; ++i) pp[info.offset + i] += *n++;
  m.params().copy_from(p);
}

std::vector<int32_t> random_prompt(int64_t n, int64_t V, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (auto& x : p) x = static_cast<int32_t>(rng.below(V));
  return p;
}

// GPT-2's bytes_to_unicode: printable bytes map to themselves, the rest to 256 + n.
std::string byte_symbol(int b) {
  static std::vector<int> code = [] {
    std::vector<int> c(256, -1);
    int n = 0;
    for (int x = 0; x < 256; ++x) {
      const bool printable = (x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255);
      c[x] = printable ? x : 256 + n++;
    }
    return c;
  }();
  const int cp = code[b];
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

// A byte-level BPE with 256 byte tokens, the merges "t h" and "th e", and <|endoftext|>: 259 ids.
std::string write_tiny_bpe(const fs::path& dir) {
  fs::create_directories(dir);
  nlohmann::ordered_json vocab;
  for (int b = 0; b < 256; ++b) vocab[byte_symbol(b)] = b;
  vocab["th"] = 256;
  vocab["the"] = 257;
  vocab["<|endoftext|>"] = 258;
  std::ofstream(dir / "vocab.json") << vocab.dump();
  std::ofstream(dir / "merges.txt") << "#version: 0.2\nt h\nth e\n";
  return dir.string();
}

class TextGenerate : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / fmt::format("quiver_gen_{}_{}", ::getpid(),
                                                   ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    tokenizer_ = text::load_tokenizer(write_tiny_bpe(dir_ / "bpe"));
    model::ModelConfig c = config("AFL", "Q2xQ2", "interval:8");
    c.vocab_size = tokenizer_->vocab_size();
    c.context = 48;
    model_ = std::make_unique<model::Model>(c, DType::F64);
    randomize(*model_, 9);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  fs::path dir_;
  std::unique_ptr<text::Tokenizer> tokenizer_;
  std::unique_ptr<model::Model> model_;
};

}  // namespace

// ---- sampler ----

TEST(Sampler, DistributionMatchesDirectComputation) {
  struct Case {
    double temperature;
    int64_t top_k;
    double top_p;
  };
  const Case cases[] = {{1.0, 0, 1.0}, {0.7, 0, 1.0}, {1.3, 5, 1.0}, {0.8, 0, 0.6}, {0.8, 50, 0.95}, {1.0, 3, 0.5},
                        {2.0, 1, 1.0}};
  // Small and large vocabularies, sharp and flat logits: nuclei inside and beyond the sampler's
  // first partial sort of 256 tokens.
  for (const auto& [V, scale] : {std::pair<size_t, double>{23, 2.0}, {700, 3.0}, {700, 0.2}}) {
    for (const Case& c : cases) {
      const auto logits = random_logits(V, 17, scale);
      Sampler s(SamplerOptions{.temperature = c.temperature, .top_k = c.top_k, .top_p = c.top_p});
      const auto got = s.distribution(logits.data(), static_cast<int64_t>(V));
      const auto want = reference_distribution(logits, c.temperature, c.top_k, c.top_p);
      double err = 0;
      for (size_t i = 0; i < V; ++i) err = std::max(err, std::abs(got[i] - want[i]));
      EXPECT_LT(err, 1e-12) << "V " << V << " T " << c.temperature << " k " << c.top_k << " p " << c.top_p;
    }
  }
}

TEST(Sampler, DrawsFollowTheDistribution) {
  const auto logits = random_logits(8, 4, 1.0);
  Sampler s(SamplerOptions{.temperature = 0.9, .top_k = 6, .top_p = 0.9, .seed = 123});
  const auto p = s.distribution(logits.data(), 8);
  const int n = 40000;
  std::vector<int> counts(8, 0);
  for (int i = 0; i < n; ++i) ++counts[s.sample(logits.data(), 8)];
  for (int v = 0; v < 8; ++v) {
    const double sigma = std::sqrt(n * p[v] * (1 - p[v]));
    EXPECT_NEAR(counts[v], n * p[v], 5 * sigma + 1e-9) << "id " << v;
    if (p[v] == 0) EXPECT_EQ(counts[v], 0) << "id " << v << " lies outside top-k / top-p";
  }
}

TEST(Sampler, GreedySeedsAndValidation) {
  std::vector<float> logits = {0.1f, 2.0f, -1.0f, 2.0f};
  EXPECT_EQ(Sampler(SamplerOptions{.temperature = 0}).sample(logits.data(), 4), 1);  // lowest id among maxima
  EXPECT_EQ(Sampler(SamplerOptions{.greedy = true}).sample(logits.data(), 4), 1);
  const auto many = random_logits(50, 8, 0.5);
  auto draw = [&](uint64_t seed) {
    Sampler s(SamplerOptions{.seed = seed});
    std::vector<int32_t> out;
    for (int i = 0; i < 32; ++i) out.push_back(s.sample(many.data(), 50));
    return out;
  };
  EXPECT_EQ(draw(5), draw(5));
  EXPECT_NE(draw(5), draw(6));
  EXPECT_THROW(Sampler(SamplerOptions{.temperature = -1}), Error);
  EXPECT_THROW(Sampler(SamplerOptions{.top_p = 0}), Error);
  EXPECT_THROW(Sampler(SamplerOptions{.top_k = -2}), Error);
  std::vector<float> nan_logits = {0.0f, NAN};
  EXPECT_THROW(Sampler(SamplerOptions{}).sample(nan_logits.data(), 2), Error);
}

// ---- greedy with caches = greedy with the full forward ----

TEST(Generate, CachedGreedyEqualsFullRecomputation) {
  std::vector<model::ModelConfig> configs = {config("AA", "Q2xQ2", "interval:4"), config("FF", "Q4", "interval:8"),
                                             config("LL", "Q2", "cyclic"), config("AFL", "Q2xQ2", "interval:4")};
  // Attention with learned positions, LayerNorm, biases and grouped KV heads, dense GELU FFN.
  model::ModelConfig learned = config("AA", "dense", "cyclic");
  learned.positions = "learned";
  learned.norm = "layernorm";
  learned.attn_bias = true;
  learned.n_kv_heads = 1;
  learned.ffn.kind = "gelu";
  learned.ffn.bias = true;
  configs.push_back(learned);
  for (const model::ModelConfig& c : configs) {
    for (DType dtype : {DType::F64, DType::F32}) {
      model::Model m(c, dtype);
      randomize(m, 21);
      const int64_t max_new = 21;
      // Two prompts of 7 tokens as one batch, and a one-token prompt.
      std::vector<std::vector<int32_t>> prompts = {random_prompt(7, c.vocab_size, 1), random_prompt(7, c.vocab_size, 2)};
      std::vector<Sampler> greedy(2, Sampler(SamplerOptions{.greedy = true}));
      const auto batch = generate_tokens(m, prompts, max_new, greedy, {});
      for (size_t b = 0; b < 2; ++b) {
        EXPECT_EQ(batch[b].tokens, generate_greedy_uncached(m, prompts[b], max_new, {}))
            << c.pattern << " " << c.ffn.law << " " << dtype_name(dtype) << " row " << b;
        EXPECT_EQ(batch[b].reason, StopReason::MaxTokens);
        // A varied sequence, so that the comparison says something.
        std::vector<int32_t> distinct = batch[b].tokens;
        std::sort(distinct.begin(), distinct.end());
        EXPECT_GE(std::unique(distinct.begin(), distinct.end()) - distinct.begin(), 4) << c.pattern;
      }
      std::vector<Sampler> one(1, Sampler(SamplerOptions{.greedy = true}));
      const std::vector<int32_t> single = {5};
      EXPECT_EQ(generate_tokens(m, {single}, 30, one, {})[0].tokens, generate_greedy_uncached(m, single, 30, {}))
          << c.pattern << " " << dtype_name(dtype);
    }
  }
}

TEST(Generate, StopTokenEndsARowAndIsKept) {
  model::Model m(config("AFL", "Q2xQ2", "interval:4"), DType::F64);
  randomize(m, 4);
  const auto prompt = random_prompt(6, 37, 3);
  const auto full = generate_greedy_uncached(m, prompt, 20, {});
  const int32_t stop = full[5];
  const auto until = std::find(full.begin(), full.end(), stop);
  const std::vector<int32_t> expected(full.begin(), until + 1);
  std::vector<Sampler> greedy(1, Sampler(SamplerOptions{.greedy = true}));
  const auto got = generate_tokens(m, {prompt}, 20, greedy, {stop});
  EXPECT_EQ(got[0].tokens, expected);
  EXPECT_EQ(got[0].reason, StopReason::StopToken);
  EXPECT_EQ(generate_greedy_uncached(m, prompt, 20, {stop}), expected);
  std::vector<Sampler> s1(1, Sampler(SamplerOptions{.greedy = true}));
  EXPECT_THROW(generate_tokens(m, {prompt}, 27, s1, {}), Error);  // 6 + 27 > context 32
}

// ---- text ----

TEST_F(TextGenerate, GreedyTextMatchesTokensAndGroupsByLength) {
  GenerateOptions o;
  o.sampling.greedy = true;
  o.max_new_tokens = 12;
  o.stop_at_eot = false;
  // "the cat" and "a dog" have different token counts; "the cat" and "the cow" are equal.
  const std::vector<std::string> prompts = {"the cat", "a dog.", "the cow", ""};
  const auto out = generate_text(*model_, *tokenizer_, prompts, o);
  ASSERT_EQ(out.completions.size(), 4u);
  int64_t new_tokens = 0, prompt_tokens = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const Completion& c = out.completions[i];
    const auto expected_prompt =
        prompts[i].empty() ? std::vector<int32_t>{tokenizer_->eot_id()} : tokenizer_->encode(prompts[i]);
    EXPECT_EQ(c.prompt_tokens, expected_prompt);
    EXPECT_EQ(c.tokens, generate_greedy_uncached(*model_, expected_prompt, 12, {})) << i;
    EXPECT_EQ(c.text, tokenizer_->decode(c.tokens));
    new_tokens += static_cast<int64_t>(c.tokens.size());
    prompt_tokens += static_cast<int64_t>(c.prompt_tokens.size());
  }
  EXPECT_EQ(out.stats.new_tokens, new_tokens);
  EXPECT_EQ(out.stats.prompt_tokens, prompt_tokens);
  EXPECT_GT(out.stats.new_tokens_per_s(), 0);
  EXPECT_GT(out.stats.prompt_tokens_per_s(), 0);
}

TEST_F(TextGenerate, StopStringsAndEotEndCompletions) {
  GenerateOptions o;
  o.sampling.greedy = true;
  o.max_new_tokens = 30;
  o.stop_at_eot = false;
  const auto full = generate_text(*model_, *tokenizer_, {"the"}, o).completions[0];
  ASSERT_EQ(full.tokens.size(), 30u);
  // A stop string taken from the middle of the full completion's text.
  const std::string stop = full.text.substr(full.text.size() / 2, 2);
  o.stop_strings = {stop};
  const auto cut = generate_text(*model_, *tokenizer_, {"the"}, o).completions[0];
  EXPECT_EQ(cut.reason, StopReason::StopString);
  EXPECT_EQ(cut.text, full.text.substr(0, full.text.find(stop)));
  // It stopped at the first token whose text completes the stop string.
  EXPECT_NE(tokenizer_->decode(cut.tokens).find(stop), std::string::npos);
  std::vector<int32_t> shorter(cut.tokens.begin(), cut.tokens.end() - 1);
  EXPECT_EQ(tokenizer_->decode(shorter).find(stop), std::string::npos);

  // The end-of-text token, once made a stop id, ends the text without appearing in it.
  o.stop_strings.clear();
  o.stop_ids = {full.tokens[3]};
  const auto eot = generate_text(*model_, *tokenizer_, {"the"}, o).completions[0];
  EXPECT_EQ(eot.reason, StopReason::StopToken);
  const auto until = std::find(full.tokens.begin(), full.tokens.end(), full.tokens[3]);
  EXPECT_EQ(eot.tokens, std::vector<int32_t>(full.tokens.begin(), until + 1));
  EXPECT_EQ(eot.text, tokenizer_->decode(std::vector<int32_t>(full.tokens.begin(), until)));
}

TEST_F(TextGenerate, SampledCompletionsDependOnlyOnSeedAndIndex) {
  GenerateOptions o;
  o.sampling = SamplerOptions{.temperature = 0.9, .top_k = 40, .top_p = 0.95, .seed = 77};
  o.max_new_tokens = 10;
  const auto together = generate_text(*model_, *tokenizer_, {"the cat", "a", "the cow"}, o);
  o.sampling.seed = 79;  // the third prompt's seed: 77 + its index 2
  const auto alone = generate_text(*model_, *tokenizer_, {"the cow"}, o);
  EXPECT_EQ(together.completions[2].tokens, alone.completions[0].tokens);
  o.sampling.seed = 77;
  EXPECT_EQ(generate_text(*model_, *tokenizer_, {"the cat", "a", "the cow"}, o).completions[1].tokens,
            together.completions[1].tokens);
}

TEST_F(TextGenerate, ErrorsNameTheLengthsAndVocabularies) {
  GenerateOptions o;
  o.max_new_tokens = 40;
  const std::string long_prompt = "abcdefghij";  // 10 byte tokens: 10 + 40 > 48
  try {
    generate_text(*model_, *tokenizer_, {"the", long_prompt}, o);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const char* f : {"prompt 2", "10 tokens", "--max-new-tokens 40", "context of 48", "at most 38"})
      EXPECT_NE(msg.find(f), std::string::npos) << f << " not in: " << msg;
  }
  // Without --max-new-tokens the room left in the context is used, up to 256.
  o.max_new_tokens = -1;
  o.sampling.greedy = true;
  o.stop_at_eot = false;
  EXPECT_EQ(generate_text(*model_, *tokenizer_, {long_prompt}, o).completions[0].tokens.size(), 38u);

  model::ModelConfig c = model_->config();
  c.vocab_size = 300;
  model::Model bigger(c);
  try {
    generate_text(bigger, *tokenizer_, {"the"}, o);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("vocabulary mismatch"), std::string::npos) << msg;
    EXPECT_NE(msg.find("259"), std::string::npos) << msg;
    EXPECT_NE(msg.find("300"), std::string::npos) << msg;
  }
}

// ---- the CLI end to end: train, resume, generate, compare ----

namespace {

struct CliResult {
  int status;
  std::string out, err;
};

CliResult run_cli(const fs::path& dir, const std::string& args) {
  const std::string cmd = fmt::format("\"{}\" {} > \"{}\" 2> \"{}\"", QUIVER_CLI_PATH, args,
                                      (dir / "stdout.txt").string(), (dir / "stderr.txt").string());
  CliResult r;
  r.status = std::system(cmd.c_str());
  auto slurp = [](const fs::path& p) {
    std::ifstream f(p);
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  r.out = slurp(dir / "stdout.txt");
  r.err = slurp(dir / "stderr.txt");
  return r;
}

}  // namespace

TEST(TrainCli, TrainResumeGenerateCompare) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("quiver_cli_train_{}", ::getpid());
  fs::remove_all(dir);
  auto tokenizer = text::load_tokenizer(write_tiny_bpe(dir / "bpe"));
  // A small corpus through the tokenizer, documents separated by end-of-text as `quiver prepare` does.
  const fs::path data = dir / "data";
  fs::create_directories(data);
  {
    train::ShardWriter train_shards(data.string(), "train", 1 << 20), val_shards(data.string(), "val", 1 << 20);
    for (int doc = 0; doc < 12; ++doc) {
      auto& w = doc < 10 ? train_shards : val_shards;
      w.append_one(tokenizer->eot_id());
      w.append(tokenizer->encode(fmt::format("the cat {} sat on the mat; then the dog {} ran to the other cat.\n",
                                             doc, doc * 7)));
    }
    train_shards.close();
    val_shards.close();
    train::DatasetInfo info;
    info.tokenizer = (dir / "bpe").string();
    info.tokenizer_kind = "gpt2-bpe";
    info.vocab_size = tokenizer->vocab_size();
    info.eot_id = tokenizer->eot_id();
    info.train_tokens = train_shards.tokens();
    info.val_tokens = val_shards.tokens();
    train::write_dataset_info(data.string(), info);
  }
  model::ModelConfig c = config("AFL", "Q2xQ2", "interval:8");
  c.vocab_size = tokenizer->vocab_size();
  c.context = 16;
  c.init_std = 0.02;
  std::ofstream(dir / "tiny.json") << model::config_to_json(c).dump(2);
  const std::string common = fmt::format("--config \"{}\" --data \"{}\" --steps 6 --micro-batch 2 --eval-every 3 --lr 1e-2 --quiet",
                                         (dir / "tiny.json").string(), data.string());

  CliResult r = run_cli(dir, fmt::format("train {} --out \"{}\" --stop-at 3", common, (dir / "split").string()));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("stopped at step 3/6"), std::string::npos) << r.out;
  r = run_cli(dir, fmt::format("train --resume \"{}\" --quiet", (dir / "split").string()));
  ASSERT_EQ(r.status, 0) << r.err;
  r = run_cli(dir, fmt::format("train {} --out \"{}\"", common, (dir / "whole").string()));
  ASSERT_EQ(r.status, 0) << r.err;
  const auto split = train::read_metrics((dir / "split/metrics.jsonl").string());
  const auto whole = train::read_metrics((dir / "whole/metrics.jsonl").string());
  ASSERT_EQ(split.size(), 6u);
  ASSERT_EQ(whole.size(), 6u);
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(split[i]["loss"].dump(), whole[i]["loss"].dump()) << "step " << i + 1;

  // generate: the CLI's greedy completion is the library's, from the checkpoint's tokenizer reference.
  r = run_cli(dir, fmt::format("generate --ckpt \"{}\" --prompt \"the cat\" --prompt \"a\" --greedy --max-new-tokens 8 "
                               "--ignore-eot --json", (dir / "whole").string()));
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  auto m = train::load_checkpoint((dir / "whole/model.safetensors").string());
  GenerateOptions o;
  o.sampling.greedy = true;
  o.max_new_tokens = 8;
  o.stop_at_eot = false;
  const auto lib = generate_text(*m, *tokenizer, {"the cat", "a"}, o);
  ASSERT_EQ(j["completions"].size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(j["completions"][i]["completion"], lib.completions[i].text);
    EXPECT_EQ(j["completions"][i]["new_tokens"], 8);
  }
  EXPECT_GT(j["new_tokens_per_s"].get<double>(), 0);

  // compare: both runs, the same final val NLL, and the plot.
  r = run_cli(dir, fmt::format("compare \"{}\" \"{}\" --out \"{}\" --json", (dir / "split").string(),
                               (dir / "whole").string(), (dir / "cmp.svg").string()));
  ASSERT_EQ(r.status, 0) << r.err;
  const auto rows = nlohmann::json::parse(r.out);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0]["steps"], 6);
  EXPECT_EQ(rows[0]["final_val_nll"], rows[1]["final_val_nll"]);
  EXPECT_EQ(rows[0]["final_val_nll"].get<double>(), whole.back()["val_loss"].get<double>());
  EXPECT_TRUE(fs::exists(dir / "cmp.svg"));

  // Errors: exit status 1 and a message naming the problem.
  r = run_cli(dir, fmt::format("generate --ckpt \"{}\" --prompt abcdefghijklmnop --max-new-tokens 8",
                               (dir / "whole").string()));
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("quiver: error:"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("context of 16"), std::string::npos) << r.err;
  c.d_model = 24;
  std::ofstream(dir / "wide.json") << model::config_to_json(c).dump(2);
  r = run_cli(dir, fmt::format("train --resume \"{}\" --config \"{}\" --steps 8", (dir / "whole").string(),
                               (dir / "wide.json").string()));
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("d_model: 16 vs 24"), std::string::npos) << r.err;
  std::error_code ec;
  fs::remove_all(dir, ec);
}
