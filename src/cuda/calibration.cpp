// The kernel-choice cache (calibration.h).
#include "cuda/calibration.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <cuda_runtime.h>

#include "cuda/check.h"
#include "train/checkpoint.h"

namespace quiver::cuda {
namespace {

constexpr const char* kFormat = "quiver-kernel-cache-1";

std::string default_path() {
  std::string dir;
  if (const char* d = std::getenv("QUIVER_CACHE_DIR"))
    dir = std::string(d) == "off" ? "" : d;
  else if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x)
    dir = std::string(x) + "/quiver";
  else if (const char* h = std::getenv("HOME"); h && *h)
    dir = std::string(h) + "/.cache/quiver";
  return dir.empty() ? "" : dir + "/kernels.json";
}

}  // namespace

KernelCache::KernelCache(std::string path) : path_(std::move(path)) {
  if (path_.empty()) return;
  std::ifstream in(path_);
  if (!in) return;  // no cache yet
  try {
    const nlohmann::json j = nlohmann::json::parse(in);
    if (!j.is_object() || j.value("format", "") != kFormat || !j.contains("entries") || !j["entries"].is_object())
      throw std::runtime_error("not a " + std::string(kFormat) + " file");
    entries_ = j["entries"];
  } catch (const std::exception& e) {
    std::fprintf(stderr, "quiver: ignoring the kernel cache '%s' (%s); kernels are calibrated again\n", path_.c_str(),
                 e.what());
  }
}

std::optional<nlohmann::json> KernelCache::lookup(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) return std::nullopt;
  return *it;
}

void KernelCache::store(const std::string& key, const nlohmann::json& value) {
  std::lock_guard<std::mutex> lock(mu_);
  entries_[key] = value;
  if (path_.empty()) return;
  try {
    std::filesystem::create_directories(std::filesystem::path(path_).parent_path());
    train::write_text_atomic(path_, nlohmann::json{{"format", kFormat}, {"entries", entries_}}.dump(1) + "\n");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "quiver: the kernel cache stays in memory: %s\n", e.what());
    path_.clear();  // report once
  }
}

std::string KernelCache::path() {
  std::lock_guard<std::mutex> lock(mu_);
  return path_;
}

KernelCache& kernel_cache() {
  static KernelCache cache(default_path());
  return cache;
}

const std::string& device_name_for_keys() {
  static const std::string name = [] {
    int dev = 0;
    QV_CUDA_CHECK(cudaGetDevice(&dev));
    cudaDeviceProp prop{};
    QV_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
    return std::string(prop.name);
  }();
  return name;
}

int pick_calibrated(const std::vector<CandidateTime>& times, bool near_ties) {
  int fastest = -1;
  for (size_t i = 0; i < times.size(); ++i)
    if (fastest < 0 || times[i].us < times[fastest].us) fastest = static_cast<int>(i);
  if (!near_ties || fastest < 0) return fastest;
  int pick = fastest;
  for (size_t i = 0; i < times.size(); ++i)
    if (times[i].us <= 1.05f * times[fastest].us && times[i].warm_us < times[pick].warm_us) pick = static_cast<int>(i);
  return pick;
}

bool outputs_agree(const OutputDiff& d) {
  return std::isfinite(d.diff2) && std::isfinite(d.max_diff) && d.rel() <= 1.0 / 64 && d.max_diff <= d.max_ref / 16;
}

}  // namespace quiver::cuda
