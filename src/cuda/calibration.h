// A persistent cache of kernel choices made by timing (calibration), keyed by a string that
// names the GPU, the shape and whatever else the choice depends on.
//
// One JSON file: {"format": "quiver-kernel-cache-1", "entries": {key: value}}. It is read when
// the cache is made and rewritten atomically after each new entry, so a killed process never
// leaves a torn file. An unreadable or malformed file is reported once on stderr and ignored
// (its entries are calibrated again, and the next store replaces it); a file that cannot be
// written is reported once and the cache stays in memory. Thread-safe.
//
// The process's cache (kernel_cache()) is `kernels.json` in QUIVER_CACHE_DIR, else
// $XDG_CACHE_HOME/quiver, else $HOME/.cache/quiver; QUIVER_CACHE_DIR=off keeps it in memory.
#pragma once
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace quiver::cuda {

class KernelCache {
 public:
  explicit KernelCache(std::string path);  // "" keeps the cache in memory
  std::optional<nlohmann::json> lookup(const std::string& key);
  void store(const std::string& key, const nlohmann::json& value);  // replaces, then writes
  std::string path();  // "" when in memory only (given so, or after a failed write)

 private:
  std::mutex mu_;
  std::string path_;
  nlohmann::json entries_ = nlohmann::json::object();
};

KernelCache& kernel_cache();

// The current device's name, for keys ("NVIDIA H200").
const std::string& device_name_for_keys();

// A calibration candidate's times, µs: `us` as the choice is timed (L2 flushed before each call
// for decode shapes), `warm_us` back to back.
struct CandidateTime {
  float us, warm_us;
};
// The chosen candidate's index (-1 when there is none): the fastest `us`; with near_ties (decode
// shapes), of the candidates within 5% of the fastest `us`, the fastest `warm_us`. A flushed
// single call carries several µs of the flush's and the events' own time, so candidates that
// stream the same bytes from DRAM time within a few percent of each other there, while back to
// back they can differ by far more.
int pick_calibrated(const std::vector<CandidateTime>& times, bool near_ties);

}  // namespace quiver::cuda
