// Training: the SVG plots, the data loader, validation against per-token NLLs computed from
// the logits, gradient accumulation, exact resume, the run folder and the errors that name
// their problem. Data are tiny generated shards in a temporary folder.
#include <gtest/gtest.h>

#include <sys/resource.h>
#include <unistd.h>

#include <csignal>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include <fmt/format.h>

#include "quiver/rng.h"
#include "quiver/safetensors.h"
#include "testing.h"
#include "train/checkpoint.h"
#include "train/plot.h"
#include "train/shards.h"
#include "train/trainer.h"

using namespace quiver;
using namespace quiver::train;
namespace fs = std::filesystem;

namespace {

constexpr int64_t kVocab = 32;

model::ModelConfig tiny_config() {
  model::ModelConfig c;
  c.name = "trainer-test";
  c.vocab_size = kVocab;
  c.context = 16;
  c.d_model = 16;
  c.n_heads = 2;
  c.n_layers = 3;
  c.pattern = "AFL";
  c.ffn.width = 32;
  c.ffn.law = "Q2xQ2";
  c.ffn.schedule = "interval:8";
  return c;
}

std::vector<int32_t> markov_tokens(int64_t n, uint64_t seed) { return quiver::testing::markov_tokens(n, kVocab, seed); }

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

class TrainerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / fmt::format("quiver_train_{}_{}", ::getpid(), info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    write_dataset(path("data"), kVocab, 1500, 150);
    write_config(path("tiny.json"), tiny_config());
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  static void write_dataset(const std::string& dir, int64_t vocab, int64_t train_tokens, int64_t val_tokens) {
    fs::create_directories(dir);
    ShardWriter train_writer(dir, "train", 700);  // three shards, so windows cross shard boundaries
    train_writer.append(markov_tokens(train_tokens, 1));
    train_writer.close();
    ShardWriter val_writer(dir, "val", 1000);
    val_writer.append(markov_tokens(val_tokens, 2));
    val_writer.close();
    DatasetInfo info;
    info.tokenizer = (fs::path(dir) / "tokenizer.model").string();
    info.tokenizer_kind = "sentencepiece";
    info.vocab_size = vocab;
    info.train_tokens = train_tokens;
    info.val_tokens = val_tokens;
    write_dataset_info(dir, info);
  }
  static void write_config(const std::string& file, const model::ModelConfig& c) {
    std::ofstream(file) << model::config_to_json(c).dump(2);
  }

  TrainOptions options(const std::string& out) const {
    TrainOptions o;
    o.config = path("tiny.json");
    o.data_dir = path("data");
    o.out_dir = path(out);
    o.micro_batch = 2;
    o.seq_len = 16;
    o.accum = 2;
    o.lr = 3e-3;
    o.warmup = 2;
    o.steps = 8;
    o.eval_every = 3;
    o.progress = false;
    return o;
  }

  static void expect_error(const std::function<void()>& fn, std::initializer_list<std::string> fragments) {
    try {
      fn();
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      const std::string msg = e.what();
      for (const std::string& f : fragments) EXPECT_NE(msg.find(f), std::string::npos) << "'" << f << "' not in: " << msg;
    }
  }

  fs::path dir_;
};

std::vector<std::string> loss_texts(const std::string& metrics_path) {
  std::vector<std::string> out;
  for (const auto& line : read_metrics(metrics_path)) out.push_back(line["loss"].dump());
  return out;
}

}  // namespace

// ---- plots ----

TEST(Plot, NiceTicksCoverTheRange) {
  Rng rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const double scale = std::pow(10.0, rng.uniform(-4, 9));
    double lo = rng.uniform(-1, 1) * scale, hi = lo + rng.uniform(0.01, 3) * scale;
    Ticks t = nice_ticks(lo, hi, 6);
    ASSERT_GE(t.values.size(), 3u);
    ASSERT_LE(t.values.size(), 13u);
    EXPECT_LE(t.values.front(), lo * (1 + 1e-12) + 1e-300);
    EXPECT_GE(t.values.back(), hi * (1 - 1e-12) - 1e-300);
    const double mantissa = t.step / std::pow(10.0, std::floor(std::log10(t.step) + 1e-9));
    EXPECT_TRUE(std::abs(mantissa - 1) < 1e-9 || std::abs(mantissa - 2) < 1e-9 || std::abs(mantissa - 5) < 1e-9)
        << t.step;
    for (double v : t.values) EXPECT_NEAR(v / t.step, std::round(v / t.step), 1e-6);
  }
  Ticks flat = nice_ticks(3.0, 3.0);
  EXPECT_LT(flat.values.front(), 3.0);
  EXPECT_GT(flat.values.back(), 3.0);
}

