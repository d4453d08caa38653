// The device-independent parts of data-parallel training (train/distributed.h): ZeRO-1
// shards and the optimizer segments in them, gradient buckets and when the backward completes
// them, the parts of a bucket's reduce-scatter, the optimizer state of a ZeRO-1 run on the CPU
// against whole AdamW across world sizes (what checkpoints and resume rely on), the division of
// the global batch, and both rendezvous.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "model/config.h"
#include "model/model.h"
#include "quiver/error.h"
#include "quiver/rng.h"
#include "testing.h"
#include "train/distributed.h"
#include "train/optimizer.h"
#include "train/trainer.h"

using namespace quiver;
using namespace quiver::train;
using namespace std::chrono_literals;

namespace {

model::ModelConfig hybrid_config() {
  return model::config_from_json(nlohmann::json{{"name", "dist-test"}, {"vocab_size", 50}, {"context", 16},
                                                {"d_model", 16}, {"n_heads", 2}, {"n_layers", 3},
                                                {"pattern", "AFL"}, {"ffn", {{"kind", "swiglu"}, {"width", 32}}}});
}

TEST(Distributed, ShardsCoverTheBufferAlignedAndBalanced) {
  for (int64_t P : {0, 1, 63, 64, 1000, 110631168})
    for (int world : {1, 2, 3, 4, 8}) {
      const std::vector<Range> s = shard_ranges(P, world, 64);
      ASSERT_EQ(static_cast<int>(s.size()), world);
      EXPECT_EQ(s.front().begin, 0);
      EXPECT_EQ(s.back().end, P);
      int64_t smallest = P, largest = 0;
      for (int r = 0; r < world; ++r) {
        if (r > 0) EXPECT_EQ(s[r].begin, s[r - 1].end) << "P " << P << " world " << world;
        if (r + 1 < world) EXPECT_EQ(s[r].end % 64, 0) << "interior boundaries are aligned";
        EXPECT_GE(s[r].size(), 0);
        if (r + 1 < world) {
          smallest = std::min(smallest, s[r].size());
          largest = std::max(largest, s[r].size());
        }
      }
      if (world > 2) EXPECT_LE(largest - smallest, 64) << "P " << P << " world " << world;
    }
  EXPECT_THROW(shard_ranges(10, 0), Error);
}

// Every parameter kind and flag: attention and both Relation mixers with biases, a frozen λ, an
// untied head, learned positions and LayerNorm (two-tensor norms); alignment gaps throughout.
model::ModelConfig varied_config() {
  return model::config_from_json(nlohmann::json{{"name", "dist-test-varied"}, {"vocab_size", 50}, {"context", 16},
                                                {"d_model", 16}, {"n_heads", 2}, {"n_layers", 4},
                                                {"pattern", "AFLF"}, {"attn_bias", true}, {"tied_head", false},
                                                {"positions", "learned"}, {"norm", "layernorm"},
                                                {"relation", {{"lambda_frozen", true}}},
                                                {"ffn", {{"kind", "swiglu"}, {"width", 32}, {"bias", true}}}});
}

std::vector<ParamSegment> segments_of(const std::vector<model::ParamInfo>& table) {
  std::vector<ParamSegment> out;
  for (const model::ParamInfo& p : table) out.push_back({p.offset, p.numel, p.decay, p.trainable});
  return out;
}

int64_t flat_size(const std::vector<model::ParamInfo>& table) { return table.back().offset + table.back().numel; }

// What the optimizer does to each element: -1 nothing (a gap), else 2·decay + trainable.
std::vector<int> element_roles(const std::vector<ParamSegment>& segments, int64_t base, int64_t n) {
  std::vector<int> roles(static_cast<size_t>(n), -1);
  for (const ParamSegment& s : segments)
    for (int64_t i = s.offset; i < s.offset + s.numel; ++i) {
      EXPECT_EQ(roles[base + i], -1) << "element " << base + i << " is in two segments";
      roles[base + i] = (s.decay ? 2 : 0) + (s.trainable ? 1 : 0);
    }
  return roles;
}

TEST(Distributed, OptimizerShardsSplitTheSegmentsExactly) {
  for (const model::ModelConfig& cfg : {hybrid_config(), varied_config()}) {
    const std::vector<model::ParamInfo> table = model::param_table(cfg);
    const std::vector<ParamSegment> segments = segments_of(table);
    const int64_t P = flat_size(table);
    const std::vector<int> whole = element_roles(segments, 0, P);
    ASSERT_TRUE(std::count(whole.begin(), whole.end(), -1) > 0) << "the table has alignment gaps";
    ASSERT_TRUE(std::count(whole.begin(), whole.end(), 1) > 0) << "the table has parameters without decay";
    ASSERT_TRUE(std::count(whole.begin(), whole.end(), 3) > 0) << "the table has parameters with decay";
    if (cfg.relation.lambda_frozen)
      ASSERT_TRUE(std::count(whole.begin(), whole.end(), 0) > 0) << "the table has a frozen parameter";
    for (int world : {1, 2, 3, 5, 8}) {
      SCOPED_TRACE(cfg.name + ", world " + std::to_string(world));
      std::vector<int> joined(static_cast<size_t>(P), -1);
      for (int r = 0; r < world; ++r) {
        const OptimizerShard shard = optimizer_shard(segments, P, r, world);
        const std::vector<Range> expected = shard_ranges(P, world, model::kParamAlign);
        ASSERT_EQ(shard.shards.size(), expected.size());
        for (size_t k = 0; k < expected.size(); ++k) {
          EXPECT_EQ(shard.shards[k].begin, expected[k].begin);
          EXPECT_EQ(shard.shards[k].end, expected[k].end);
        }
        EXPECT_EQ(shard.range.begin, expected[r].begin);
        EXPECT_EQ(shard.range.end, expected[r].end);
        int64_t previous_end = 0;
        for (const ParamSegment& s : shard.segments) {
          EXPECT_GE(s.offset, previous_end) << "sorted and disjoint";
          EXPECT_GT(s.numel, 0) << "no empty segments";
          EXPECT_LE(s.offset + s.numel, shard.range.size()) << "inside the shard, relative to its start";
          previous_end = s.offset + s.numel;
        }
        const std::vector<int> mine = element_roles(shard.segments, shard.range.begin, P);
        for (int64_t i = 0; i < P; ++i)
          if (mine[i] != -1) {
            EXPECT_EQ(joined[i], -1) << "element " << i << " is in two shards";
            joined[i] = mine[i];
          }
      }
      EXPECT_EQ(joined, whole) << "the shards' segments, put back, are the optimizer's segments";
    }
    const OptimizerShard one = optimizer_shard(segments, P, 0, 1);
    ASSERT_EQ(one.segments.size(), segments.size());
    for (size_t k = 0; k < segments.size(); ++k) {
      EXPECT_EQ(one.segments[k].offset, segments[k].offset);
      EXPECT_EQ(one.segments[k].numel, segments[k].numel);
    }
  }
  const std::vector<ParamSegment> overlapping = {{0, 100, true, true}, {64, 100, false, true}};
  EXPECT_THROW(optimizer_shard(overlapping, 1000, 0, 2), Error);
  EXPECT_THROW(optimizer_shard({{0, 100, true, true}}, 64, 0, 2), Error);  // outside the buffer
  EXPECT_THROW(optimizer_shard({}, 1000, 2, 2), Error);
  EXPECT_THROW(optimizer_shard({}, 1000, -1, 2), Error);
}

// A bucket's reduce-scatter sends each owner its part: the parts, in rank order, are the
// bucket cut at the shards' boundaries, each inside its owner's shard.
TEST(Distributed, BucketPartsAreTheBucketCutAtTheShardBoundaries) {
  const std::vector<model::ParamInfo> table = model::param_table(varied_config());
  const int64_t P = flat_size(table);
  Rng rng(5);
  for (int world : {1, 2, 3, 7}) {
    const std::vector<Range> shards = shard_ranges(P, world, model::kParamAlign);
    std::vector<Range> ranges;
    for (int64_t cap : {int64_t{1}, int64_t{2048}, int64_t{1} << 30})
      for (const Bucket& b : bucket_plan(table, cap)) ranges.push_back(b.range);
    for (int k = 0; k < 50; ++k) {
      const int64_t a = static_cast<int64_t>(rng.below(static_cast<uint64_t>(P + 1)));
      const int64_t e = static_cast<int64_t>(rng.below(static_cast<uint64_t>(P + 1)));
      ranges.push_back({std::min(a, e), std::max(a, e)});
    }
    for (const Range& range : ranges) {
      SCOPED_TRACE(fmt::format("world {}, range [{}, {})", world, range.begin, range.end));
      const std::vector<Range> parts = split_by_shards(range, shards);
      ASSERT_EQ(parts.size(), shards.size());
      int64_t at = range.begin, owners = 0;
      for (size_t r = 0; r < parts.size(); ++r) {
        if (parts[r].size() == 0) continue;
        ++owners;
        EXPECT_EQ(parts[r].begin, at) << "contiguous, in rank order";
        EXPECT_GE(parts[r].begin, shards[r].begin);
        EXPECT_LE(parts[r].end, shards[r].end);
        at = parts[r].end;
      }
      EXPECT_EQ(at, range.end) << "the parts cover the range";
      int64_t touched = 0;  // shards the range meets
      for (const Range& s : shards) touched += std::min(range.end, s.end) > std::max(range.begin, s.begin);
      EXPECT_EQ(owners, touched);
    }
  }
  EXPECT_THROW(split_by_shards({5, 3}, shard_ranges(100, 2)), Error);
}

// Which backward stage finishes a parameter's gradient, from its name alone: the head and the
// final norm first, then the layers from the last, then the embeddings.
size_t stage_of(const std::string& name, int64_t layers) {
  if (name == "head" || name.rfind("norm_f.", 0) == 0) return 0;
  if (name.rfind("layers.", 0) == 0) return 1 + static_cast<size_t>(layers - 1 - std::stoll(name.substr(7)));
  return static_cast<size_t>(layers) + 1;
}

TEST(Distributed, BackwardStagesRunFromTheTablesEnd) {
  for (const model::ModelConfig& cfg : {hybrid_config(), varied_config()}) {
    const std::vector<model::ParamInfo> table = model::param_table(cfg);
    const std::vector<size_t> starts = model::backward_stage_starts(cfg);
    ASSERT_EQ(starts.size(), static_cast<size_t>(cfg.n_layers) + 2) << cfg.name;
    EXPECT_EQ(starts.back(), 0u);
    for (size_t s = 0; s < starts.size(); ++s)
      for (size_t k = 0; k < table.size(); ++k)
        EXPECT_EQ(k >= starts[s], stage_of(table[k].name, cfg.n_layers) <= s)
            << cfg.name << ": " << table[k].name << " after stage " << s;
  }
}

// Buckets are reduced when the backward has finished them: at each stage's report, the newly
// complete buckets hold only gradients that are final, and a bucket waits for no stage after
// its last parameter's (the earliest overlap); by the last stage every bucket is complete.
TEST(Distributed, BucketsCompleteAsTheBackwardFinishesThem) {
  for (const model::ModelConfig& cfg : {hybrid_config(), varied_config()}) {
    const std::vector<model::ParamInfo> table = model::param_table(cfg);
    const std::vector<size_t> starts = model::backward_stage_starts(cfg);
    for (int64_t cap : {int64_t{1}, int64_t{4096}, int64_t{1} << 14, int64_t{1} << 30}) {
      SCOPED_TRACE(cfg.name + ", cap " + std::to_string(cap));
      const std::vector<Bucket> plan = bucket_plan(table, cap);
      EXPECT_EQ(buckets_complete(plan, table.size()), 0u) << "nothing is final before the backward";
      size_t reduced = 0;
      for (size_t s = 0; s < starts.size(); ++s) {
        const size_t complete = buckets_complete(plan, starts[s]);
        EXPECT_GE(complete, reduced);
        for (size_t b = reduced; b < complete; ++b) {
          size_t last_stage = 0;
          for (size_t k : plan[b].params) last_stage = std::max(last_stage, stage_of(table[k].name, cfg.n_layers));
          EXPECT_EQ(last_stage, s) << "bucket " << b << " completes at the stage of its last gradient";
        }
        reduced = std::max(reduced, complete);
      }
      EXPECT_EQ(reduced, plan.size());
    }
  }
}

// ZeRO-1 on the CPU: each rank runs AdamW on its shard (optimizer_shard's segments, the shard's
// own m and v) of one parameter buffer. Without clipping AdamW is elementwise, so any world size
// must give the single-device parameters and moments bit for bit. A state gathered at world 2
// (what a checkpoint holds) and taken apart again at world 1 or 3 (what resume does) continues
// exactly as the uninterrupted single-device run.
TEST(Distributed, ZeroOneStateMovesBetweenWorldSizesExactly) {
  const std::vector<model::ParamInfo> table = model::param_table(varied_config());
  const std::vector<ParamSegment> segments = segments_of(table);
  const int64_t P = flat_size(table);
  AdamWOptions options;
  options.weight_decay = 0.1;
  Rng rng(9);
  Tensor initial = Tensor::empty({P}, DType::F32);
  rng.fill_normal(initial, 0.0, 0.5);
  std::vector<Tensor> grads;
  for (int step = 0; step < 4; ++step) {
    grads.push_back(Tensor::empty({P}, DType::F32));
    rng.fill_normal(grads.back(), 0.0, 0.1);
  }
  const double lrs[] = {1e-2, 3e-3, 5e-3, 1e-3};

  // The single-device run.
  Tensor want = initial.clone();
  AdamW whole(segments, P, options);
  Tensor want_m2, want_v2;
  for (int step = 0; step < 4; ++step) {
    whole.step(want.data<float>(), grads[step].data<float>(), lrs[step]);
    if (step == 1) {
      want_m2 = whole.m().clone();
      want_v2 = whole.v().clone();
    }
  }

  // `world` ranks continue from the full state (m, v, steps taken) over steps [first, last).
  struct State {
    Tensor params, m, v;
  };
  auto run_sharded = [&](State start, int world, int first, int last) {
    std::vector<std::unique_ptr<AdamW>> ranks;
    std::vector<OptimizerShard> shards;
    for (int r = 0; r < world; ++r) {
      shards.push_back(optimizer_shard(segments, P, r, world));
      const Range range = shards.back().range;
      ranks.push_back(std::make_unique<AdamW>(shards.back().segments, range.size(), options));
      ranks.back()->m().copy_from(start.m.slice(0, range.begin, range.end));
      ranks.back()->v().copy_from(start.v.slice(0, range.begin, range.end));
      ranks.back()->set_steps_taken(first);
    }
    for (int step = first; step < last; ++step)
      for (int r = 0; r < world; ++r) {
        const Range range = shards[r].range;
        ranks[r]->step(start.params.data<float>() + range.begin, grads[step].data<float>() + range.begin, lrs[step]);
      }
    for (int r = 0; r < world; ++r) {  // the gather before a checkpoint
      const Range range = shards[r].range;
      start.m.slice(0, range.begin, range.end).copy_from(ranks[r]->m());
      start.v.slice(0, range.begin, range.end).copy_from(ranks[r]->v());
    }
    return start;
  };
  auto same_bits = [](const Tensor& a, const Tensor& b) {
    return a.numel() == b.numel() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
  };
  const State fresh{initial.clone(), Tensor::zeros({P}, DType::F32), Tensor::zeros({P}, DType::F32)};
  const State saved = run_sharded(fresh, 2, 0, 2);
  EXPECT_TRUE(same_bits(saved.m, want_m2)) << "m gathered at world 2";
  EXPECT_TRUE(same_bits(saved.v, want_v2)) << "v gathered at world 2";
  EXPECT_FALSE(same_bits(saved.params, initial)) << "the steps changed the parameters";
  for (int world : {1, 2, 3}) {
    const State resumed = run_sharded({saved.params.clone(), saved.m.clone(), saved.v.clone()}, world, 2, 4);
    EXPECT_TRUE(same_bits(resumed.params, want)) << "parameters, resumed at world " << world;
    EXPECT_TRUE(same_bits(resumed.m, whole.m())) << "m, resumed at world " << world;
    EXPECT_TRUE(same_bits(resumed.v, whole.v())) << "v, resumed at world " << world;
  }
}

// Clipping uses the global norm: the shards' squared norms, summed over the ranks, are the
// whole buffer's (up to the order of the sum).
TEST(Distributed, ShardNormsAddUpToTheGlobalNorm) {
  const std::vector<model::ParamInfo> table = model::param_table(varied_config());
  const std::vector<ParamSegment> segments = segments_of(table);
  const int64_t P = flat_size(table);
  Rng rng(13);
  Tensor g = Tensor::empty({P}, DType::F32);
  rng.fill_normal(g, 0.0, 1.0);
  const double norm = grad_norm(g.data<float>(), segments);
  for (int world : {2, 3, 8}) {
    double sum = 0;
    for (int r = 0; r < world; ++r) {
      const OptimizerShard shard = optimizer_shard(segments, P, r, world);
      const double part = grad_norm(g.data<float>() + shard.range.begin, shard.segments);
      sum += part * part;
    }
    EXPECT_NEAR(std::sqrt(sum), norm, 1e-12 * norm) << "world " << world;
  }
}

TEST(Distributed, BucketsHoldEveryParameterOnceInBackwardOrder) {
  const std::vector<model::ParamInfo> table = model::param_table(hybrid_config());
  for (int64_t cap : {int64_t{1}, int64_t{4096}, int64_t{1} << 30}) {
    const std::vector<Bucket> buckets = bucket_plan(table, cap);
    std::vector<size_t> order;
    for (const Bucket& b : buckets) {
      int64_t covered = 0;
      for (size_t k : b.params) {
        covered += table[k].numel;
        EXPECT_GE(table[k].offset, b.range.begin);
        EXPECT_LE(table[k].offset + table[k].numel, b.range.end);
      }
      // A bucket is its parameters and the alignment gaps between them.
      EXPECT_LE(covered, b.range.size());
      EXPECT_LT(b.range.size() - covered, model::kParamAlign * static_cast<int64_t>(b.params.size()));
      if (b.params.size() > 1) EXPECT_LE(b.range.size() * 4, cap) << "only a lone tensor may exceed the cap";
      order.insert(order.end(), b.params.begin(), b.params.end());
    }
    ASSERT_EQ(order.size(), table.size());
    for (size_t i = 0; i < order.size(); ++i) EXPECT_EQ(order[i], table.size() - 1 - i) << "reverse table order";
  }
  EXPECT_EQ(bucket_plan(table, int64_t{1} << 30).size(), 1u);
  EXPECT_EQ(bucket_plan(table, 1).size(), table.size());
}

// Ranks taking their rows of each global micro-batch see every window of the sequential
// stream exactly once per pass, as the single-device run with the same global batch does.
TEST(Distributed, RanksSplitTheGlobalBatchIntoTheSingleDeviceWindows) {
  std::vector<uint16_t> tokens(1 + 8 * 4 * 5);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>(i % 60000);
  const TokenSplit split(tokens);
  const int64_t global = 8, T = 4, world = 4;
  BatchLoader single(split, global, T);
  BatchLoader shared(split, global, T);
  std::multiset<int32_t> seen;
  for (int step = 0; step < 5; ++step) {
    std::vector<int32_t> x1(global * T), y1(global * T), x(global * T), y(global * T);
    single.next(x1.data(), y1.data());
    shared.next(x.data(), y.data());
    std::vector<int32_t> joined;
    for (int r = 0; r < world; ++r) {
      const Range rows = rank_rows(global, r, world);
      for (int64_t b = rows.begin; b < rows.end; ++b)
        for (int64_t t = 0; t < T; ++t) joined.push_back(x[b * T + t]);
    }
    EXPECT_EQ(joined, x1) << "step " << step;
    for (int32_t v : joined) seen.insert(v);
  }
  EXPECT_EQ(seen.size(), static_cast<size_t>(5 * global * T));
  EXPECT_EQ(std::set<int32_t>(seen.begin(), seen.end()).size(), seen.size()) << "every token once per pass";
  EXPECT_THROW(rank_rows(6, 0, 4), Error);
}

TEST(Distributed, FileRendezvousHandsRankZerosPayloadToEveryRank) {
  quiver::testing::ScratchDir dir("rendezvous");
  const std::string path = dir.file("nccl-id");
  const std::string id(128, '\x07');
  std::vector<std::string> got(4);
  std::vector<std::thread> ranks;
  for (int r = 3; r >= 0; --r)  // rank 0 last: the others must wait for it
    ranks.emplace_back([&, r] { got[r] = rendezvous_file(path, r, r == 0 ? id : std::string(), 5000ms); });
  for (auto& t : ranks) t.join();
  for (const std::string& g : got) EXPECT_EQ(g, id);
  EXPECT_THROW(rendezvous_file(dir.file("never"), 1, "", 50ms), Error);
}

// A port the kernel just handed out for 127.0.0.1 (free unless taken again in between).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof(a);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0;
  ::close(fd);
  QV_CHECK(ok, "no free loopback port");
  return ntohs(a.sin_port);
}

