// `quiver info CONFIG_OR_CHECKPOINT [--json]`: the model's configuration summary and its
// parameter counts by group, from a preset name, a config .json, or a checkpoint .safetensors
// (whose "quiver.config" metadata holds the config).
//
// For a checkpoint only the safetensors header is read (8-byte length + JSON), so inspecting a
// large checkpoint is instant; its tensors are checked against the config's parameter table by
// name and shape.
#include <fmt/format.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "model/config.h"
#include "model/model.h"
#include "quiver/error.h"

namespace quiver::cli {

namespace {

struct InfoArgs {
  std::string source;
  bool json = false;
};

struct CheckpointHeader {
  std::map<std::string, std::string> metadata;
  std::map<std::string, std::pair<std::string, Shape>> tensors;  // name → (dtype, shape)
};

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

CheckpointHeader read_header(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  QV_CHECK(in.good(), "cannot open checkpoint {}", path);
  unsigned char len_bytes[8];
  in.read(reinterpret_cast<char*>(len_bytes), 8);
  QV_CHECK(in.gcount() == 8, "checkpoint {}: shorter than the 8-byte safetensors header length", path);
  uint64_t len = 0;
  for (int i = 7; i >= 0; --i) len = (len << 8) | len_bytes[i];
  QV_CHECK(len > 0 && len < (100ull << 20), "checkpoint {}: implausible safetensors header length {}", path, len);
  std::string text(len, '\0');
  in.read(text.data(), static_cast<std::streamsize>(len));
  QV_CHECK(static_cast<uint64_t>(in.gcount()) == len, "checkpoint {}: truncated safetensors header", path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    fail("checkpoint {}: safetensors header is not valid JSON: {}", path, e.what());
  }
  QV_CHECK(j.is_object(), "checkpoint {}: safetensors header is not a JSON object", path);
  CheckpointHeader h;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "__metadata__") {
      QV_CHECK(it->is_object(), "checkpoint {}: __metadata__ is not an object", path);
      for (auto m = it->begin(); m != it->end(); ++m)
        if (m->is_string()) h.metadata[m.key()] = m->get<std::string>();
      continue;
    }
    try {
      h.tensors[it.key()] = {(*it).at("dtype").get<std::string>(), (*it).at("shape").get<Shape>()};
    } catch (const nlohmann::json::exception& e) {
      fail("checkpoint {}: tensor \"{}\" has a malformed header entry: {}", path, it.key(), e.what());
    }
  }
  return h;
}

std::string yes_no(bool b) { return b ? "yes" : "no"; }

