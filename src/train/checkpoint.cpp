#include "train/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "quiver/error.h"
#include "quiver/safetensors.h"

namespace quiver::train {

namespace {

using nlohmann::json;

// Recursively lists differing fields of two JSON objects with dotted names.
void diff_json(const nlohmann::ordered_json& a, const nlohmann::ordered_json& b, const std::string& prefix, std::vector<std::string>& out) {
  if (a.is_object() && b.is_object()) {
    std::set<std::string> keys;
    for (const auto& [k, v] : a.items()) keys.insert(k);
    for (const auto& [k, v] : b.items()) keys.insert(k);
    for (const std::string& k : keys) {
      const std::string name = prefix.empty() ? k : prefix + "." + k;
      if (!a.contains(k) || !b.contains(k)) {
        out.push_back(fmt::format("{}: {} vs {}", name, a.contains(k) ? a[k].dump() : "(absent)",
                                  b.contains(k) ? b[k].dump() : "(absent)"));
        continue;
      }
      diff_json(a[k], b[k], name, out);
    }
    return;
  }
  if (a != b) out.push_back(fmt::format("{}: {} vs {}", prefix, a.dump(), b.dump()));
}

}  // namespace

void write_text_atomic(const std::string& path, const std::string& content) {
  const std::string tmp = fmt::format("{}.tmp.{}", path, static_cast<long>(::getpid()));
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) fail("cannot write '{}': creating '{}' failed: {}", path, tmp, std::strerror(errno));
  bool ok = std::fwrite(content.data(), 1, content.size(), f) == content.size();
  ok = ok && std::fflush(f) == 0 && ::fsync(::fileno(f)) == 0;
  const int saved_errno = errno;
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) {
    ::unlink(tmp.c_str());
    fail("cannot write '{}': writing '{}' failed: {}", path, tmp, std::strerror(saved_errno ? saved_errno : errno));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    fail("cannot write '{}': renaming '{}' over it failed: {}", path, tmp, std::strerror(e));
  }
}

void save_checkpoint(const std::string& path, const model::Model& model,
                     const std::map<std::string, std::string>& extra_metadata) {
  for (const char* reserved : {kMetaFormat, kMetaConfig})
    QV_CHECK(!extra_metadata.count(reserved), "save_checkpoint '{}': metadata key '{}' is set by the writer",
             path, reserved);
  std::map<std::string, std::string> metadata = extra_metadata;
  metadata[kMetaFormat] = kCheckpointFormat;
  metadata[kMetaConfig] = model::config_to_json(model.config()).dump();
  metadata.emplace(kMetaTokenizer, "");
  metadata.emplace(kMetaStep, "0");

  std::map<std::string, Tensor> tensors;
  for (const model::ParamInfo& info : model.param_table()) {
    Tensor view = model.param(info.name);
    tensors.emplace(info.name, view.dtype() == DType::F32 ? view : view.to(DType::F32));
  }
  write_safetensors(path, tensors, metadata);
}

namespace {

model::ModelConfig config_of(const std::string& path, const std::map<std::string, std::string>& metadata) {
  auto format = metadata.find(kMetaFormat);
  if (format == metadata.end())
    fail("checkpoint '{}': not a quiver checkpoint (its metadata has no '{}' entry)", path, kMetaFormat);
  if (format->second != kCheckpointFormat)
    fail("checkpoint '{}': format '{}' is not the supported '{}'", path, format->second, kCheckpointFormat);
  auto config = metadata.find(kMetaConfig);
  if (config == metadata.end()) fail("checkpoint '{}': metadata has no '{}' entry", path, kMetaConfig);
  json j;
  try {
    j = json::parse(config->second);
  } catch (const json::exception& e) {
    fail("checkpoint '{}': metadata '{}' is not valid JSON ({})", path, kMetaConfig, e.what());
  }
  try {
    return model::config_from_json(j);
  } catch (const Error& e) {
    fail("checkpoint '{}': metadata '{}': {}", path, kMetaConfig, e.what());
  }
}

TensorFile read_checkpoint_file(const std::string& path) {
  try {
    return read_safetensors(path);
  } catch (const Error& e) {
    fail("cannot load checkpoint '{}': {}", path, e.what());
  }
}

}  // namespace

model::ModelConfig read_checkpoint_config(const std::string& path) {
  TensorFile file = read_checkpoint_file(path);
  return config_of(path, file.metadata);
}

std::unique_ptr<model::Model> load_checkpoint(const std::string& path,
                                              std::map<std::string, std::string>* metadata) {
  TensorFile file = read_checkpoint_file(path);
  model::ModelConfig cfg = config_of(path, file.metadata);
  auto m = std::make_unique<model::Model>(cfg, DType::F32);
  std::set<std::string> expected;
  for (const model::ParamInfo& info : m->param_table()) {
    expected.insert(info.name);
    auto it = file.tensors.find(info.name);
    if (it == file.tensors.end())
      fail("checkpoint '{}': parameter '{}' (shape {}) is missing", path, info.name, shape_str(info.shape));
    const Tensor& t = it->second;
    if (t.dtype() != DType::F32)
      fail("checkpoint '{}': parameter '{}' is {}, expected F32", path, info.name, dtype_name(t.dtype()));
    if (t.shape() != info.shape)
      fail("checkpoint '{}': parameter '{}' has shape {}, but the config '{}' needs {}", path, info.name,
           shape_str(t.shape()), cfg.name, shape_str(info.shape));
    m->param(info.name).copy_from(t);
  }
  std::vector<std::string> unknown;
  for (const auto& [name, t] : file.tensors)
    if (!expected.count(name)) unknown.push_back(name);
  if (!unknown.empty())
    fail("checkpoint '{}': {} tensor(s) that the config '{}' does not have: {}", path, unknown.size(), cfg.name,
         fmt::join(unknown, ", "));
  if (metadata) *metadata = std::move(file.metadata);
  return m;
}

std::vector<std::string> config_differences(const model::ModelConfig& a, const model::ModelConfig& b) {
  std::vector<std::string> out;
  diff_json(model::config_to_json(a), model::config_to_json(b), "", out);
  return out;
}

}  // namespace quiver::train