TEST(Plot, TickLabels) {
  EXPECT_EQ(format_tick(1.5e6, 5e5, 3e6), "1.5M");
  EXPECT_EQ(format_tick(5e5, 5e5, 3e6), "0.5M");
  EXPECT_EQ(format_tick(1e6, 5e5, 3e6), "1.0M");
  EXPECT_EQ(format_tick(5000, 5000, 3e4), "5k");
  EXPECT_EQ(format_tick(5000, 1000, 8000), "5000");
  EXPECT_EQ(format_tick(2e9, 1e9, 5e9), "2G");
  EXPECT_EQ(format_tick(0.05, 0.05, 0.3), "0.05");
  EXPECT_EQ(format_tick(3.5, 0.5, 8), "3.5");
  EXPECT_EQ(format_tick(4, 1, 8), "4");
  EXPECT_EQ(format_tick(1e-17, 0.1, 1), "0");
  EXPECT_EQ(format_tick(-0.2, 0.2, 1), "-0.2");
}

TEST(Plot, PointsMapBackToTheirDataThroughTheTicks) {
  PlotSeries a{"train <loss>", {0, 1000, 2000, 3000, 4000}, {5.2, 4.1, 3.3, 3.0, 2.7}, false};
  PlotSeries b{"val", {1000, 2500, NAN, 4000}, {4.5, 3.6, 1.0, 3.1}, true};
  PlotOptions options;
  options.title = "t";
  const std::string svg = render_svg({a, b}, options);

  // Each axis: pixel positions of the ticks against their values give the linear map back.
  auto ticks = [&](const std::string& cls, const char* coord) {
    std::regex re("<g class=\"" + cls + "\"><line x1=\"([0-9.]+)\" y1=\"([0-9.]+)\"[^>]*/><text[^>]*data-value=\"([^\"]+)\"");
    std::vector<std::pair<double, double>> out;  // (pixel, value)
    for (auto it = std::sregex_iterator(svg.begin(), svg.end(), re); it != std::sregex_iterator(); ++it)
      out.emplace_back(std::stod((*it)[std::string(coord) == "x" ? 1 : 2]), std::stod((*it)[3]));
    return out;
  };
  const auto xt = ticks("x-tick", "x"), yt = ticks("y-tick", "y");
  ASSERT_GE(xt.size(), 3u);
  ASSERT_GE(yt.size(), 3u);
  auto unmap = [](const std::vector<std::pair<double, double>>& t, double pixel) {
    const auto& [p0, v0] = t.front();
    const auto& [p1, v1] = t.back();
    return v0 + (pixel - p0) / (p1 - p0) * (v1 - v0);
  };
  // Ticks are evenly spaced in pixels.
  for (size_t i = 1; i + 1 < xt.size(); ++i) EXPECT_NEAR(unmap(xt, xt[i].first), xt[i].second, 0.01 * (xt[1].second - xt[0].second));

  std::regex poly("<polyline class=\"series\" data-label=\"([^\"]*)\"[^>]*points=\"([^\"]*)\"");
  std::vector<std::pair<std::string, std::vector<std::pair<double, double>>>> lines;
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), poly); it != std::sregex_iterator(); ++it) {
    std::vector<std::pair<double, double>> pts;
    std::stringstream ss((*it)[2].str());
    std::string pair;
    while (ss >> pair) {
      const auto comma = pair.find(',');
      pts.emplace_back(unmap(xt, std::stod(pair.substr(0, comma))), unmap(yt, std::stod(pair.substr(comma + 1))));
    }
    lines.emplace_back((*it)[1].str(), pts);
  }
  // Series a is one line; series b is broken in two by its NaN.
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0].first, "train &lt;loss&gt;");
  const double x_tol = 0.02 * (xt.back().second - xt.front().second) / 100;
  const double y_tol = 0.02 * (yt.back().second - yt.front().second) / 100;
  ASSERT_EQ(lines[0].second.size(), 5u);
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_NEAR(lines[0].second[i].first, a.x[i], x_tol);
    EXPECT_NEAR(lines[0].second[i].second, a.y[i], y_tol);
  }
  ASSERT_EQ(lines[1].second.size(), 2u);
  ASSERT_EQ(lines[2].second.size(), 1u);
  EXPECT_NEAR(lines[2].second[0].second, 3.1, y_tol);
  EXPECT_NE(svg.find("class=\"legend\""), std::string::npos);
  EXPECT_NE(svg.find(">val</text>"), std::string::npos);
}

