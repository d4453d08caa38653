// The device-independent parts of data-parallel training (train/distributed.h): ZeRO-1
// shards, gradient buckets, the division of the global batch, and both rendezvous.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "model/config.h"
#include "model/model.h"
#include "quiver/error.h"
#include "testing.h"
#include "train/distributed.h"
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
