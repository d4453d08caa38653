// `quiver train --gpus N` through the built binary: what it refuses before starting any rank,
// and how a started rank checks the environment the launcher gives it.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

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
  EXPECT_NE(r.err.find("must be divisible by --gpus 2"), std::string::npos) << r.err;
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
    EXPECT_NE(r.err.find("QUIVER_WORLD_SIZE=2 but --gpus 3"), std::string::npos) << r.err;
  }
  {
    EnvScope env({{"QUIVER_RANK", "x1"}, {"QUIVER_WORLD_SIZE", "2"}, {"QUIVER_RENDEZVOUS", "unused"}});
    const qt::CliResult r = qt::run_cli(kArgs + "--gpus 2", dir);
    EXPECT_NE(r.status, 0);
    EXPECT_NE(r.err.find("QUIVER_RANK='x1' is not a rank number"), std::string::npos) << r.err;
  }
}