// ---- data ----

TEST(BatchLoader, SequentialWindowsThatWrap) {
  std::vector<uint16_t> tokens(50);
  for (int i = 0; i < 50; ++i) tokens[i] = static_cast<uint16_t>(i);
  TokenSplit split(tokens);
  BatchLoader loader(split, 3, 7);
  std::vector<int32_t> x(21), y(21);
  // Window starts by the rule: advance by T, wrap to 0 when fewer than T+1 tokens remain.
  const int64_t expected_starts[] = {0, 7, 14, 21, 28, 35, 42, 0, 7};
  for (int batch = 0; batch < 3; ++batch) {
    loader.next(x.data(), y.data());
    for (int b = 0; b < 3; ++b)
      for (int t = 0; t < 7; ++t) {
        EXPECT_EQ(x[b * 7 + t], expected_starts[batch * 3 + b] + t);
        EXPECT_EQ(y[b * 7 + t], expected_starts[batch * 3 + b] + t + 1);
      }
  }
  EXPECT_EQ(loader.cursor(), 14);
  EXPECT_THROW(BatchLoader(TokenSplit(std::vector<uint16_t>(7)), 1, 7), Error);
}

TEST(Evaluate, EqualsTheMeanPerTokenNllFromTheLogits) {
  model::Model m(tiny_config());
  m.init(5);
  const auto ids = markov_tokens(38, 3);
  std::vector<uint16_t> tokens(ids.begin(), ids.end());
  const TokenSplit split(tokens);
  const int64_t T = 8;
  // Reference: each target position p ≥ 1 scored once, from the window [T⌊(p−1)/T⌋, ...].
  double nll = 0;
  for (int64_t start = 0; start + 1 < split.size(); start += T) {
    const int64_t len = std::min<int64_t>(T, split.size() - 1 - start);
    std::vector<int32_t> window(ids.begin() + start, ids.begin() + start + len);
    Tensor logits;
    m.forward_logits(window.data(), 1, len, logits);
    for (int64_t t = 0; t < len; ++t) {
      double mx = -INFINITY, sum = 0;
      for (int64_t v = 0; v < kVocab; ++v) mx = std::max(mx, logits.at({0, t, v}));
      for (int64_t v = 0; v < kVocab; ++v) sum += std::exp(logits.at({0, t, v}) - mx);
      nll += mx + std::log(sum) - logits.at({0, t, ids[start + t + 1]});
    }
  }
  nll /= static_cast<double>(split.size() - 1);
  EXPECT_NEAR(evaluate(m, split, 3, T), nll, 1e-5 * nll);
  EXPECT_THROW(evaluate(m, TokenSplit(std::vector<uint16_t>(1)), 1, T), Error);
}

// ---- training ----