TEST(Distributed, TcpRendezvousHandsRankZerosPayloadToEveryRank) {
  std::string id(128, '\0');
  for (size_t i = 0; i < id.size(); ++i) id[i] = static_cast<char>(i * 37);
  const int port = free_port();
  std::vector<std::string> got(4);
  std::vector<std::thread> ranks;
  for (int r = 3; r >= 0; --r)
    ranks.emplace_back([&, r] { got[r] = rendezvous_tcp("127.0.0.1", port, r, 4, r == 0 ? id : std::string(), 5000ms); });
  for (auto& t : ranks) t.join();
  for (const std::string& g : got) EXPECT_EQ(g, id);
  EXPECT_THROW(rendezvous_tcp("127.0.0.1", free_port(), 1, 2, "", 100ms), Error);  // nobody listens
  EXPECT_THROW(rendezvous_tcp("not-an-address", port, 1, 2, "", 100ms), Error);
}

// The description a rank gets picks the rendezvous: tcp://ADDRESS:PORT or a file path.
TEST(Distributed, RendezvousByDescription) {
  const RendezvousSpec t = parse_rendezvous("tcp://10.1.2.3:29500");
  EXPECT_TRUE(t.tcp);
  EXPECT_EQ(t.host, "10.1.2.3");
  EXPECT_EQ(t.port, 29500);
  const RendezvousSpec f = parse_rendezvous("/tmp/quiver-rendezvous-1");
  EXPECT_FALSE(f.tcp);
  EXPECT_EQ(f.path, "/tmp/quiver-rendezvous-1");
  for (const char* bad : {"", "tcp://10.1.2.3", "tcp://:29500", "tcp://10.1.2.3:", "tcp://10.1.2.3:70000",
                          "tcp://10.1.2.3:29x", "tcp://head:29500"})
    EXPECT_THROW(parse_rendezvous(bad), Error) << bad;

  const std::string id = "0123456789abcdef";
  const std::string spec = "tcp://127.0.0.1:" + std::to_string(free_port());
  std::vector<std::string> got(3);
  std::vector<std::thread> ranks;
  for (int r = 2; r >= 0; --r)
    ranks.emplace_back([&, r] { got[r] = rendezvous(spec, r, 3, r == 0 ? id : std::string(), 5000ms); });
  for (auto& th : ranks) th.join();
  for (const std::string& g : got) EXPECT_EQ(g, id);
}

}  // namespace
