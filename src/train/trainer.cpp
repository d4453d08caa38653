#include "train/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/blas.h"
#include "core/progress.h"
#include "quiver/error.h"
#include "quiver/parallel.h"
#include "quiver/safetensors.h"
#include "train/checkpoint.h"
#include "train/distributed.h"
#include "train/plot.h"
#include "train/shards.h"

namespace quiver::train {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using ojson = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

constexpr const char* kOptimizerFormat = "quiver-optimizer-1";
constexpr const char* kModelFile = "model.safetensors";
constexpr const char* kOptimizerFile = "optimizer.safetensors";
// The model file of the last complete pair while a new pair is being written (a hard link).
constexpr const char* kPreviousModelFile = "model.prev.safetensors";
constexpr const char* kMetricsFile = "metrics.jsonl";
constexpr const char* kRunFile = "run.json";
constexpr const char* kPlotFile = "loss.svg";

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// SIGINT / SIGTERM ask the loop to stop after the current step and write a checkpoint; a
// second signal gets the default action (the handler restores it).
volatile std::sig_atomic_t g_stop_signal = 0;
extern "C" void on_stop_signal(int sig) {
  g_stop_signal = sig;
  std::signal(sig, SIG_DFL);
}
class StopSignals {
 public:
  StopSignals() {
    g_stop_signal = 0;
    old_int_ = std::signal(SIGINT, on_stop_signal);
    old_term_ = std::signal(SIGTERM, on_stop_signal);
  }
  ~StopSignals() {
    std::signal(SIGINT, old_int_);
    std::signal(SIGTERM, old_term_);
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  void (*old_int_)(int);
  void (*old_term_)(int);
};

// The live line on stderr: redrawn in place on a terminal (at most 10 times a second), plain
// lines at most every 5 seconds otherwise, as quiver::Progress does.
class StatusLine {
 public:
  explicit StatusLine(bool enabled) : enabled_(enabled), terminal_(::isatty(::fileno(stderr)) == 1) {}
  ~StatusLine() { finish(); }
  void show(const std::string& text, bool important) {
    if (!enabled_) return;
    const double since = seconds_since(last_);
    if (terminal_) {
      if (!important && drawn_ && since < 0.1) return;
      std::fprintf(stderr, "\r\033[K%s", text.c_str());
    } else {
      if (!important && drawn_ && since < 5.0) return;
      std::fprintf(stderr, "%s\n", text.c_str());
    }
    std::fflush(stderr);
    drawn_ = true;
    last_ = Clock::now();
  }
  void finish() {
    if (enabled_ && terminal_ && drawn_) std::fputc('\n', stderr);
    drawn_ = false;
  }

 private:
  bool enabled_, terminal_;
  bool drawn_ = false;
  Clock::time_point last_ = Clock::now();
};

// The options that define a run, after defaults are filled in.
struct Resolved {
  int64_t micro_batch = 0, seq_len = 0, accum = 0, steps = 0, warmup = 0, eval_every = 0,
          checkpoint_every = 0;
  double lr = 0, final_lr_frac = 0, clip = 0;
  AdamWOptions adamw;
  uint64_t seed = 0;
  std::string data_dir;

  int64_t tokens_per_step() const { return micro_batch * seq_len * accum; }

  ojson to_json() const {
    ojson j;
    j["micro_batch"] = micro_batch;
    j["seq_len"] = seq_len;
    j["accum"] = accum;
    j["tokens_per_step"] = tokens_per_step();
    j["steps"] = steps;
    j["lr"] = lr;
    j["warmup"] = warmup;
    j["final_lr_frac"] = final_lr_frac;
    j["beta1"] = adamw.beta1;
    j["beta2"] = adamw.beta2;
    j["eps"] = adamw.eps;
    j["weight_decay"] = adamw.weight_decay;
    j["clip"] = clip;
    j["eval_every"] = eval_every;
    j["checkpoint_every"] = checkpoint_every;
    j["seed"] = seed;
    j["data"] = data_dir;
    return j;
  }