TEST_F(TrainerTest, ExactResumeMatchesAnUninterruptedRun) {
  const TrainResult whole = run_training(options("whole"));
  EXPECT_EQ(whole.step, 8);

  TrainOptions first = options("split");
  first.stop_at = 4;
  const TrainResult part = run_training(first);
  EXPECT_EQ(part.step, 4);
  EXPECT_TRUE(part.interrupted);
  // Lines a crashed session logged after its last checkpoint, and a torn last line: resume drops them.
  {
    std::ofstream metrics(path("split/metrics.jsonl"), std::ios::app);
    metrics << "{\"step\": 5, \"loss\": 99.0}\n{\"step\": 6, \"lo";
  }
  TrainOptions second;
  second.resume_dir = path("split");
  second.progress = false;
  const TrainResult resumed = run_training(second);
  EXPECT_EQ(resumed.step, 8);
  EXPECT_EQ(resumed.tokens, whole.tokens);

  const auto a = loss_texts(path("whole/metrics.jsonl")), b = loss_texts(path("split/metrics.jsonl"));
  ASSERT_EQ(a.size(), 8u);
  EXPECT_EQ(a, b);
  const auto metrics = read_metrics(path("split/metrics.jsonl"));
  for (size_t i = 0; i < metrics.size(); ++i) EXPECT_EQ(metrics[i]["step"], i + 1);
  EXPECT_EQ(whole.last_val_loss, resumed.last_val_loss);

  const TensorFile m1 = read_safetensors(path("whole/model.safetensors"));
  const TensorFile m2 = read_safetensors(path("split/model.safetensors"));
  for (const auto& [name, t] : m1.tensors) {
    const Tensor& u = m2.get(name);
    ASSERT_EQ(t.nbytes(), u.nbytes());
    EXPECT_EQ(std::memcmp(t.raw(), u.raw(), t.nbytes()), 0) << name;
  }
  const TensorFile o1 = read_safetensors(path("whole/optimizer.safetensors"));
  const TensorFile o2 = read_safetensors(path("split/optimizer.safetensors"));
  for (const char* name : {"adamw.m", "adamw.v"})
    EXPECT_EQ(std::memcmp(o1.get(name).raw(), o2.get(name).raw(), o1.get(name).nbytes()), 0) << name;
  EXPECT_EQ(o1.metadata.at("quiver.data_cursor"), o2.metadata.at("quiver.data_cursor"));
}

// An optimizer state written before the parameters were aligned in the flat buffer (all
// parameters back to back) resumes as exactly as the aligned one: the tiny model's λ and
// norms leave gaps, so the two layouts differ.
TEST_F(TrainerTest, ResumesAStateWrittenWithoutAlignmentGaps) {
  const TrainResult whole = run_training(options("whole"));
  TrainOptions first = options("split");
  first.stop_at = 4;
  run_training(first);
  {
    const TensorFile opt = read_safetensors(path("split/optimizer.safetensors"));
    const std::vector<model::ParamInfo> table = model::param_table(tiny_config());
    const int64_t count = model::count_params(tiny_config());
    ASSERT_LT(count, opt.get("adamw.m").numel()) << "the test needs alignment gaps";
    std::map<std::string, Tensor> compact;
    for (const char* name : {"adamw.m", "adamw.v"}) {
      Tensor c = Tensor::empty({count}, DType::F32);
      int64_t at = 0;
      for (const model::ParamInfo& p : table) {
        c.slice(0, at, at + p.numel).copy_from(opt.get(name).slice(0, p.offset, p.offset + p.numel));
        at += p.numel;
      }
      compact[name] = c;
    }
    write_safetensors(path("split/optimizer.safetensors"), compact, opt.metadata);
  }
  TrainOptions second;
  second.resume_dir = path("split");
  second.progress = false;
  const TrainResult resumed = run_training(second);
  EXPECT_EQ(resumed.step, 8);
  EXPECT_EQ(loss_texts(path("whole/metrics.jsonl")), loss_texts(path("split/metrics.jsonl")));
  const TensorFile m1 = read_safetensors(path("whole/model.safetensors"));
  const TensorFile m2 = read_safetensors(path("split/model.safetensors"));
  for (const auto& [name, t] : m1.tensors)
    EXPECT_EQ(std::memcmp(t.raw(), m2.get(name).raw(), t.nbytes()), 0) << name;
  EXPECT_EQ(whole.last_val_loss, resumed.last_val_loss);
  // A state of neither length names both.
  {
    const TensorFile opt = read_safetensors(path("split/optimizer.safetensors"));
    std::map<std::string, Tensor> bad{{"adamw.m", Tensor::zeros({3}, DType::F32)}, {"adamw.v", opt.get("adamw.v")}};
    write_safetensors(path("split/optimizer.safetensors"), bad, opt.metadata);
  }
  TrainOptions third;
  third.resume_dir = path("split");
  third.steps = 10;
  third.progress = false;
  expect_error([&] { run_training(third); }, {"adamw.m", "[3]"});
}

