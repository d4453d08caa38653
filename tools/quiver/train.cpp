// `quiver train`: trains a model on a dataset folder made by `quiver prepare`, or resumes a
// run folder exactly (see src/train/trainer.h for the folder's files).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <thread>

#include "bench_util.h"
#include "commands.h"
#include "core/progress.h"
#include "launch.h"
#include "quiver/parallel.h"
#include "train/distributed.h"
#include "train/trainer.h"

#ifdef QUIVER_HAVE_CUDA
#include "cuda/backend.h"
#include "cuda/train_engine.h"
#endif

namespace quiver::cli {

namespace {

struct TrainArgs {
  train::TrainOptions options;
  uint64_t seed = 0;
  bool quiet = false;
  int gpus = 1;
  int nodes = 1, node_rank = 0;
  std::string rendezvous;
  double bucket_mb = 25;
};

std::string percent(double part, double whole) { return whole > 0 ? fmt::format("{:.0f}%", 100 * part / whole) : "-"; }

void run(TrainArgs& args, CLI::App* cmd) {
  train::TrainOptions& o = args.options;
  for (const CLI::Option* opt : cmd->get_options())
    if (opt->count() > 0) o.given.insert(opt->get_single_name());
  if (o.given.count("seed")) o.seed = args.seed;
  o.progress = !args.quiet;
  QV_CHECK(args.gpus >= 1, "--gpus must be ≥ 1, got {}", args.gpus);
  QV_CHECK(args.nodes >= 1, "--nodes must be ≥ 1, got {}", args.nodes);
  QV_CHECK(args.node_rank >= 0 && args.node_rank < args.nodes, "--node-rank {} is not below --nodes {}",
           args.node_rank, args.nodes);
  QV_CHECK(args.nodes == 1 || !args.rendezvous.empty(),
           "--nodes {} needs --rendezvous ADDRESS:PORT (rank 0's host and a free port)", args.nodes);
  QV_CHECK(args.nodes > 1 || args.rendezvous.empty(), "--rendezvous is for --nodes > 1");
  QV_CHECK(args.bucket_mb > 0 && args.bucket_mb <= 1 << 20, "--bucket-mb must be in (0, 1048576], got {}",
           args.bucket_mb);
  const int world = args.nodes * args.gpus;
  const train::Parallel launched = launched_rank();
  if (launched.world > 0) {  // one rank of `--gpus N [--nodes M]`, started by the launcher below
    QV_CHECK(launched.world == world, "{}={} but --gpus {} × --nodes {} = {}", kWorldEnv, launched.world, args.gpus,
             args.nodes, world);
    o.parallel = launched;
    o.parallel.bucket_bytes = std::max<int64_t>(1, static_cast<int64_t>(args.bucket_mb * (1 << 20)));
  } else if (world > 1) {
    QV_CHECK(o.device == "cuda", "--gpus {} needs --device cuda", args.gpus);
    QV_CHECK(o.micro_batch % world == 0,
             "--micro-batch {} (the global micro-batch) must be divisible by the {} ranks (--gpus {} × --nodes {})",
             o.micro_batch, world, args.gpus, args.nodes);
    const std::string tcp = args.nodes > 1 ? "tcp://" + args.rendezvous : std::string();
    if (!tcp.empty()) train::parse_rendezvous(tcp);  // a malformed address fails before any rank starts
#ifdef QUIVER_HAVE_CUDA
    const int visible = cuda::device_count();
    QV_CHECK(visible >= args.gpus, "--gpus {}: {} CUDA device(s) visible", args.gpus, visible);
#endif
    run_ranks(args.gpus, args.nodes, args.node_rank, tcp);
    return;
  }
#ifdef QUIVER_HAVE_CUDA
  cuda::register_train_engine();
#endif
  o.run_info["command"] = recorded_command_line();
  o.run_info["machine"] = cpu_description();
  o.run_info["date"] = utc_date();
  o.run_info["threads"] = o.threads > 0 ? o.threads : num_threads();

  const train::TrainResult r = train::run_training(o);
  if (o.parallel.rank > 0) return;  // rank 0 reports
  const train::TimeBreakdown& t = r.time;
  const double total = t.data + t.forward_backward + t.optimizer + t.eval + t.checkpoint;
  const std::string where = !o.out_dir.empty() ? o.out_dir : o.resume_dir;
  fmt::print("{} at step {}/{}: {} tokens, {} in total\n", r.step >= r.total_steps ? "finished" : "stopped", r.step,
             r.total_steps, human_count(static_cast<double>(r.tokens)), human_duration(r.elapsed_s));
  if (std::isnan(r.last_val_loss))
    fmt::print("train loss {:.4f}, no evaluation yet\n", r.last_loss);
  else
    fmt::print("train loss {:.4f}, val NLL {:.4f} (best {:.4f})\n", r.last_loss, r.last_val_loss, r.best_val_loss);
  if (total > 0)
    fmt::print(
        "this session: {} tok/s of training; time in forward+backward {}, optimizer {}, data {}, evaluation {}, "
        "checkpoints {}\n",
        human_count(r.tokens_per_s), percent(t.forward_backward, total), percent(t.optimizer, total),
        percent(t.data, total), percent(t.eval, total), percent(t.checkpoint, total));
  fmt::print("run folder: {} (metrics.jsonl, loss.svg, model.safetensors)\n", where);
}

}  // namespace

void register_train(CLI::App& app) {
  auto args = std::make_shared<TrainArgs>();
  train::TrainOptions& o = args->options;
  CLI::App* cmd = app.add_subcommand(
      "train",
      "Train a model (AdamW, warmup + cosine, clipping, accumulation) on a dataset folder made by\n"
      "`quiver prepare`, writing RUN/metrics.jsonl, RUN/loss.svg, RUN/run.json and checkpoints\n"
      "(RUN/model.safetensors + RUN/optimizer.safetensors). --resume RUN continues a run exactly,\n"
      "up to --steps in total. Ctrl-C stops after the current step and writes a checkpoint.");
  cmd->add_option("--config", o.config, "model preset (configs/NAME.json) or config .json path");
  cmd->add_option("--data", o.data_dir, "dataset folder (dataset.json + train_/val_ shards)");
  cmd->add_option("--out", o.out_dir, "run folder to write (with --resume: default the resumed folder)");
  cmd->add_option("--resume", o.resume_dir, "run folder to continue from its last checkpoint");
  cmd->add_option("--steps", o.steps, "optimizer steps in total (a resumed run continues up to this)");
  cmd->add_option("--tokens", o.token_budget, "token budget instead of --steps: steps = ceil(tokens / (B·T·accum))");
  cmd->add_option("--micro-batch", o.micro_batch, "sequences per micro-batch (B)")->capture_default_str();
  cmd->add_option("--seq-len", o.seq_len, "tokens per sequence (T; default: the model's context)");
  cmd->add_option("--accum", o.accum, "micro-batches accumulated per optimizer step")->capture_default_str();
  cmd->add_option("--lr", o.lr, "peak learning rate")->capture_default_str();
  cmd->add_option("--warmup", o.warmup, "linear warmup steps (default: min(500, steps/10))");
  cmd->add_option("--final-lr-frac", o.final_lr_frac, "cosine decays to this fraction of the peak")
      ->capture_default_str();
  cmd->add_option("--weight-decay", o.adamw.weight_decay, "decoupled weight decay (matrices and embeddings)")
      ->capture_default_str();
  cmd->add_option("--beta1", o.adamw.beta1, "AdamW β1")->capture_default_str();
  cmd->add_option("--beta2", o.adamw.beta2, "AdamW β2")->capture_default_str();
  cmd->add_option("--eps", o.adamw.eps, "AdamW ε")->capture_default_str();
  cmd->add_option("--clip", o.clip, "global gradient-norm clipping (0 = off)")->capture_default_str();
  cmd->add_option("--eval-every", o.eval_every, "evaluate val NLL every N steps (default: steps/10)");
  cmd->add_option("--checkpoint-every", o.checkpoint_every, "checkpoint every N steps (default: --eval-every)");
  cmd->add_option("--stop-at", o.stop_at, "stop after this step with a checkpoint, as if interrupted");
  cmd->add_option("--seed", args->seed, "initialization seed (default: the config's seed)");
  cmd->add_option("--device", o.device, "cpu or cuda (bf16 activations, fp32 master weights on the GPU)")
      ->capture_default_str();
  cmd->add_option("--gpus", args->gpus,
                  "data parallelism: one process per GPU of this host, NCCL between them (--device cuda; "
                  "--micro-batch is the global micro-batch)")
      ->capture_default_str();
  cmd->add_option("--nodes", args->nodes,
                  "hosts in a data-parallel run; start the same command on each with its --node-rank")
      ->capture_default_str();
  cmd->add_option("--node-rank", args->node_rank, "this host's index in [0, --nodes); host 0 writes the run folder")
      ->capture_default_str();
  cmd->add_option("--rendezvous", args->rendezvous,
                  "--nodes > 1: IPv4 ADDRESS:PORT of host 0, where its rank 0 hands out the NCCL id");
  cmd->add_option("--bucket-mb", args->bucket_mb,
                  "data parallelism: gradients are reduced in buckets of at most this many MiB of fp32 while the "
                  "backward runs")
      ->capture_default_str();
  cmd->add_option("--threads", o.threads, "CPU threads (default: QUIVER_NUM_THREADS or all cores)");
  cmd->add_flag("--quiet", args->quiet, "no progress line");
  cmd->callback([args, cmd] { run(*args, cmd); });
}

}  // namespace quiver::cli