  static Resolved from_json(const json& j, const std::string& where) {
    Resolved r;
    auto get = [&](const char* key, auto& out) {
      if (!j.contains(key)) fail("{}: the recorded options lack '{}'", where, key);
      try {
        j.at(key).get_to(out);
      } catch (const json::exception& e) {
        fail("{}: recorded option '{}' is malformed ({})", where, key, e.what());
      }
    };
    get("micro_batch", r.micro_batch);
    get("seq_len", r.seq_len);
    get("accum", r.accum);
    get("steps", r.steps);
    get("lr", r.lr);
    get("warmup", r.warmup);
    get("final_lr_frac", r.final_lr_frac);
    get("beta1", r.adamw.beta1);
    get("beta2", r.adamw.beta2);
    get("eps", r.adamw.eps);
    get("weight_decay", r.adamw.weight_decay);
    get("clip", r.clip);
    get("eval_every", r.eval_every);
    get("checkpoint_every", r.checkpoint_every);
    get("seed", r.seed);
    get("data", r.data_dir);
    return r;
  }
};

// What a checkpoint pair carries besides the parameters.
struct RunState {
  int64_t step = 0;
  int64_t adam_steps = 0;
  int64_t cursor = 0;
  int64_t tokens = 0;
  double elapsed_s = 0;
  double best_val_loss = std::numeric_limits<double>::quiet_NaN();
};

int64_t parse_int(const std::map<std::string, std::string>& meta, const char* key, const std::string& where) {
  auto it = meta.find(key);
  if (it == meta.end()) fail("{}: metadata has no '{}' entry", where, key);
  try {
    size_t used = 0;
    const long long v = std::stoll(it->second, &used);
    if (used == it->second.size()) return v;
  } catch (const std::exception&) {
  }
  fail("{}: metadata '{}' = '{}' is not an integer", where, key, it->second);
}

double parse_double(const std::map<std::string, std::string>& meta, const char* key, const std::string& where) {
  auto it = meta.find(key);
  if (it == meta.end()) fail("{}: metadata has no '{}' entry", where, key);
  if (it->second == "nan") return std::numeric_limits<double>::quiet_NaN();
  try {
    size_t used = 0;
    const double v = std::stod(it->second, &used);
    if (used == it->second.size()) return v;
  } catch (const std::exception&) {
  }
  fail("{}: metadata '{}' = '{}' is not a number", where, key, it->second);
}

// "{}" formats a double with the shortest text that reads back to the same value.
std::string exact(double v) { return std::isnan(v) ? "nan" : fmt::format("{}", v); }

std::vector<ParamSegment> segments_of(const model::Model& m) {
  std::vector<ParamSegment> out;
  for (const model::ParamInfo& p : m.param_table())
    out.push_back({p.offset, p.numel, p.decay, p.trainable});
  return out;
}

// One metrics line as text, split off so that resume can keep the lines it wants verbatim.
struct MetricsLine {
  std::string text;
  json value;
};

std::vector<MetricsLine> read_metrics_lines(const std::string& path, bool tolerate_torn_tail) {
  std::vector<MetricsLine> out;
  std::ifstream in(path);
  if (!in) return out;
  std::string line;
  int64_t number = 0;
  std::vector<std::string> lines;
  while (std::getline(in, line)) lines.push_back(line);
  for (size_t i = 0; i < lines.size(); ++i) {
    ++number;
    if (lines[i].empty()) continue;
    try {
      json v = json::parse(lines[i]);
      if (!v.is_object() || !v.contains("step") || !v["step"].is_number_integer())
        fail("{} line {}: expected a JSON object with an integer \"step\"", path, number);
      out.push_back({lines[i], std::move(v)});
    } catch (const json::exception& e) {
      // A crash while appending leaves a partial last line; resume drops it.
      if (tolerate_torn_tail && i + 1 == lines.size()) break;
      fail("{} line {}: not valid JSON ({})", path, number, e.what());
    }
  }
  return out;
}

// Train loss (every step, bucket-averaged when long) and val loss against tokens.
void write_loss_plot(const std::string& path, const std::vector<MetricsLine>& metrics, const std::string& title) {
  PlotSeries train{"train loss", {}, {}, false}, val{"val loss", {}, {}, true};
  std::vector<std::pair<double, double>> points;
  for (const MetricsLine& m : metrics) {
    const json& v = m.value;
    if (!v.contains("tokens") || !v["tokens"].is_number()) continue;
    const double tokens = v["tokens"].get<double>();
    if (v.contains("loss") && v["loss"].is_number()) points.emplace_back(tokens, v["loss"].get<double>());
    if (v.contains("val_loss") && v["val_loss"].is_number()) {
      val.x.push_back(tokens);
      val.y.push_back(v["val_loss"].get<double>());
    }
  }
  constexpr size_t kMaxPoints = 1000;
  const size_t per_bucket = (points.size() + kMaxPoints - 1) / std::max<size_t>(kMaxPoints, 1);
  for (size_t i = 0; i < points.size(); i += std::max<size_t>(per_bucket, 1)) {
    const size_t end = std::min(points.size(), i + std::max<size_t>(per_bucket, 1));
    double x = 0, y = 0;
    for (size_t k = i; k < end; ++k) {
      x += points[k].first;
      y += points[k].second;
    }
    train.x.push_back(x / static_cast<double>(end - i));
    train.y.push_back(y / static_cast<double>(end - i));
  }
  PlotOptions options;
  options.title = title;
  options.x_label = "tokens";
  options.y_label = "loss (NLL per token, nats)";
  write_text_atomic(path, render_svg({train, val}, options));
}

// Appends lines to metrics.jsonl, flushing each so that a crash loses at most a partial line.
class MetricsWriter {
 public:
  explicit MetricsWriter(std::string path) : path_(std::move(path)) {
    f_ = std::fopen(path_.c_str(), "ab");
    if (!f_) fail("cannot open '{}' for appending: {}", path_, std::strerror(errno));
  }
  ~MetricsWriter() {
    if (f_) std::fclose(f_);
  }
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;
  void append(const std::string& line) {
    if (std::fputs(line.c_str(), f_) < 0 || std::fputc('\n', f_) == EOF || std::fflush(f_) != 0)
      fail("writing '{}' failed: {}", path_, std::strerror(errno));
  }