TEST_F(TrainerTest, LearnsAndWritesTheRunFolder) {
  TrainOptions o = options("run");
  o.steps = 40;
  o.eval_every = 10;
  o.accum = 1;
  o.micro_batch = 4;
  o.lr = 2e-2;
  const TrainResult r = run_training(o);
  const auto metrics = read_metrics(path("run/metrics.jsonl"));
  ASSERT_EQ(metrics.size(), 40u);
  const double first = metrics.front()["loss"], last = metrics.back()["loss"];
  EXPECT_NEAR(first, std::log(double(kVocab)), 0.3);  // a fresh model is close to uniform
  EXPECT_LT(last, first - 1.0);
  int evals = 0;
  for (const auto& m : metrics) {
    for (const char* key : {"step", "loss", "lr", "grad_norm", "tokens", "tokens_per_s", "elapsed_s"})
      EXPECT_TRUE(m.contains(key)) << key;
    evals += m.contains("val_loss");
  }
  EXPECT_EQ(evals, 4);
  EXPECT_EQ(metrics.back()["tokens"], 40 * 4 * 16);
  EXPECT_DOUBLE_EQ(metrics.back()["lr"].get<double>(), 0.1 * 2e-2);  // cosine ends at the final fraction
  EXPECT_DOUBLE_EQ(metrics.back()["val_loss"].get<double>(), r.last_val_loss);

  const auto run = nlohmann::json::parse(slurp(path("run/run.json")));
  EXPECT_EQ(run["status"], "finished");
  EXPECT_EQ(run["options"]["steps"], 40);
  EXPECT_EQ(run["summary"]["step"], 40);
  EXPECT_EQ(run["config"]["name"], "trainer-test");
  EXPECT_EQ(run["device"], "cpu");
  const std::string svg = slurp(path("run/loss.svg"));
  EXPECT_NE(svg.find("data-label=\"train loss\""), std::string::npos);
  EXPECT_NE(svg.find("data-label=\"val loss\""), std::string::npos);

  std::map<std::string, std::string> meta;
  auto loaded = load_checkpoint(path("run/model.safetensors"), &meta);
  EXPECT_EQ(meta.at(kMetaStep), "40");
  EXPECT_NE(meta.at(kMetaTokenizer).find("tokenizer.model"), std::string::npos);
  EXPECT_TRUE(fs::path(meta.at(kMetaTokenizer)).is_absolute());
  // The saved model reproduces the final val loss.
  const TokenSplit val = TokenSplit::load(path("data"), "val", kVocab);
  EXPECT_DOUBLE_EQ(evaluate(*loaded, val, 4, 16), r.last_val_loss);
}

TEST_F(TrainerTest, AccumulationMatchesOneLargerBatch) {
  TrainOptions accumulated = options("acc");
  accumulated.steps = 3;
  accumulated.micro_batch = 2;
  accumulated.accum = 2;
  TrainOptions single = options("one");
  single.steps = 3;
  single.micro_batch = 4;
  single.accum = 1;
  run_training(accumulated);
  run_training(single);
  const auto a = read_metrics(path("acc/metrics.jsonl")), b = read_metrics(path("one/metrics.jsonl"));
  ASSERT_EQ(a.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_NEAR(a[i]["loss"].get<double>(), b[i]["loss"].get<double>(), 1e-5) << i;
    EXPECT_NEAR(a[i]["grad_norm"].get<double>(), b[i]["grad_norm"].get<double>(),
                1e-4 * b[i]["grad_norm"].get<double>()) << i;
  }
}

TEST_F(TrainerTest, TokenBudgetSetsTheSteps) {
  TrainOptions o = options("budget");
  o.steps = 0;
  o.token_budget = 130;  // 2·16·2 = 64 tokens per step → ceil(130 / 64) = 3 steps
  EXPECT_EQ(run_training(o).step, 3);
}

