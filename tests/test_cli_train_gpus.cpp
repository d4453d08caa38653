// `quiver train --gpus N` through the built binary: what it refuses before starting any rank,
// and how a started rank checks the environment the launcher gives it.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "launch.h"
#include "quiver/error.h"
#include "testing.h"

namespace qt = quiver::testing;

namespace {

// Sets environment variables for the CLI runs of one test, and removes them after.
struct EnvScope {
  explicit EnvScope(std::initializer_list<std::pair<const char*, const char*>> vars) {
    for (const auto& [k, v] : vars) {
      ::setenv(k, v, 1);
      names.push_back(k);
    }
  }
  ~EnvScope() {
    for (const char* k : names) ::unsetenv(k);
  }
  std::vector<const char*> names;
};

const std::string kArgs = "train --config tiny --data no-data --out no-run --steps 1 ";

}  // namespace

TEST(TrainGpusCli, RefusesBeforeStartingRanks) {
  qt::ScratchDir dir("train_gpus_refuse");
  qt::CliResult r = qt::run_cli(kArgs + "--gpus 2 --device cpu", dir);
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("--gpus 2 needs --device cuda"), std::string::npos) << r.err;
  r = qt::run_cli(kArgs + "--gpus 0", dir);
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("--gpus must be ≥ 1"), std::string::npos) << r.err;
  r = qt::run_cli(kArgs + "--gpus 2 --device cuda --micro-batch 3", dir);
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("must be divisible by the 2 ranks (--gpus 2 × --nodes 1)"), std::string::npos) << r.err;
  r = qt::run_cli(kArgs + "--gpus 2 --device cuda --micro-batch 8 --bucket-mb 0", dir);
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("--bucket-mb must be in (0, 1048576], got 0"), std::string::npos) << r.err;
}

TEST(TrainGpusCli, SeveralHostsNeedARendezvousAndTheirIndex) {
  qt::ScratchDir dir("train_gpus_nodes");
  const std::string cuda = kArgs + "--device cuda --micro-batch 8 ";
  qt::CliResult r = qt::run_cli(cuda + "--gpus 2 --nodes 2", dir);
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("--nodes 2 needs --rendezvous ADDRESS:PORT"), std::string::npos) << r.err;
  r = qt::run_cli(cuda + "--gpus 2 --nodes 2 --node-rank 2 --rendezvous 10.0.0.1:29500", dir);
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("--node-rank 2 is not below --nodes 2"), std::string::npos) << r.err;
  r = qt::run_cli(cuda + "--gpus 2 --rendezvous 10.0.0.1:29500", dir);
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("--rendezvous is for --nodes > 1"), std::string::npos) << r.err;
  r = qt::run_cli(cuda + "--gpus 2 --nodes 2 --rendezvous head-node:29500", dir);
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("'head-node' is not an IPv4 address"), std::string::npos) << r.err;
  r = qt::run_cli(cuda + "--gpus 2 --nodes 2 --rendezvous 10.0.0.1:0", dir);
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("the port '0' is not in [1, 65535]"), std::string::npos) << r.err;
  r = qt::run_cli(kArgs + "--device cuda --micro-batch 6 --gpus 2 --nodes 2 --rendezvous 10.0.0.1:29500", dir);
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("divisible by the 4 ranks (--gpus 2 × --nodes 2)"), std::string::npos) << r.err;
}

// Host 1 of 2 with 2 GPUs each: global ranks 2 and 3 of 4, local GPUs, the shared rendezvous.
TEST(TrainGpusLauncher, RankEnvironmentOfSeveralHosts) {
  using quiver::cli::rank_environment;
  const std::vector<std::string> e = rank_environment(1, 2, 2, 1, "tcp://10.0.0.1:29500", nullptr);
  const std::vector<std::string> expected = {"QUIVER_RANK=3", "QUIVER_WORLD_SIZE=4",
                                             "QUIVER_RENDEZVOUS=tcp://10.0.0.1:29500", "CUDA_VISIBLE_DEVICES=1",
                                             "NCCL_NVLS_ENABLE=0"};
  EXPECT_EQ(e, expected);
  // The parent's own device list picks the local GPU.
  EXPECT_EQ(rank_environment(0, 2, 1, 0, "/tmp/r", "4, 6")[3], "CUDA_VISIBLE_DEVICES=4");
  EXPECT_EQ(rank_environment(1, 2, 1, 0, "/tmp/r", "4, 6")[0], "QUIVER_RANK=1");
  EXPECT_THROW(rank_environment(0, 3, 1, 0, "/tmp/r", "4,6"), quiver::Error);  // 3 GPUs, 2 listed
  EXPECT_THROW(rank_environment(2, 2, 1, 0, "/tmp/r", nullptr), quiver::Error);
}

TEST(TrainGpusCli, ARankChecksItsEnvironment) {
  qt::ScratchDir dir("train_gpus_env");
  {
    EnvScope env({{"QUIVER_RANK", "0"}});
    const qt::CliResult r = qt::run_cli(kArgs, dir);
    EXPECT_NE(r.status, 0);
    EXPECT_NE(r.err.find("QUIVER_WORLD_SIZE"), std::string::npos) << r.err;
  }
  {
    EnvScope env({{"QUIVER_RANK", "0"}, {"QUIVER_WORLD_SIZE", "2"}, {"QUIVER_RENDEZVOUS", "unused"}});
    const qt::CliResult r = qt::run_cli(kArgs + "--gpus 3", dir);
    EXPECT_NE(r.status, 0);
    EXPECT_NE(r.err.find("QUIVER_WORLD_SIZE=2 but --gpus 3 × --nodes 1 = 3"), std::string::npos) << r.err;
  }
  {
    EnvScope env({{"QUIVER_RANK", "x1"}, {"QUIVER_WORLD_SIZE", "2"}, {"QUIVER_RENDEZVOUS", "unused"}});
    const qt::CliResult r = qt::run_cli(kArgs + "--gpus 2", dir);
    EXPECT_NE(r.status, 0);
    EXPECT_NE(r.err.find("QUIVER_RANK='x1' is not a rank number"), std::string::npos) << r.err;
  }
}
