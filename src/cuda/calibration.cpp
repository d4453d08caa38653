// The kernel-choice cache (calibration.h).
#include "cuda/calibration.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>

#include <cuda_runtime.h>

#include "cuda/check.h"
#include "train/checkpoint.h"

namespace quiver::cuda {
namespace {

constexpr const char* kFormat = "quiver-kernel-cache-1";

std::string cache_dir() {
  if (const char* d = std::getenv("QUIVER_CACHE_DIR")) return std::string(d) == "off" ? "" : d;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::string(x) + "/quiver";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/quiver";
  return "";
}

struct Cache {
  std::mutex mu;
  bool loaded = false;
  std::string path;
  nlohmann::json entries = nlohmann::json::object();

  void load() {
    if (loaded) return;
    loaded = true;
    const std::string dir = cache_dir();
    if (dir.empty()) return;
    path = dir + "/kernels.json";
    std::ifstream in(path);
    if (!in) return;  // no cache yet
    try {
      const nlohmann::json j = nlohmann::json::parse(in);
      if (!j.is_object() || j.value("format", "") != kFormat || !j.contains("entries") || !j["entries"].is_object())
        throw std::runtime_error("not a " + std::string(kFormat) + " file");
      entries = j["entries"];
    } catch (const std::exception& e) {
      std::fprintf(stderr, "quiver: ignoring the kernel cache '%s' (%s); kernels are calibrated again\n",
                   path.c_str(), e.what());
    }
  }

  void save() {
    if (path.empty()) return;
    try {
      std::filesystem::create_directories(std::filesystem::path(path).parent_path());
      train::write_text_atomic(path, nlohmann::json{{"format", kFormat}, {"entries", entries}}.dump(1) + "\n");
    } catch (const std::exception& e) {
      std::fprintf(stderr, "quiver: the kernel cache stays in memory: %s\n", e.what());
      path.clear();  // report once
    }
  }
};

Cache& cache() {
  static Cache c;
  return c;
}

}  // namespace

std::optional<nlohmann::json> calibration_lookup(const std::string& key) {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  c.load();
  auto it = c.entries.find(key);
  if (it == c.entries.end()) return std::nullopt;
  return *it;
}

void calibration_store(const std::string& key, const nlohmann::json& value) {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  c.load();
  c.entries[key] = value;
  c.save();
}

std::string calibration_path() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  c.load();
  return c.path;
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

}  // namespace quiver::cuda
