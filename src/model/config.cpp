#include "model/config.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "algebra/law.h"
#include "quiver/error.h"

namespace quiver::model {

namespace fs = std::filesystem;
using nlohmann::json;

int64_t ModelConfig::head_dim() const { return n_heads > 0 ? d_model / n_heads : 0; }
int64_t ModelConfig::kv_heads() const { return n_kv_heads > 0 ? n_kv_heads : n_heads; }

namespace {

// Reads j[key] into out when present, with errors naming the dotted field.
class Reader {
 public:
  Reader(const json& j, std::string prefix) : j_(j), prefix_(std::move(prefix)) {
    if (!j_.is_object())
      fail("config{}: expected a JSON object, got {}", prefix_.empty() ? "" : " field \"" + prefix_ + "\"",
           j_.type_name());
  }

  const json* find(const char* key) {
    known_.insert(key);
    auto it = j_.find(key);
    return it == j_.end() ? nullptr : &*it;
  }
  std::string field(const char* key) const { return prefix_.empty() ? key : prefix_ + "." + key; }

  void read(const char* key, std::string& out) {
    if (const json* v = find(key)) {
      if (!v->is_string()) fail("config field \"{}\": expected a string, got {}", field(key), v->type_name());
      out = v->get<std::string>();
    }
  }
  void read(const char* key, int64_t& out) {
    if (const json* v = find(key)) {
      if (!v->is_number_integer())
        fail("config field \"{}\": expected an integer, got {} {}", field(key), v->type_name(), v->dump());
      out = v->get<int64_t>();
    }
  }
  void read(const char* key, uint64_t& out) {
    if (const json* v = find(key)) {
      if (!v->is_number_unsigned())
        fail("config field \"{}\": expected a non-negative integer, got {} {}", field(key), v->type_name(),
             v->dump());
      out = v->get<uint64_t>();
    }
  }
  void read(const char* key, double& out) {
    if (const json* v = find(key)) {
      if (!v->is_number()) fail("config field \"{}\": expected a number, got {}", field(key), v->type_name());
      out = v->get<double>();
    }
  }
  void read(const char* key, bool& out) {
    if (const json* v = find(key)) {
      if (!v->is_boolean()) fail("config field \"{}\": expected true or false, got {}", field(key), v->dump());
      out = v->get<bool>();
    }
  }
  void read(const char* key, std::vector<int64_t>& out) {
    if (const json* v = find(key)) {
      if (!v->is_array()) fail("config field \"{}\": expected an array of integers, got {}", field(key), v->type_name());
      out.clear();
      for (size_t i = 0; i < v->size(); ++i) {
        if (!(*v)[i].is_number_integer())
          fail("config field \"{}\": entry {} is {}, expected an integer", field(key), i, (*v)[i].dump());
        out.push_back((*v)[i].get<int64_t>());
      }
    }
  }

  // After every read: a key that no read asked for is unknown.
  void reject_unknown() const {
    for (auto it = j_.begin(); it != j_.end(); ++it)
      if (!known_.count(it.key()))
        fail("config: unknown key \"{}\" (known keys{}: {})", field(it.key().c_str()),
             prefix_.empty() ? "" : " of \"" + prefix_ + "\"", fmt::join(known_, ", "));
  }