 private:
  std::string path_;
  std::FILE* f_ = nullptr;
};

std::string join_path(const std::string& dir, const char* name) { return (fs::path(dir) / name).string(); }

}  // namespace

TokenSplit TokenSplit::load(const std::string& dir, const std::string& split, int64_t vocab_size) {
  std::vector<uint16_t> all;
  for (const std::string& shard : list_shards(dir, split)) {
    std::vector<uint16_t> tokens = read_shard(shard);
    for (size_t i = 0; i < tokens.size(); ++i)
      if (tokens[i] >= vocab_size)
        fail("token shard {} holds id {} at position {}, outside the model's vocabulary of {} tokens", shard,
             tokens[i], i, vocab_size);
    all.insert(all.end(), tokens.begin(), tokens.end());
  }
  return TokenSplit(std::move(all));
}

BatchLoader::BatchLoader(const TokenSplit& split, int64_t B, int64_t T, int64_t cursor)
    : split_(&split), B_(B), T_(T), cursor_(cursor) {
  QV_CHECK(B >= 1 && T >= 1, "batch loader: B = {} and T = {} must be ≥ 1", B, T);
  QV_CHECK(split.size() >= T + 1, "the split holds {} tokens, fewer than one window of T + 1 = {}", split.size(),
           T + 1);
  QV_CHECK(cursor >= 0 && cursor < split.size(), "data cursor {} lies outside the split's {} tokens", cursor,
           split.size());
}

void BatchLoader::next(int32_t* tokens, int32_t* targets) {
  const uint16_t* data = split_->data();
  for (int64_t b = 0; b < B_; ++b) {
    if (cursor_ + T_ + 1 > split_->size()) cursor_ = 0;
    const uint16_t* w = data + cursor_;
    for (int64_t t = 0; t < T_; ++t) {
      tokens[b * T_ + t] = w[t];
      targets[b * T_ + t] = w[t + 1];
    }
    cursor_ += T_;
  }
}

namespace {

template <class LossFn>
double evaluate_with(LossFn&& forward_loss, const TokenSplit& split, int64_t B, int64_t T) {
  const int64_t n = split.size();
  QV_CHECK(n >= 2, "the validation split holds {} token(s); evaluation needs at least 2", n);
  const int64_t predicted = n - 1;
  const int64_t full_windows = predicted / T;
  const int64_t rest = predicted % T;
  const uint16_t* data = split.data();
  std::vector<int32_t> tokens(static_cast<size_t>(B * T)), targets(static_cast<size_t>(B * T));
  double nll = 0;
  auto run = [&](int64_t first_window, int64_t rows, int64_t length, int64_t stride) {
    for (int64_t b = 0; b < rows; ++b) {
      const uint16_t* w = data + (first_window + b) * stride;
      for (int64_t t = 0; t < length; ++t) {
        tokens[b * length + t] = w[t];
        targets[b * length + t] = w[t + 1];
      }
    }
    nll += forward_loss(tokens.data(), targets.data(), rows, length) * static_cast<double>(rows * length);
  };
  for (int64_t w = 0; w < full_windows; w += B) run(w, std::min(B, full_windows - w), T, T);
  if (rest > 0) run(full_windows, 1, rest, T);
  return nll / static_cast<double>(predicted);
}

}  // namespace

double evaluate(model::Model& model, const TokenSplit& split, int64_t B, int64_t T) {
  return evaluate_with([&](const int32_t* x, const int32_t* y, int64_t b, int64_t t) { return model.forward_loss(x, y, b, t); },
                       split, B, T);
}

double evaluate(Engine& engine, const TokenSplit& split, int64_t B, int64_t T) {
  return evaluate_with([&](const int32_t* x, const int32_t* y, int64_t b, int64_t t) { return engine.forward_loss(x, y, b, t); },
                       split, B, T);
}

std::vector<json> read_metrics(const std::string& path) {
  QV_CHECK(fs::exists(path), "metrics file '{}' does not exist", path);
  std::vector<json> out;
  for (MetricsLine& line : read_metrics_lines(path, false)) out.push_back(std::move(line.value));
  return out;
}

// Where a session starts: the model, the resolved options and the state to continue from.
struct RunStart {
  std::unique_ptr<model::Model> model;
  Resolved run;
  RunState state;
  Tensor m, v;                        // AdamW moments (undefined for a new run)
  std::vector<MetricsLine> metrics;   // the lines kept from the resumed run
  std::string out_dir;
  int64_t recorded_train_tokens = -1; // the resumed run's train split size
};

// Loads a run folder's checkpoint pair (falling back to model.prev.safetensors after a save
// that failed between the two files) and checks the given options against the recorded ones.
RunStart resume_run(const TrainOptions& options) {
  std::unique_ptr<model::Model> model;
  Resolved run;
  RunState state;
  Tensor resumed_m, resumed_v;
  std::vector<MetricsLine> metrics;
  std::string out_dir = options.out_dir;
  int64_t recorded_train_tokens = -1;
  const std::string& rdir = options.resume_dir;
  QV_CHECK(fs::is_directory(rdir), "cannot resume: run folder '{}' does not exist", rdir);
  const std::string model_path = join_path(rdir, kModelFile), opt_path = join_path(rdir, kOptimizerFile);
  QV_CHECK(fs::exists(model_path), "cannot resume from '{}': it has no {} (was a checkpoint ever written?)", rdir,
           kModelFile);
  QV_CHECK(fs::exists(opt_path), "cannot resume from '{}': it has no {}; the model alone can generate but not "
           "resume exactly", rdir, kOptimizerFile);
  std::map<std::string, std::string> model_meta;
  model = load_checkpoint(model_path, &model_meta);
  TensorFile opt;
  try {
    opt = read_safetensors(opt_path);
  } catch (const Error& e) {
    fail("cannot resume from '{}': {}", rdir, e.what());
  }
  auto format = opt.metadata.find(kMetaFormat);
  QV_CHECK(format != opt.metadata.end() && format->second == kOptimizerFormat,
           "{}: not a quiver optimizer state (format '{}', expected '{}')", opt_path,
           format == opt.metadata.end() ? "none" : format->second, kOptimizerFormat);
  int64_t model_step = parse_int(model_meta, kMetaStep, model_path);
  state.step = parse_int(opt.metadata, kMetaStep, opt_path);
  if (model_step != state.step) {
    // A save that failed between the two files leaves the previous model beside the new one.
    const std::string previous = join_path(rdir, kPreviousModelFile);
    std::map<std::string, std::string> previous_meta;
    std::unique_ptr<model::Model> previous_model;
    if (fs::exists(previous)) {
      previous_model = load_checkpoint(previous, &previous_meta);
      if (parse_int(previous_meta, kMetaStep, previous) == state.step) {
        fmt::print(stderr,
                   "{} is at step {} but {} is at step {} (a save was interrupted); resuming from {} at step {}\n",
                   kModelFile, model_step, kOptimizerFile, state.step, kPreviousModelFile, state.step);
        model = std::move(previous_model);
        model_step = state.step;
        fs::rename(previous, model_path);  // the folder holds a consistent pair again
      }
    }
  }
  QV_CHECK(model_step == state.step,
           "cannot resume from '{}': {} is at step {} but {} is at step {} (a save was interrupted between the "
           "two files, and no {} at step {} remains); the model file alone can still generate",
           rdir, kModelFile, model_step, kOptimizerFile, state.step, kPreviousModelFile, state.step);
  state.adam_steps = parse_int(opt.metadata, "quiver.adam_steps", opt_path);
  state.cursor = parse_int(opt.metadata, "quiver.data_cursor", opt_path);
  state.tokens = parse_int(opt.metadata, "quiver.tokens", opt_path);
  state.elapsed_s = parse_double(opt.metadata, "quiver.elapsed_s", opt_path);
  state.best_val_loss = parse_double(opt.metadata, "quiver.best_val_loss", opt_path);
  recorded_train_tokens = parse_int(opt.metadata, "quiver.train_tokens", opt_path);
  json recorded;
  try {
    recorded = json::parse(opt.metadata.at("quiver.options"));
  } catch (const std::exception& e) {
    fail("{}: metadata 'quiver.options' is missing or not valid JSON ({})", opt_path, e.what());
  }
  run = Resolved::from_json(recorded, opt_path);
  // The flat buffer's layout: every parameter at a multiple of kParamAlign. A state written
  // before that alignment holds the parameters back to back; it is moved into the layout.
  const int64_t P = model->num_params(), count = model::count_params(model->config());
  auto flat_state = [&](const char* name) {
    const Tensor& t = opt.get(name);
    QV_CHECK(t.dtype() == DType::F32 && (t.shape() == Shape{P} || t.shape() == Shape{count}),
             "{}: tensor '{}' is {} {}, expected F32 [{}] (the model's flat parameter buffer) or [{}] "
             "(its {} parameters back to back)",
             opt_path, name, dtype_name(t.dtype()), shape_str(t.shape()), P, count, count);
    if (t.numel() == P) return t;
    Tensor out = Tensor::zeros({P}, DType::F32);
    int64_t at = 0;
    for (const model::ParamInfo& p : model->param_table()) {
      out.slice(0, p.offset, p.offset + p.numel).copy_from(t.slice(0, at, at + p.numel));
      at += p.numel;
    }
    return out;
  };
  resumed_m = flat_state("adamw.m");
  resumed_v = flat_state("adamw.v");

  if (!options.config.empty()) {
    const model::ModelConfig given = model::load_config(options.config);
    const auto diffs = config_differences(model->config(), given);
    QV_CHECK(diffs.empty(), "--config {} does not match the checkpoint in '{}' (checkpoint vs --config): {}",
             options.config, rdir, fmt::join(diffs, "; "));
  }
  // Options that shape the optimization must stay as recorded.
  const ojson now_given = [&] {
    ojson j;
    j["micro-batch"] = options.micro_batch;
    j["seq-len"] = options.seq_len;
    j["accum"] = options.accum;
    j["lr"] = options.lr;
    j["warmup"] = options.warmup;
    j["final-lr-frac"] = options.final_lr_frac;
    j["beta1"] = options.adamw.beta1;
    j["beta2"] = options.adamw.beta2;
    j["eps"] = options.adamw.eps;
    j["weight-decay"] = options.adamw.weight_decay;
    j["clip"] = options.clip;
    if (options.seed) j["seed"] = *options.seed;
    return j;
  }();
  const ojson recorded_fixed = run.to_json();
  for (const auto& [flag, value] : now_given.items()) {
    if (!options.given.count(flag)) continue;
    std::string key = flag;
    std::replace(key.begin(), key.end(), '-', '_');
    QV_CHECK(recorded_fixed[key] == value,
             "--{} {} differs from the run's recorded {} in '{}'; a resumed run keeps its options (start a new "
             "run to change them)",
             flag, value.dump(), recorded_fixed[key].dump(), rdir);
  }
  if (!options.data_dir.empty()) run.data_dir = fs::absolute(options.data_dir).lexically_normal().string();
  if (out_dir.empty()) out_dir = rdir;
  QV_CHECK((fs::exists(out_dir) && fs::equivalent(out_dir, rdir)) || !fs::exists(join_path(out_dir, kModelFile)),
           "'{}' already holds another run ({} exists); resume into '{}' itself or into an empty --out", out_dir,
           kModelFile, rdir);
  for (MetricsLine& line : read_metrics_lines(join_path(rdir, kMetricsFile), true))
    if (line.value["step"].get<int64_t>() <= state.step) metrics.push_back(std::move(line));
  return RunStart{std::move(model), run, state, resumed_m, resumed_v, std::move(metrics), out_dir,
                  recorded_train_tokens};
}

// A fresh model, initialized from the seed, and the options with their defaults.
RunStart new_run(const TrainOptions& options) {
  QV_CHECK(!options.config.empty(), "no model config: give --config PRESET|FILE (or --resume RUN)");
  QV_CHECK(!options.data_dir.empty(), "no data: give --data DIR (a folder made by `quiver prepare`)");
  QV_CHECK(!options.out_dir.empty(), "no run folder: give --out RUN");
  QV_CHECK(!fs::exists(join_path(options.out_dir, kModelFile)),
           "'{}' already holds a run ({} exists); continue it with --resume {} or choose another --out",
           options.out_dir, kModelFile, options.out_dir);
  RunStart s;
  s.out_dir = options.out_dir;
  const model::ModelConfig cfg = model::load_config(options.config);
  s.model = std::make_unique<model::Model>(cfg, DType::F32);
  Resolved& run = s.run;
  run.seed = options.seed.value_or(cfg.seed);
  s.model->init(run.seed);
  run.data_dir = fs::absolute(options.data_dir).lexically_normal().string();
  run.micro_batch = options.micro_batch;
  run.seq_len = options.seq_len > 0 ? options.seq_len : cfg.context;
  run.accum = options.accum;
  run.lr = options.lr;
  run.final_lr_frac = options.final_lr_frac;
  run.adamw = options.adamw;
  run.clip = options.clip;
  return s;
}

TrainResult run_training(const TrainOptions& options) {
  if (options.threads > 0) {
    set_num_threads(options.threads);
    blas::set_threads(options.threads);
  }
  check_engine_device(options.device);
  const Parallel& parallel = options.parallel;
  // In a data-parallel run every rank trains; only rank 0 writes files and shows progress.
  const bool writer = parallel.rank == 0;
  QV_CHECK(parallel.world == 1 || options.device != "cpu",
           "data-parallel training over {} processes needs --device cuda", parallel.world);
  const bool resuming = !options.resume_dir.empty();
  RunStart start = resuming ? resume_run(options) : new_run(options);
  std::unique_ptr<model::Model>& model = start.model;
  Resolved& run = start.run;
  const RunState& state = start.state;
  std::vector<MetricsLine>& metrics = start.metrics;
  const std::string& out_dir = start.out_dir;
  const model::ModelConfig& cfg = model->config();

  QV_CHECK(run.micro_batch >= 1, "--micro-batch must be ≥ 1, got {}", run.micro_batch);
  QV_CHECK(run.accum >= 1, "--accum must be ≥ 1, got {}", run.accum);
  // --micro-batch is the global micro-batch: each rank takes its rows (an error unless the
  // ranks divide it), so the data order does not depend on the number of GPUs.
  const Range rows = rank_rows(run.micro_batch, parallel.rank, parallel.world);
  QV_CHECK(run.seq_len >= 1 && run.seq_len <= cfg.context, "--seq-len {} must be in [1, context = {}] of '{}'",
           run.seq_len, cfg.context, cfg.name);
  QV_CHECK(run.clip >= 0, "--clip must be ≥ 0 (0 = off), got {}", run.clip);

  // Total steps: given now, or recorded by the resumed run.
  QV_CHECK(!(options.given.count("steps") && options.given.count("tokens")),
           "give either --steps or --tokens, not both");
  if (options.steps > 0) {
    run.steps = options.steps;
  } else if (options.token_budget > 0) {
    run.steps = (options.token_budget + run.tokens_per_step() - 1) / run.tokens_per_step();
  } else if (!resuming) {
    fail("how long to train: give --steps N or --tokens BUDGET");
  }
  QV_CHECK(run.steps >= 1, "--steps must be ≥ 1, got {}", run.steps);
  if (!resuming) run.warmup = options.warmup >= 0 ? options.warmup : std::min<int64_t>(500, run.steps / 10);
  if (!resuming || options.given.count("eval-every"))
    run.eval_every = options.eval_every > 0 ? options.eval_every : std::max<int64_t>(1, run.steps / 10);
  if (!resuming || options.given.count("checkpoint-every"))
    run.checkpoint_every = options.checkpoint_every > 0 ? options.checkpoint_every : run.eval_every;
  const LrSchedule schedule{run.lr, run.warmup, run.steps, run.final_lr_frac};
  schedule.validate();

  // The data.
  const DatasetInfo dataset = read_dataset_info(run.data_dir);
  QV_CHECK(dataset.vocab_size == cfg.vocab_size,
           "vocabulary mismatch: the model '{}' has vocab_size {} but the dataset '{}' was tokenized with a "
           "vocabulary of {} (dataset.json)",
           cfg.name, cfg.vocab_size, run.data_dir, dataset.vocab_size);
  const TokenSplit train_split = TokenSplit::load(run.data_dir, "train", cfg.vocab_size);
  const TokenSplit val_split = TokenSplit::load(run.data_dir, "val", cfg.vocab_size);
  QV_CHECK(start.recorded_train_tokens < 0 || start.recorded_train_tokens == train_split.size(),
           "the data '{}' holds {} train tokens but the run was trained on {}; resume needs the same data",
           run.data_dir, train_split.size(), start.recorded_train_tokens);
  QV_CHECK(train_split.size() >= run.seq_len + 1,
           "the train split of '{}' holds {} tokens, fewer than one window of --seq-len + 1 = {}", run.data_dir,
           train_split.size(), run.seq_len + 1);
  QV_CHECK(val_split.size() >= 2, "the val split of '{}' holds {} token(s); evaluation needs at least 2",
           run.data_dir, val_split.size());
  const std::string tokenizer_path =
      dataset.tokenizer.empty() ? "" : fs::absolute(dataset.tokenizer).lexically_normal().string();

  // The run folder.
  const std::string metrics_path = join_path(out_dir, kMetricsFile);
  std::unique_ptr<MetricsWriter> metrics_out;
  if (writer) {
    fs::create_directories(out_dir);
    std::string kept;
    for (const MetricsLine& line : metrics) kept += line.text + "\n";
    write_text_atomic(metrics_path, kept);
    metrics_out = std::make_unique<MetricsWriter>(metrics_path);
  }

  ojson dataset_json;
  dataset_json["dir"] = run.data_dir;
  dataset_json["tokenizer"] = tokenizer_path;
  dataset_json["vocab_size"] = dataset.vocab_size;
  dataset_json["train_tokens"] = train_split.size();
  dataset_json["val_tokens"] = val_split.size();

  TrainResult result;
  result.total_steps = run.steps;
  std::unique_ptr<Engine> engine;  // made once the optimizer state is in place
  auto write_run_json = [&](const char* status) {
    if (!writer) return;
    ojson j;
    j["format"] = "quiver-run-1";
    j["status"] = status;
    for (const auto& [k, v] : options.run_info.items()) j[k] = v;
    j["device"] = engine ? engine->description() : options.device;
    if (parallel.world > 1) j["data_parallel_ranks"] = parallel.world;
    j["config"] = model::config_to_json(cfg);
    j["num_params"] = model::count_params(cfg);
    j["options"] = run.to_json();
    j["dataset"] = dataset_json;
    ojson s;
    s["step"] = result.step;
    s["total_steps"] = run.steps;
    s["tokens"] = result.tokens;
    s["elapsed_s"] = result.elapsed_s;
    s["last_loss"] = result.last_loss;
    s["last_val_loss"] = result.last_val_loss;
    s["best_val_loss"] = result.best_val_loss;
    s["tokens_per_s"] = result.tokens_per_s;
    ojson t;
    t["data_s"] = result.time.data;
    t["forward_backward_s"] = result.time.forward_backward;
    t["optimizer_s"] = result.time.optimizer;
    t["eval_s"] = result.time.eval;
    t["checkpoint_s"] = result.time.checkpoint;
    s["session_time"] = t;
    j["summary"] = s;
    write_text_atomic(join_path(out_dir, kRunFile), j.dump(2) + "\n");
  };

  // Optimizer and loader state.
  AdamW adam(segments_of(*model), model->num_params(), run.adamw);
  if (resuming) {
    adam.m().copy_from(start.m);
    adam.v().copy_from(start.v);
    adam.set_steps_taken(state.adam_steps);
  }
  engine = make_engine(options.device, *model, adam, parallel);
  BatchLoader loader(train_split, run.micro_batch, run.seq_len, state.cursor);
  result.step = state.step;
  result.tokens = state.tokens;
  result.elapsed_s = state.elapsed_s;
  result.best_val_loss = state.best_val_loss;
  for (const MetricsLine& line : metrics) {
    if (line.value.contains("loss") && line.value["loss"].is_number()) result.last_loss = line.value["loss"].get<double>();
    if (line.value.contains("val_loss") && line.value["val_loss"].is_number())
      result.last_val_loss = line.value["val_loss"].get<double>();
  }
  write_run_json("running");

  int64_t checkpoint_step = resuming ? state.step : -1;
  const Clock::time_point session_start = Clock::now();
  auto elapsed_now = [&] { return state.elapsed_s + seconds_since(session_start); };
  auto save = [&] {
    const Clock::time_point t0 = Clock::now();
    // Every rank takes part (a data-parallel engine gathers its optimizer shards); rank 0 writes.
    engine->sync_to_host();
    const int64_t previous_checkpoint = std::exchange(checkpoint_step, result.step);
    if (!writer) return;
    result.elapsed_s = elapsed_now();
    // Keep the last complete pair's model reachable until the new optimizer file is written, so
    // that a failure in between (a full disk) loses nothing: resume falls back to it.
    const std::string model_path = join_path(out_dir, kModelFile), previous = join_path(out_dir, kPreviousModelFile);
    std::error_code ec;
    fs::remove(previous, ec);
    if (previous_checkpoint >= 0 && fs::exists(model_path)) fs::create_hard_link(model_path, previous, ec);
    save_checkpoint(model_path, *model, {{kMetaStep, std::to_string(result.step)}, {kMetaTokenizer, tokenizer_path}});
    std::map<std::string, std::string> meta = {
        {kMetaFormat, kOptimizerFormat},
        {kMetaStep, std::to_string(result.step)},
        {"quiver.adam_steps", std::to_string(adam.steps_taken())},
        {"quiver.data_cursor", std::to_string(loader.cursor())},
        {"quiver.tokens", std::to_string(result.tokens)},
        {"quiver.elapsed_s", exact(result.elapsed_s)},
        {"quiver.best_val_loss", exact(result.best_val_loss)},
        {"quiver.train_tokens", std::to_string(train_split.size())},
        {"quiver.options", run.to_json().dump()}};
    write_safetensors(join_path(out_dir, kOptimizerFile), {{"adamw.m", adam.m()}, {"adamw.v", adam.v()}}, meta);
    fs::remove(previous, ec);
    write_run_json(result.step >= run.steps ? "finished" : "running");
    result.time.checkpoint += seconds_since(t0);
  };
  const std::string plot_title = fmt::format("{} ({} params)", cfg.name, human_count(double(model::count_params(cfg))));

  StopSignals signals;
  StatusLine status(options.progress && writer);
  const int64_t B = run.micro_batch, T = run.seq_len, A = run.accum;
  std::vector<int32_t> tokens(static_cast<size_t>(B * T)), targets(static_cast<size_t>(B * T));
  const int64_t first_step = state.step;
  double train_time = 0;

  if (first_step >= run.steps && writer)
    fmt::print(stderr, "run '{}' is already at step {} of {}; nothing to do\n", out_dir, first_step, run.steps);

  while (result.step < run.steps) {
    if (engine->any_rank(g_stop_signal != 0)) {  // every rank stops at the same step
      result.interrupted = true;
      break;
    }
    const Clock::time_point step_start = Clock::now();
    engine->zero_grads();
    for (int64_t a = 0; a < A; ++a) {
      Clock::time_point t0 = Clock::now();
      loader.next(tokens.data(), targets.data());
      result.time.data += seconds_since(t0);
      t0 = Clock::now();
      engine->forward_backward(tokens.data() + rows.begin * T, targets.data() + rows.begin * T, rows.size(), T,
                               1.0f / static_cast<float>(A), a + 1 == A);
      result.time.forward_backward += seconds_since(t0);
    }
    // A device engine computes asynchronously: its forward and backward time shows up in the
    // optimizer step, which waits for the device.
    const Clock::time_point t_opt = Clock::now();
    const double lr = schedule.at(result.step);
    const Engine::StepResult step = engine->optimizer_step(lr, run.clip);
    result.time.optimizer += seconds_since(t_opt);
    const double loss = step.loss_sum / static_cast<double>(A);
    const double norm = step.grad_norm;
    if (!std::isfinite(loss))
      fail("the training loss became {} at step {}; stopping without a checkpoint ({}). Lower --lr or check the "
           "data.",
           loss, result.step + 1,
           checkpoint_step >= 0 ? fmt::format("the last one, at step {}, is intact", checkpoint_step)
                                : std::string("none was written yet"));

    ++result.step;
    result.tokens += run.tokens_per_step();
    const double step_s = seconds_since(step_start);
    train_time += step_s;
    result.last_loss = loss;

    ojson line;
    line["step"] = result.step;
    line["loss"] = loss;
    line["lr"] = lr;
    line["grad_norm"] = norm;
    line["tokens"] = result.tokens;
    line["tokens_per_s"] = static_cast<double>(run.tokens_per_step()) / step_s;
    const bool eval_now = result.step % run.eval_every == 0 || result.step == run.steps;
    if (eval_now && writer) {
      const Clock::time_point t0 = Clock::now();
      const double val = evaluate(*engine, val_split, rows.size(), T);  // this rank's batch shape
      result.time.eval += seconds_since(t0);
      line["val_loss"] = val;
      result.last_val_loss = val;
      if (!(result.best_val_loss <= val)) result.best_val_loss = val;
    }
    result.elapsed_s = elapsed_now();
    line["elapsed_s"] = result.elapsed_s;
    const std::string text = line.dump();
    if (writer) metrics_out->append(text);
    metrics.push_back({text, json::parse(text)});

    const bool stop_here = options.stop_at > 0 && result.step >= options.stop_at;
    if (result.step % run.checkpoint_every == 0 || result.step == run.steps || stop_here) save();
    if (eval_now && writer) write_loss_plot(join_path(out_dir, kPlotFile), metrics, plot_title);

    const double rate = static_cast<double>((result.step - first_step) * run.tokens_per_step()) / train_time;
    const double per_step = seconds_since(session_start) / static_cast<double>(result.step - first_step);
    std::string progress = fmt::format("train step {}/{}  loss {:.4f}  lr {:.3g}  {} tok/s  ETA {}", result.step,
                                       run.steps, loss, lr, human_count(rate),
                                       human_duration(per_step * static_cast<double>(run.steps - result.step)));
    if (!std::isnan(result.last_val_loss)) progress += fmt::format("  val {:.4f}", result.last_val_loss);
    status.show(progress, eval_now || result.step == run.steps);
    if (stop_here) {
      result.interrupted = true;
      break;
    }
  }
  status.finish();
  if (result.step != checkpoint_step && result.step > first_step) save();
  if (result.step > first_step && writer) write_loss_plot(join_path(out_dir, kPlotFile), metrics, plot_title);
  result.tokens_per_s =
      train_time > 0 ? static_cast<double>((result.step - first_step) * run.tokens_per_step()) / train_time : 0;
  result.elapsed_s = elapsed_now();
  write_run_json(result.step >= run.steps ? "finished" : "interrupted");
  if (result.interrupted && g_stop_signal != 0 && writer)
    fmt::print(stderr, "interrupted at step {} of {}; checkpoint saved; continue with --resume {}\n", result.step,
               run.steps, out_dir);
  return result;
}

}  // namespace quiver::train