std::string with_commas(int64_t n) {
  std::string digits = std::to_string(n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

void run(const InfoArgs& a) {
  model::ModelConfig cfg;
  nlohmann::ordered_json checkpoint;
  if (ends_with(a.source, ".safetensors")) {
    CheckpointHeader h = read_header(a.source);
    auto meta = [&](const char* key) -> std::string {
      auto it = h.metadata.find(key);
      return it == h.metadata.end() ? std::string() : it->second;
    };
    QV_CHECK(!meta("quiver.config").empty(),
             "checkpoint {}: no \"quiver.config\" metadata (not a quiver checkpoint?)", a.source);
    try {
      cfg = model::config_from_json(nlohmann::json::parse(meta("quiver.config")));
    } catch (const nlohmann::json::parse_error& e) {
      fail("checkpoint {}: \"quiver.config\" metadata is not valid JSON: {}", a.source, e.what());
    } catch (const Error& e) {
      fail("checkpoint {}: \"quiver.config\": {}", a.source, e.what());
    }
    for (const model::ParamInfo& p : model::param_table(cfg)) {
      auto it = h.tensors.find(p.name);
      QV_CHECK(it != h.tensors.end(), "checkpoint {}: tensor \"{}\" of the config is missing", a.source, p.name);
      QV_CHECK(it->second.second == p.shape, "checkpoint {}: tensor \"{}\": expected shape {}, got {}", a.source,
               p.name, shape_str(p.shape), shape_str(it->second.second));
    }
    checkpoint["path"] = a.source;
    checkpoint["format"] = meta("quiver.format");
    checkpoint["step"] = meta("quiver.step");
    checkpoint["tokenizer"] = meta("quiver.tokenizer");
    checkpoint["tensors"] = h.tensors.size();
  } else {
    cfg = model::load_config(a.source);
  }

  std::vector<model::ParamInfo> table = model::param_table(cfg);
  std::map<std::string, int64_t> groups;
  int64_t total = 0, decayed = 0;
  for (const model::ParamInfo& p : table) {
    groups[p.group] += p.numel;
    total += p.numel;
    if (p.decay) decayed += p.numel;
  }
  const int64_t non_embedding = total - groups["embedding"];

  if (a.json) {
    nlohmann::ordered_json j;
    j["name"] = cfg.name;
    j["params"] = total;
    j["params_non_embedding"] = non_embedding;
    j["params_decayed"] = decayed;
    j["groups"] = groups;
    j["tensors"] = table.size();
    j["config"] = model::config_to_json(cfg);
    if (!checkpoint.empty()) j["checkpoint"] = checkpoint;
    fmt::print("{}\n", j.dump(2));
    return;
  }

  fmt::print("model {}\n", cfg.name.empty() ? "(unnamed)" : cfg.name);
  if (!checkpoint.empty())
    fmt::print("  checkpoint     {} (format {}, step {}, tokenizer {})\n", a.source,
               checkpoint["format"].get<std::string>(), checkpoint["step"].get<std::string>(),
               checkpoint["tokenizer"].get<std::string>().empty() ? "-" : checkpoint["tokenizer"].get<std::string>());
  fmt::print("  vocab          {}\n", cfg.vocab_size);
  fmt::print("  context        {}\n", cfg.context);
  fmt::print("  width          d_model {}, {} heads of {}{}\n", cfg.d_model, cfg.n_heads, cfg.head_dim(),
             cfg.kv_heads() != cfg.n_heads ? fmt::format(" ({} KV heads)", cfg.kv_heads()) : "");
  fmt::print("  layers         {}, pattern {} (A attention, F Full Relation, L Linear Relation)\n", cfg.n_layers,
             cfg.pattern);
  std::string ffn = fmt::format("{} F = {}, law {}", cfg.ffn.kind, cfg.ffn.width, cfg.ffn.law);
  if (cfg.ffn.law != "dense") {
    ffn += ", schedule " + cfg.ffn.schedule;
    if (!cfg.ffn.d_groups.empty()) ffn += fmt::format(", D groups {}", fmt::join(cfg.ffn.d_groups, ","));
    if (!cfg.ffn.f_groups.empty()) ffn += fmt::format(", F groups {}", fmt::join(cfg.ffn.f_groups, ","));
  }
  fmt::print("  ffn            {}{}\n", ffn, cfg.ffn.bias ? ", with bias" : "");
  fmt::print("  norm           {} (eps {})\n", cfg.norm, cfg.norm_eps);
  fmt::print("  positions      {}\n",
             cfg.positions == "rope" ? fmt::format("RoPE (base {})", cfg.rope_base) : std::string("learned absolute"));
  fmt::print("  mixer biases   {}\n  tied head      {}\n", yes_no(cfg.attn_bias), yes_no(cfg.tied_head));
  if (cfg.pattern.find_first_of("FL") != std::string::npos) {
    const model::RelationConfig& r = cfg.relation;
    fmt::print("  relation       tau_s {}, lambda {}{}, givens {}, exchange_only {}, raw_x {}\n", r.tau_s,
               r.lambda_init, r.lambda_frozen ? " (frozen)" : "", yes_no(r.givens), yes_no(r.exchange_only),
               yes_no(r.raw_x));
  }
  fmt::print("  init           std {}, seed {}\n\n", cfg.init_std, cfg.seed);
  fmt::print("parameters ({} tensors)\n", table.size());
  for (const auto& [group, n] : groups)
    fmt::print("  {:<16} {:>15}  {:5.1f}%\n", group, with_commas(n), 100.0 * static_cast<double>(n) / total);
  fmt::print("  {:<16} {:>15}\n", "total", with_commas(total));
  fmt::print("  {:<16} {:>15}\n", "non-embedding", with_commas(non_embedding));
}

}  // namespace

void register_info(CLI::App& app) {
  auto args = std::make_shared<InfoArgs>();
  CLI::App* cmd = app.add_subcommand(
      "info",
      "Print a model's configuration and parameter counts by group.\n"
      "SOURCE: a preset name (configs/NAME.json), a config .json, or a checkpoint .safetensors.");
  cmd->add_option("source", args->source, "preset name, config .json, or checkpoint .safetensors")->required();
  cmd->add_flag("--json", args->json, "print JSON (total under \"params\", per group under \"groups\")");
  cmd->callback([args] { run(*args); });
}

}  // namespace quiver::cli