 private:
  const json& j_;
  std::string prefix_;
  std::set<std::string> known_;
};

void check_positive(int64_t value, const char* field) {
  QV_CHECK(value > 0, "config field \"{}\": must be positive, got {}", field, value);
}

void check_groups(const std::vector<int64_t>& groups, int q, int64_t total, const char* field,
                  const char* total_name) {
  if (groups.empty()) {
    QV_CHECK(total % q == 0,
             "config field \"{}\": empty means {} equal groups, but {} = {} is not divisible by {}", field,
             q, total_name, total, q);
    return;
  }
  QV_CHECK(static_cast<int>(groups.size()) == q, "config field \"{}\": the law has {} groups, got {} widths",
           field, q, groups.size());
  int64_t sum = 0;
  for (size_t i = 0; i < groups.size(); ++i) {
    QV_CHECK(groups[i] > 0, "config field \"{}\": width {} is {}, must be positive", field, i, groups[i]);
    sum += groups[i];
  }
  QV_CHECK(sum == total, "config field \"{}\": widths sum to {}, expected {} = {}", field, sum, total_name,
           total);
}

}  // namespace

void validate(const ModelConfig& c) {
  check_positive(c.vocab_size, "vocab_size");
  check_positive(c.context, "context");
  check_positive(c.d_model, "d_model");
  check_positive(c.n_heads, "n_heads");
  check_positive(c.n_layers, "n_layers");
  QV_CHECK(c.vocab_size <= (int64_t{1} << 31) - 1, "config field \"vocab_size\": {} does not fit int32 token ids",
           c.vocab_size);
  QV_CHECK(c.d_model % c.n_heads == 0, "config field \"n_heads\": d_model = {} is not divisible by n_heads = {}",
           c.d_model, c.n_heads);
  QV_CHECK(c.n_kv_heads >= 0, "config field \"n_kv_heads\": must be ≥ 0 (0 = n_heads), got {}", c.n_kv_heads);
  QV_CHECK(c.n_heads % c.kv_heads() == 0,
           "config field \"n_kv_heads\": n_heads = {} is not a multiple of n_kv_heads = {}", c.n_heads,
           c.n_kv_heads);

  QV_CHECK(static_cast<int64_t>(c.pattern.size()) == c.n_layers,
           "config field \"pattern\": \"{}\" has {} characters, expected one per layer (n_layers = {})",
           c.pattern, c.pattern.size(), c.n_layers);
  bool has_full = false, has_linear = false;
  for (size_t i = 0; i < c.pattern.size(); ++i) {
    char m = c.pattern[i];
    QV_CHECK(m == 'A' || m == 'F' || m == 'L',
             "config field \"pattern\": layer {} has mixer '{}', expected A (attention), F (Full Relation) "
             "or L (Linear Relation)",
             i, m);
    has_full |= m == 'F';
    has_linear |= m == 'L';
  }

  QV_CHECK(c.norm == "rmsnorm" || c.norm == "layernorm",
           "config field \"norm\": expected \"rmsnorm\" or \"layernorm\", got \"{}\"", c.norm);
  QV_CHECK(c.norm_eps > 0 && std::isfinite(c.norm_eps), "config field \"norm_eps\": must be positive, got {}",
           c.norm_eps);
  QV_CHECK(c.positions == "rope" || c.positions == "learned",
           "config field \"positions\": expected \"rope\" or \"learned\", got \"{}\"", c.positions);
  if (c.positions == "rope") {
    QV_CHECK(c.rope_base > 1 && std::isfinite(c.rope_base), "config field \"rope_base\": must be > 1, got {}",
             c.rope_base);
    QV_CHECK(c.head_dim() % 2 == 0,
             "config field \"positions\": RoPE needs an even head width, got d_model / n_heads = {}",
             c.head_dim());
  }
  QV_CHECK(c.init_std > 0 && std::isfinite(c.init_std), "config field \"init_std\": must be positive, got {}",
           c.init_std);

  const RelationConfig& r = c.relation;
  QV_CHECK(r.tau_s > 0 && std::isfinite(r.tau_s), "config field \"relation.tau_s\": must be positive, got {}",
           r.tau_s);
  QV_CHECK(std::isfinite(r.lambda_init), "config field \"relation.lambda_init\": must be finite, got {}",
           r.lambda_init);
  if ((has_full || has_linear) && r.givens)
    QV_CHECK(c.n_heads == 1 || c.n_heads % 2 == 0,
             "config field \"relation.givens\": Givens mixing pairs heads and needs an even n_heads (or 1), "
             "got n_heads = {}; set relation.givens = false or change n_heads",
             c.n_heads);
  QV_CHECK(!(r.exchange_only && has_linear),
           "config field \"relation.exchange_only\": the exchange-only ablation exists for Full Relation (F) "
           "layers only, but pattern \"{}\" has Linear Relation (L) layers",
           c.pattern);
  const FfnConfig& f = c.ffn;
  QV_CHECK(f.kind == "swiglu" || f.kind == "gelu",
           "config field \"ffn.kind\": expected \"swiglu\" or \"gelu\", got \"{}\"", f.kind);
  check_positive(f.width, "ffn.width");
  if (f.law == "dense") {
    QV_CHECK(f.d_groups.empty(), "config field \"ffn.d_groups\": group widths need an algebraic ffn.law, got "
             "law \"dense\"");
    QV_CHECK(f.f_groups.empty(), "config field \"ffn.f_groups\": group widths need an algebraic ffn.law, got "
             "law \"dense\"");
  } else {
    algebra::Law law = [&] {
      try {
        return algebra::Law::parse(f.law);
      } catch (const Error& e) {
        fail("config field \"ffn.law\": {}", e.what());
      }
    }();
    try {
      algebra::Schedule::parse(f.schedule).validate(law.q());
    } catch (const Error& e) {
      fail("config field \"ffn.schedule\": {}", e.what());
    }
    check_groups(f.d_groups, law.q(), c.d_model, "ffn.d_groups", "d_model");
    check_groups(f.f_groups, law.q(), f.width, "ffn.f_groups", "ffn.width");
    QV_CHECK(!f.bias, "config field \"ffn.bias\": biases are not supported with an algebraic ffn.law (\"{}\")",
             f.law);
  }
}

ModelConfig config_from_json(const json& j) {
  ModelConfig c;
  Reader top(j, "");
  top.read("name", c.name);
  top.read("vocab_size", c.vocab_size);
  top.read("context", c.context);
  top.read("d_model", c.d_model);
  top.read("n_heads", c.n_heads);
  top.read("n_kv_heads", c.n_kv_heads);
  top.read("n_layers", c.n_layers);
  top.read("pattern", c.pattern);
  if (const json* v = top.find("ffn")) {
    Reader r(*v, "ffn");
    r.read("kind", c.ffn.kind);
    r.read("width", c.ffn.width);
    r.read("law", c.ffn.law);
    r.read("schedule", c.ffn.schedule);
    r.read("d_groups", c.ffn.d_groups);
    r.read("f_groups", c.ffn.f_groups);
    r.read("bias", c.ffn.bias);
    r.reject_unknown();
  }
  top.read("norm", c.norm);
  top.read("norm_eps", c.norm_eps);
  top.read("positions", c.positions);
  top.read("rope_base", c.rope_base);
  top.read("attn_bias", c.attn_bias);
  top.read("tied_head", c.tied_head);
  if (const json* v = top.find("relation")) {
    Reader r(*v, "relation");
    r.read("tau_s", c.relation.tau_s);
    r.read("lambda_init", c.relation.lambda_init);
    r.read("lambda_frozen", c.relation.lambda_frozen);
    r.read("givens", c.relation.givens);
    r.read("exchange_only", c.relation.exchange_only);
    r.read("raw_x", c.relation.raw_x);
    r.reject_unknown();
  }
  top.read("init_std", c.init_std);
  top.read("seed", c.seed);
  top.reject_unknown();
  validate(c);
  return c;
}

nlohmann::ordered_json config_to_json(const ModelConfig& c) {
  nlohmann::ordered_json j;
  j["name"] = c.name;
  j["vocab_size"] = c.vocab_size;
  j["context"] = c.context;
  j["d_model"] = c.d_model;
  j["n_heads"] = c.n_heads;
  j["n_kv_heads"] = c.n_kv_heads;
  j["n_layers"] = c.n_layers;
  j["pattern"] = c.pattern;
  nlohmann::ordered_json f;
  f["kind"] = c.ffn.kind;
  f["width"] = c.ffn.width;
  f["law"] = c.ffn.law;
  f["schedule"] = c.ffn.schedule;
  f["d_groups"] = c.ffn.d_groups;
  f["f_groups"] = c.ffn.f_groups;
  f["bias"] = c.ffn.bias;
  j["ffn"] = f;
  j["norm"] = c.norm;
  j["norm_eps"] = c.norm_eps;
  j["positions"] = c.positions;
  j["rope_base"] = c.rope_base;
  j["attn_bias"] = c.attn_bias;
  j["tied_head"] = c.tied_head;
  nlohmann::ordered_json r;
  r["tau_s"] = c.relation.tau_s;
  r["lambda_init"] = c.relation.lambda_init;
  r["lambda_frozen"] = c.relation.lambda_frozen;
  r["givens"] = c.relation.givens;
  r["exchange_only"] = c.relation.exchange_only;
  r["raw_x"] = c.relation.raw_x;
  j["relation"] = r;
  j["init_std"] = c.init_std;
  j["seed"] = c.seed;
  return j;
}

namespace {

// Directories that may hold presets: ./configs, then beside the executable.
std::vector<fs::path> preset_dirs() {
  std::vector<fs::path> dirs{fs::path("configs")};
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    fs::path bin = exe.parent_path();
    for (const char* rel : {"../../configs", "../configs", "configs"}) dirs.push_back(bin / rel);
  }
  return dirs;
}

bool looks_like_path(const std::string& s) {
  return s.find('/') != std::string::npos || (s.size() > 5 && s.compare(s.size() - 5, 5, ".json") == 0);
}

ModelConfig load_file(const fs::path& path) {
  std::ifstream in(path);
  QV_CHECK(in.good(), "cannot open config file {}", path.string());
  json j;
  try {
    j = json::parse(in);
  } catch (const json::parse_error& e) {
    fail("config file {}: not valid JSON: {}", path.string(), e.what());
  }
  try {
    return config_from_json(j);
  } catch (const Error& e) {
    fail("{}: {}", path.string(), e.what());
  }
}

}  // namespace

std::vector<std::string> preset_names() {
  std::set<std::string> names;
  for (const fs::path& dir : preset_dirs()) {
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) continue;
    for (const auto& entry : fs::directory_iterator(dir, ec))
      if (entry.path().extension() == ".json") names.insert(entry.path().stem().string());
  }
  return {names.begin(), names.end()};
}

ModelConfig load_config(const std::string& path_or_preset) {
  QV_CHECK(!path_or_preset.empty(), "no model config given (a preset name or a .json path)");
  if (looks_like_path(path_or_preset)) {
    QV_CHECK(fs::exists(path_or_preset), "config file {} does not exist", path_or_preset);
    return load_file(path_or_preset);
  }
  for (const fs::path& dir : preset_dirs()) {
    fs::path candidate = dir / (path_or_preset + ".json");
    std::error_code ec;
    if (fs::is_regular_file(candidate, ec)) return load_file(candidate);
  }
  std::vector<std::string> names = preset_names();
  fail("unknown model preset \"{}\" (no configs/{}.json found; presets: {})", path_or_preset, path_or_preset,
       names.empty() ? std::string("none found") : fmt::format("{}", fmt::join(names, ", ")));
}

}  // namespace quiver::model