TEST_F(TrainerTest, ErrorsNameTheProblem) {
  // Vocabulary mismatch: both sizes named.
  write_dataset(path("data40"), 40, 200, 50);
  TrainOptions o = options("vocab");
  o.data_dir = path("data40");
  expect_error([&] { run_training(o); }, {"vocabulary mismatch", "32", "40"});

  // A corrupt shard is named.
  fs::create_directories(path("bad"));
  write_dataset(path("bad"), kVocab, 200, 50);
  const std::string shard = list_shards(path("bad"), "train").front();
  fs::resize_file(shard, fs::file_size(shard) - 3);
  o = options("corrupt");
  o.data_dir = path("bad");
  expect_error([&] { run_training(o); }, {shard});

  // A training device this build does not have: named with the available ones, nothing written.
  o = options("device");
  o.device = "tpu";
  expect_error([&] { run_training(o); }, {"'tpu'", "not available", "cpu"});
  EXPECT_FALSE(fs::exists(path("device")));

  // Neither --steps nor --tokens.
  o = options("nolength");
  o.steps = 0;
  expect_error([&] { run_training(o); }, {"--steps"});

  // A finished run is not overwritten by a new one.
  o = options("run");
  o.steps = 2;
  run_training(o);
  const auto before = fs::last_write_time(path("run/model.safetensors"));
  expect_error([&] { run_training(o); }, {"already holds a run", "--resume"});
  EXPECT_EQ(fs::last_write_time(path("run/model.safetensors")), before);

  // Resume with a config that differs: the field is named.
  model::ModelConfig other = tiny_config();
  other.n_layers = 4;
  other.pattern = "AFLA";
  write_config(path("other.json"), other);
  TrainOptions r;
  r.resume_dir = path("run");
  r.config = path("other.json");
  r.steps = 4;
  r.progress = false;
  expect_error([&] { run_training(r); }, {"does not match the checkpoint", "n_layers: 3 vs 4"});

  // Resume with a changed optimization option.
  r.config.clear();
  r.lr = 1e-2;
  r.given = {"lr"};
  expect_error([&] { run_training(r); }, {"--lr", "0.01", "0.003"});

  // A pair torn between the model and optimizer writes.
  TensorFile opt = read_safetensors(path("run/optimizer.safetensors"));
  opt.metadata[kMetaStep] = "1";
  write_safetensors(path("run/optimizer.safetensors"), opt.tensors, opt.metadata);
  r.lr = 3e-4;
  r.given.clear();
  expect_error([&] { run_training(r); }, {"model.safetensors is at step 2", "optimizer.safetensors is at step 1"});
}

TEST_F(TrainerTest, SaveFailingBetweenTheTwoFilesLosesNothing) {
  run_training(options("whole"));
  TrainOptions first = options("split");
  first.stop_at = 4;
  run_training(first);

  // A file-size limit between the model file (4 bytes per parameter) and the optimizer file
  // (8 per parameter) makes the next save fail after the model file, as a full disk would.
  const int64_t P = model::count_params(tiny_config());
  struct rlimit saved_limit {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &saved_limit), 0);
  auto saved_handler = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = saved_limit;
  small.rlim_cur = static_cast<rlim_t>(6 * P);
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  TrainOptions resume;
  resume.resume_dir = path("split");
  resume.progress = false;
  bool threw = false;
  try {
    run_training(resume);
  } catch (const Error& e) {
    threw = true;
    EXPECT_NE(std::string(e.what()).find("optimizer.safetensors"), std::string::npos) << e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &saved_limit);
  std::signal(SIGXFSZ, saved_handler);
  ASSERT_TRUE(threw);
  std::map<std::string, std::string> meta;
  load_checkpoint(path("split/model.safetensors"), &meta);
  EXPECT_EQ(meta.at(kMetaStep), "6");
  load_checkpoint(path("split/model.prev.safetensors"), &meta);
  EXPECT_EQ(meta.at(kMetaStep), "4");

  // Resume falls back to the complete pair at step 4 and still matches the uninterrupted run.
  run_training(resume);
  EXPECT_EQ(loss_texts(path("split/metrics.jsonl")), loss_texts(path("whole/metrics.jsonl")));
  const TensorFile a = read_safetensors(path("whole/model.safetensors"));
  const TensorFile b = read_safetensors(path("split/model.safetensors"));
  for (const auto& [name, t] : a.tensors)
    EXPECT_EQ(std::memcmp(t.raw(), b.get(name).raw(), t.nbytes()), 0) << name;
  EXPECT_FALSE(fs::exists(path("split/model.prev.safetensors")));
}

