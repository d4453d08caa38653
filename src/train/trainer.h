// Training: the data loader, the optimizer loop with gradient accumulation and clipping,
// validation over the whole val split, metrics, checkpoints and exact resume.
//
// A run folder RUN/ holds:
//   model.safetensors      the model checkpoint (checkpoint.h), written atomically
//   optimizer.safetensors  AdamW's m and v, and in its metadata the step, the data cursor, the
//                          tokens seen, the elapsed time and the run's options; written
//                          atomically AFTER the model file and carrying the same step, so that
//                          a pair torn by a crash between the two writes is detected on resume;
//                          while a pair is written, model.prev.safetensors (a hard link) keeps the
//                          last complete pair's model, and resume falls back to it
//   metrics.jsonl          one JSON object per optimizer step: step, loss, lr, grad_norm,
//                          tokens (seen so far), tokens_per_s, elapsed_s, and val_loss on eval
//                          steps; appended and flushed each step
//   run.json               the resolved options, the model config, the dataset and a summary
//   loss.svg               train and val loss against tokens, redrawn at each eval and at the end
//
// Exact resume: training has no randomness after initialization (sequential data, no dropout),
// so the state is the parameters, m, v, the AdamW step count and the data cursor. On the CPU a
// resumed run's losses and parameters equal an uninterrupted run's bit for bit (with the same
// thread count). SIGINT / SIGTERM stop the loop after the current step with a checkpoint.
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/model.h"
#include "train/engine.h"
#include "train/optimizer.h"

namespace quiver::train {

// The tokens of one split, all shards concatenated in name order.
class TokenSplit {
 public:
  TokenSplit() = default;
  explicit TokenSplit(std::vector<uint16_t> tokens) : tokens_(std::move(tokens)) {}
  // Reads DIR's shards of `split` ("train" | "val"); every id must be < vocab_size (the error
  // names the shard, the id and the vocabulary).
  static TokenSplit load(const std::string& dir, const std::string& split, int64_t vocab_size);
  int64_t size() const { return static_cast<int64_t>(tokens_.size()); }
  const uint16_t* data() const { return tokens_.data(); }

 private:
  std::vector<uint16_t> tokens_;
};

// Sequential windows of T+1 tokens (inputs the first T, targets the next T), B per
// micro-batch. A window starts at the cursor, which then moves on by T; when fewer than T+1
// tokens remain after the cursor it wraps to 0 first. The cursor is part of the resume state.
class BatchLoader {
 public:
  BatchLoader(const TokenSplit& split, int64_t B, int64_t T, int64_t cursor = 0);
  void next(int32_t* tokens, int32_t* targets);  // each B·T, row-major
  int64_t cursor() const { return cursor_; }

 private:
  const TokenSplit* split_;
  int64_t B_, T_, cursor_;
};

// Mean NLL per token over the whole split: windows of T+1 tokens at stride T (each token
// after the first is predicted exactly once), B windows per forward, the last window shorter
// when T does not divide size−1. Needs at least 2 tokens.
double evaluate(model::Model& model, const TokenSplit& split, int64_t B, int64_t T);
double evaluate(Engine& engine, const TokenSplit& split, int64_t B, int64_t T);

struct TrainOptions {
  std::string config;       // preset name or .json path; on resume optional, and must then match
  std::string data_dir;     // on resume: defaults to the run's
  std::string out_dir;      // on resume: defaults to the resumed folder
  std::string resume_dir;   // non-empty: continue that run
  int64_t micro_batch = 8;  // B
  int64_t seq_len = 0;      // T; 0: the model's context
  int64_t accum = 1;        // micro-batches per optimizer step
  double lr = 3e-4;         // peak learning rate
  int64_t warmup = -1;      // -1: min(500, N/10)
  double final_lr_frac = 0.1;
  AdamWOptions adamw;
  double clip = 1.0;        // global gradient-norm limit; 0 = off
  int64_t steps = 0;        // N, optimizer steps in total (a resumed run continues up to N)
  int64_t token_budget = 0; // alternative to steps: N = ceil(budget / (B·T·accum))
  int64_t eval_every = 0;   // 0: max(1, N/10); the last step always evaluates
  int64_t checkpoint_every = 0;  // 0: eval_every; the last step always checkpoints
  int64_t stop_at = 0;      // > 0: stop after this step as if interrupted (checkpoint written)
  std::optional<uint64_t> seed;  // initialization seed; default: the config's
  int threads = 0;          // 0: leave the thread count as it is
  std::string device = "cpu";  // "cpu" or "cuda" (train/engine.h); a run may resume on either
  // This process's place in a data-parallel run (train/engine.h; the CLI's --gpus starts the
  // ranks). --micro-batch stays the global micro-batch; rank r trains on its rows of it.
  Parallel parallel;
  bool progress = true;     // the live line on stderr
  // Options the user gave explicitly (their CLI names without dashes: "lr", "micro-batch",
  // ...). On resume these must agree with the run's recorded options.
  std::set<std::string> given;
  // Extra fields for run.json (the CLI records the command line, the machine and the date).
  nlohmann::ordered_json run_info = nlohmann::ordered_json::object();
};

// Where the time went, in seconds.
struct TimeBreakdown {
  double data = 0, forward_backward = 0, optimizer = 0, eval = 0, checkpoint = 0;
};

struct TrainResult {
  int64_t step = 0;            // optimizer steps done in total
  int64_t total_steps = 0;     // N
  int64_t tokens = 0;          // training tokens seen in total
  double elapsed_s = 0;        // wall time over all sessions of the run
  double last_loss = std::numeric_limits<double>::quiet_NaN();
  double last_val_loss = std::numeric_limits<double>::quiet_NaN();
  double best_val_loss = std::numeric_limits<double>::quiet_NaN();
  double tokens_per_s = 0;     // this session's training throughput (forward, backward, optimizer)
  TimeBreakdown time;          // this session
  bool interrupted = false;    // stopped by SIGINT / SIGTERM or stop_at
};

// Runs (or resumes) a training run; see the folder layout above.
TrainResult run_training(const TrainOptions& options);

// The metrics of a run folder, one object per line (bad lines are errors naming the line).
std::vector<nlohmann::json> read_metrics(const std::string& path);

}  // namespace quiver::train
