// The kernel-choice cache (cuda/calibration.h): choices survive a new process (a new cache on
// the same file), a damaged or foreign file is ignored and then replaced, and a file that
// cannot be written leaves the cache working in memory; the rule that picks a calibrated
// candidate from its times, and the one that checks its output. Needs no GPU.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>

#include "cuda/calibration.h"

namespace fs = std::filesystem;
using quiver::cuda::KernelCache;

namespace {

fs::path scratch(const char* name) {
  const fs::path dir = fs::temp_directory_path() / ("quiver_kernel_cache_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace

TEST(KernelCache, ChoicesSurviveANewCacheOnTheSameFile) {
  const fs::path dir = scratch("survive");
  const fs::path file = dir / "sub" / "kernels.json";  // the folder is made on first store
  {
    KernelCache c(file.string());
    EXPECT_FALSE(c.lookup("a").has_value());
    c.store("a", {{"kernel", "fused"}, {"config", 3}});
    c.store("b", {{"kernel", "gemv"}, {"config", 1}});
    c.store("a", {{"kernel", "fused"}, {"config", 4}});  // replaces
  }
  KernelCache again(file.string());
  ASSERT_TRUE(again.lookup("a").has_value());
  EXPECT_EQ((*again.lookup("a"))["config"], 4);
  EXPECT_EQ((*again.lookup("b"))["kernel"], "gemv");
  EXPECT_FALSE(again.lookup("c").has_value());
  const nlohmann::json j = nlohmann::json::parse(slurp(file));
  EXPECT_EQ(j["format"], "quiver-kernel-cache-1");
  EXPECT_EQ(j["entries"].size(), 2u);
  for (const auto& e : fs::directory_iterator(file.parent_path()))  // no temporary left behind
    EXPECT_EQ(e.path().filename(), "kernels.json");
  fs::remove_all(dir);
}

TEST(KernelCache, ADamagedOrForeignFileIsIgnoredThenReplaced) {
  const fs::path dir = scratch("damaged");
  for (const char* text : {"{\"format\": \"quiver-kernel-cache-1\", \"entr", "[1, 2, 3]",
                           "{\"format\": \"something-else\", \"entries\": {\"a\": 1}}"}) {
    const fs::path file = dir / "kernels.json";
    std::ofstream(file) << text;
    KernelCache c(file.string());
    EXPECT_FALSE(c.lookup("a").has_value()) << text;
    c.store("x", 7);
    const nlohmann::json j = nlohmann::json::parse(slurp(file));
    EXPECT_EQ(j["entries"]["x"], 7) << text;
    EXPECT_EQ(j["entries"].size(), 1u) << text;
  }
  fs::remove_all(dir);
}

TEST(KernelCache, AnUnwritableFileLeavesTheCacheInMemory) {
  const fs::path dir = scratch("unwritable");
  const fs::path blocker = dir / "a-file";
  std::ofstream(blocker) << "not a folder";
  KernelCache c((blocker / "kernels.json").string());  // its folder cannot be created
  c.store("k", 1);
  EXPECT_EQ(c.path(), "");
  ASSERT_TRUE(c.lookup("k").has_value());
  EXPECT_EQ(*c.lookup("k"), 1);
  c.store("k", 2);
  EXPECT_EQ(*c.lookup("k"), 2);
  KernelCache memory("");
  memory.store("m", 3);
  EXPECT_EQ(*memory.lookup("m"), 3);
  fs::remove_all(dir);
}

TEST(KernelCache, PickCalibratedTakesTheFastestAndForDecodeTheFastestWarmNearTie) {
  using quiver::cuda::pick_calibrated;
  EXPECT_EQ(pick_calibrated({}, false), -1);
  EXPECT_EQ(pick_calibrated({}, true), -1);
  // Timed back to back: the fastest, whatever the warm times say.
  const std::vector<quiver::cuda::CandidateTime> t = {{100.f, 50.f}, {104.f, 40.f}, {106.f, 10.f}, {99.f, 60.f}};
  EXPECT_EQ(pick_calibrated(t, false), 3);
  // Decode shapes: of those within 5% of the fastest flushed time (99 → 103.95), the fastest warm;
  // 104 and 106 are outside it, however fast warm.
  EXPECT_EQ(pick_calibrated(t, true), 0);
  const std::vector<quiver::cuda::CandidateTime> u = {{12.95f, 7.4f}, {13.38f, 5.4f}, {14.0f, 1.0f}};
  EXPECT_EQ(pick_calibrated(u, true), 1);
  EXPECT_EQ(pick_calibrated(u, false), 0);
  // Equal times keep the first.
  EXPECT_EQ(pick_calibrated({{5.f, 5.f}, {5.f, 5.f}}, true), 0);
}

TEST(KernelCache, OutputsAgreeAsTwoCorrectKernelsDo) {
  using quiver::cuda::OutputDiff;
  using quiver::cuda::outputs_agree;
  // Two bf16 roundings apart: a relative error of about 2^-8, elements a unit or two apart.
  EXPECT_TRUE(outputs_agree({1e-5 * 1e3, 1e3, 2.0 / 128, 4.0}));
  EXPECT_TRUE(outputs_agree({0, 0, 0, 0}));  // both zero
  // Norm error above 2^-6.
  EXPECT_FALSE(outputs_agree({0.02 * 0.02 * 1e3 * 1.01, 1e3, 0.1, 4.0}));
  // A norm error within bounds, but one element off by more than max |ref| / 16: one wrong tile.
  EXPECT_FALSE(outputs_agree({1e-6 * 1e3, 1e3, 0.3, 4.0}));
  EXPECT_TRUE(outputs_agree({1e-6 * 1e3, 1e3, 0.25, 4.0}));
  // Zeros where the reference has values, and anything not finite.
  EXPECT_FALSE(outputs_agree({1e3, 1e3, 4.0, 4.0}));
  EXPECT_FALSE(outputs_agree({std::numeric_limits<double>::infinity(), 1e3, 1.0, 4.0}));
  EXPECT_FALSE(outputs_agree({1e-6, 1e3, std::numeric_limits<double>::infinity(), 4.0}));
  EXPECT_FALSE(outputs_agree({std::nan(""), 1e3, 0.0, 4.0}));
  EXPECT_NEAR((OutputDiff{4.0, 16.0, 0, 0}).rel(), 0.5, 1e-15);
}