namespace {

// A training device that records the token rows each micro-batch hands it (and trains on the
// CPU): what a rank of a data-parallel run is given.
std::vector<std::vector<int32_t>> g_rows_seen;
std::vector<bool> g_last_seen;  // the `last` flag of each micro-batch
int g_syncs = 0;                // sync_to_host calls

class RecordingEngine final : public Engine {
 public:
  RecordingEngine(model::Model& m, AdamW& a) : cpu_(make_cpu_engine(m, a)) {}
  std::string description() const override { return "recorder"; }
  void zero_grads() override { cpu_->zero_grads(); }
  void forward_backward(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T, float scale,
                        bool last) override {
    g_rows_seen.emplace_back(tokens, tokens + B * T);
    g_last_seen.push_back(last);
    cpu_->forward_backward(tokens, targets, B, T, scale, last);
  }
  StepResult optimizer_step(double lr, double clip) override { return cpu_->optimizer_step(lr, clip); }
  double forward_loss(const int32_t* x, const int32_t* y, int64_t B, int64_t T) override {
    return cpu_->forward_loss(x, y, B, T);
  }
  void sync_to_host() override {
    ++g_syncs;
    cpu_->sync_to_host();
  }

 private:
  std::unique_ptr<Engine> cpu_;
};

std::unique_ptr<Engine> make_recorder(model::Model& m, AdamW& a, const Parallel&) {
  return std::make_unique<RecordingEngine>(m, a);
}

}  // namespace

TEST_F(TrainerTest, DataParallelRanksSplitTheGlobalMicroBatchAndOnlyRankZeroWrites) {
  register_engine("recorder", &make_recorder);
  auto run_as = [&](const std::string& out, int rank, int world) {
    TrainOptions o = options(out);
    o.device = "recorder";
    o.micro_batch = 4;  // the global micro-batch
    o.steps = 3;
    o.parallel = {rank, world, ""};
    g_rows_seen.clear();
    g_last_seen.clear();
    g_syncs = 0;
    run_training(o);
    // Only each step's last micro-batch is marked (accum 2), and every rank syncs its state for
    // each checkpoint (a collective for a sharded optimizer), not only the rank that writes.
    EXPECT_EQ(g_last_seen, std::vector<bool>({false, true, false, true, false, true})) << "rank " << rank;
    EXPECT_GE(g_syncs, 1) << "rank " << rank;
    return std::make_pair(g_rows_seen, g_syncs);
  };
  const auto [whole, whole_syncs] = run_as("one", 0, 1);
  const auto [rank0, rank0_syncs] = run_as("r0", 0, 2);
  const auto [rank1, rank1_syncs] = run_as("r1", 1, 2);
  EXPECT_EQ(rank0_syncs, whole_syncs);
  EXPECT_EQ(rank1_syncs, rank0_syncs);
  ASSERT_EQ(whole.size(), 3u * 2u);  // steps × accum micro-batches
  ASSERT_EQ(rank0.size(), whole.size());
  ASSERT_EQ(rank1.size(), whole.size());
  for (size_t i = 0; i < whole.size(); ++i) {
    // Rank r takes rows [2r, 2r + 2) of each global micro-batch of 4 rows.
    std::vector<int32_t> joined = rank0[i];
    joined.insert(joined.end(), rank1[i].begin(), rank1[i].end());
    EXPECT_EQ(joined, whole[i]) << "micro-batch " << i;
  }
  EXPECT_TRUE(fs::exists(path("r0") + "/metrics.jsonl"));
  EXPECT_FALSE(fs::exists(path("r1"))) << "a rank other than 0 wrote files";

  TrainOptions odd = options("odd");
  odd.device = "recorder";
  odd.micro_batch = 3;
  odd.parallel = {0, 2, ""};
  expect_error([&] { run_training(odd); }, {"3", "2"});
  TrainOptions cpu = options("cpu");
  cpu.parallel = {1, 2, ""};
  expect_error([&] { run_training(cpu); }, {"--device cuda"});
  EXPECT_FALSE(fs::exists(path("cpu")));
}
