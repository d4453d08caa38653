// A persistent cache of kernel choices made by timing (calibration), keyed by a string that
// names the GPU, the shape and whatever else the choice depends on.
//
// The cache lives in one JSON file, `kernels.json` in the directory QUIVER_CACHE_DIR, else
// $XDG_CACHE_HOME/quiver, else $HOME/.cache/quiver: {"format": "quiver-kernel-cache-1",
// "entries": {key: value}}. It is read on first use and rewritten atomically after each new
// entry, so a killed process never leaves a torn file; an unreadable or malformed file is
// reported once on stderr and ignored (its entries are calibrated again). Setting
// QUIVER_CACHE_DIR to "off" keeps the cache in memory only. Thread-safe.
#pragma once
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace quiver::cuda {

// The value stored under `key`, if any.
std::optional<nlohmann::json> calibration_lookup(const std::string& key);
// Stores (replaces) `value` under `key` and writes the file.
void calibration_store(const std::string& key, const nlohmann::json& value);
// The file in use ("" when in memory only).
std::string calibration_path();
// The current device's name, for keys ("NVIDIA H200").
const std::string& device_name_for_keys();

}  // namespace quiver::cuda
