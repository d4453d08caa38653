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
#include <cmath>
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

// A candidate's output against a reference computed on the same inputs by an independent path,
// over every element: Σ (got − ref)², Σ ref², max |got − ref| (∞ where got − ref is not finite)
// and max |ref|.
struct OutputDiff {
  double diff2 = 0, ref2 = 0, max_diff = 0, max_ref = 0;
  double rel() const { return ref2 > 0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2); }
};
// Whether a calibration candidate agrees with the reference as two correct kernels do: both sum
// in fp32 and round once (a bf16 output is at most a unit or two of 2^-8 apart, an fp32 one far
// closer), so a relative norm error of at most 2^-6 and no element off by more than max |ref| / 16.
// The second bound catches what the first averages away: a single wrong or unwritten tile among
// thousands moves the norm by ~1% but its elements by about their own size.
bool outputs_agree(const OutputDiff& d);

}  // namespace quiver::cuda
