// Model configs: JSON round trip, validation errors that name the field, presets and their
// parameter counts (checked against an independent closed-form count), and `quiver info`.
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "model/config.h"
#include "model/model.h"
#include "quiver/error.h"
#include "quiver/safetensors.h"
#include "testing.h"

using namespace quiver;
using namespace quiver::model;

namespace {

nlohmann::json small_config() {
  return nlohmann::json::parse(R"({
    "name": "small", "vocab_size": 11, "context": 8, "d_model": 8, "n_heads": 2, "n_layers": 2,
    "pattern": "AF", "ffn": {"kind": "swiglu", "width": 8, "law": "Q2xQ2", "schedule": "interval:8"}
  })");
}

// Expects config_from_json(j) to throw an Error whose message contains every fragment.
void expect_config_error(const nlohmann::json& j, const std::vector<std::string>& fragments) {
  try {
    config_from_json(j);
    ADD_FAILURE() << "expected an error for " << j.dump();
  } catch (const Error& e) {
    std::string what = e.what();
    for (const std::string& f : fragments) EXPECT_NE(what.find(f), std::string::npos) << "message: " << what;
  }
}

// The parameter count from the architecture's closed form, written independently of the
// model's parameter table.
int64_t closed_form_params(const ModelConfig& c) {
  const int64_t V = c.vocab_size, D = c.d_model, F = c.ffn.width, L = c.n_layers;
  const int64_t Dh = D / c.n_heads, kv = (c.n_kv_heads ? c.n_kv_heads : c.n_heads) * Dh;
  const int64_t norm = c.norm == "layernorm" ? 2 * D : D;
  int64_t n = V * D + (c.positions == "learned" ? c.context * D : 0) + norm + (c.tied_head ? 0 : D * V);
  const int64_t ffn_mats = c.ffn.kind == "swiglu" ? 3 : 2;
  const int64_t ffn = ffn_mats * D * F + (c.ffn.bias ? (ffn_mats - 1) * F + D : 0);
  for (int64_t l = 0; l < L; ++l) {
    n += 2 * norm + ffn;
    const char m = c.pattern[l];
    if (m == 'A') {
      n += 2 * D * D + 2 * D * kv + (c.attn_bias ? 2 * D + 2 * kv : 0);
    } else {
      const int64_t projections = c.relation.raw_x ? 3 : 4;
      n += projections * D * D + (c.attn_bias ? projections * D : 0);
      if (c.relation.givens && c.n_heads > 1) n += c.n_heads / 2;
      if (m == 'F') n += 1;
      if (m == 'L') n += D * Dh + Dh * D + c.n_heads + D;
    }
  }
  return n;
}

}  // namespace

TEST(Config, JsonRoundTripKeepsEveryField) {
  ModelConfig c = config_from_json(small_config());
  c.relation.tau_s = 3.0;
  c.relation.lambda_frozen = true;
  c.seed = 12345678901234ull;
  c.ffn.d_groups = {1, 3, 2, 2};
  nlohmann::ordered_json j = config_to_json(c);
  ModelConfig back = config_from_json(nlohmann::json::parse(j.dump()));
  EXPECT_EQ(config_to_json(back).dump(), j.dump());
  EXPECT_EQ(back.seed, 12345678901234ull);
  EXPECT_EQ(back.ffn.d_groups, (std::vector<int64_t>{1, 3, 2, 2}));
  EXPECT_TRUE(back.relation.lambda_frozen);
  EXPECT_EQ(back.head_dim(), 4);
  EXPECT_EQ(back.kv_heads(), 2);
}

TEST(Config, UnknownKeysAreNamed) {
  nlohmann::json j = small_config();
  j["d_modle"] = 8;
  expect_config_error(j, {"unknown key", "d_modle"});
  j = small_config();
  j["ffn"]["widht"] = 8;
  expect_config_error(j, {"unknown key", "ffn.widht"});
  j = small_config();
  j["relation"] = {{"tau", 2.0}};
  expect_config_error(j, {"unknown key", "relation.tau"});
}

TEST(Config, ImpossibleCombinationsNameTheField) {
  auto with = [](auto edit) {
    nlohmann::json j = small_config();
    edit(j);
    return j;
  };
  expect_config_error(with([](auto& j) { j["pattern"] = "AFA"; }), {"pattern", "n_layers = 2"});
  expect_config_error(with([](auto& j) { j["pattern"] = "AX"; }), {"pattern", "'X'"});
  expect_config_error(with([](auto& j) { j["n_heads"] = 3; }), {"n_heads", "not divisible"});
  // Odd heads with Givens: d 12, 3 heads of 4.
  expect_config_error(with([](auto& j) {
                        j["d_model"] = 12;
                        j["n_heads"] = 3;
                        j["ffn"]["law"] = "dense";
                      }),
                      {"relation.givens", "n_heads = 3"});
  expect_config_error(with([](auto& j) { j["ffn"]["d_groups"] = {2, 2, 2, 1}; }), {"ffn.d_groups", "sum to 7"});
  expect_config_error(with([](auto& j) { j["ffn"]["f_groups"] = {4, 4}; }), {"ffn.f_groups", "4 groups"});
  expect_config_error(with([](auto& j) { j["ffn"]["width"] = 6; }), {"ffn.f_groups", "not divisible"});
  expect_config_error(with([](auto& j) { j["vocab_size"] = -5; }), {"vocab_size", "positive"});
  expect_config_error(with([](auto& j) { j["n_layers"] = 0; }), {"n_layers", "positive"});
  expect_config_error(with([](auto& j) { j["ffn"]["width"] = -8; }), {"ffn.width", "positive"});
  expect_config_error(with([](auto& j) { j["ffn"]["law"] = "Q0"; }), {"ffn.law"});
  expect_config_error(with([](auto& j) { j["ffn"]["schedule"] = "interval:6"; }), {"ffn.schedule"});
  expect_config_error(with([](auto& j) { j["ffn"]["bias"] = true; }), {"ffn.bias"});
  expect_config_error(with([](auto& j) { j["ffn"]["kind"] = "relu"; }), {"ffn.kind", "relu"});
  expect_config_error(with([](auto& j) { j["norm"] = "batchnorm"; }), {"norm", "batchnorm"});
  expect_config_error(with([](auto& j) { j["positions"] = "alibi"; }), {"positions", "alibi"});
  expect_config_error(with([](auto& j) { j["d_model"] = "8"; }), {"d_model", "integer"});
  expect_config_error(with([](auto& j) { j["n_kv_heads"] = 3; }), {"n_kv_heads", "not a multiple"});
  expect_config_error(with([](auto& j) { j["relation"] = {{"tau_s", 0.0}}; }), {"relation.tau_s"});
  expect_config_error(with([](auto& j) {
                        j["pattern"] = "AL";
                        j["relation"] = {{"exchange_only", true}};
                      }),
                      {"relation.exchange_only"});
  expect_config_error(with([](auto& j) {
                        j["ffn"] = {{"width", 8}, {"d_groups", {4, 4}}};
                      }),
                      {"ffn.d_groups", "algebraic"});
  // RoPE needs an even head width: d 6, 2 heads of 3.
  expect_config_error(with([](auto& j) {
                        j["d_model"] = 6;
                        j["ffn"]["law"] = "dense";
                        j["ffn"].erase("schedule");
                      }),
                      {"positions", "even head width"});
}

TEST(Config, PresetsLoadAndCountExactly) {
  const std::vector<std::string> presets = {
      "alg110m-dense", "alg110m-q2x2",  "rel10m-mha",     "rel10m-relation", "rel30m-mha",   "rel30m-relation",
      "rel100m-mha",   "rel100m-relation", "hybrid30m", "tiny",            "tiny-mha",     "tiny-relation",
      "tiny-dense"};
  for (const std::string& name : presets) {
    SCOPED_TRACE(name);
    ModelConfig c = load_config(name);
    EXPECT_EQ(c.name, name);
    EXPECT_EQ(count_params(c), closed_form_params(c));
  }
  // SPEC §1.5: both pilot models have exactly 110,631,168 parameters.
  EXPECT_EQ(count_params(load_config("alg110m-dense")), 110631168);
  EXPECT_EQ(count_params(load_config("alg110m-q2x2")), 110631168);
  ModelConfig q = load_config("alg110m-q2x2");
  EXPECT_EQ(q.ffn.law, "Q2xQ2");
  EXPECT_EQ(q.ffn.schedule, "interval:768");
  EXPECT_EQ(q.ffn.d_groups, (std::vector<int64_t>(4, 192)));
  EXPECT_EQ(q.ffn.f_groups, (std::vector<int64_t>(4, 384)));
  // SPEC §2.7 shapes.
  ModelConfig h = load_config("hybrid30m");
  EXPECT_EQ(h.pattern, "LLLFLLLFLLLF");
  EXPECT_EQ(h.head_dim(), 60);
  ModelConfig r = load_config("rel100m-relation");
  EXPECT_EQ(r.pattern, std::string(20, 'F'));
  EXPECT_EQ(r.head_dim(), 80);
  EXPECT_EQ(r.vocab_size, 32000);
  ModelConfig t = load_config("tiny");
  EXPECT_NE(t.pattern.find('F'), std::string::npos);
  EXPECT_NE(t.pattern.find('L'), std::string::npos);
  EXPECT_NE(t.ffn.law, "dense");
}

TEST(Config, LoadConfigErrorsNameTheProblem) {
  try {
    load_config("no-such-preset");
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("no-such-preset"), std::string::npos) << what;
    EXPECT_NE(what.find("tiny"), std::string::npos) << "the message lists the presets: " << what;
  }
  EXPECT_THROW(load_config("missing/dir/model.json"), Error);
  std::string path = ::testing::TempDir() + "quiver_bad_config.json";
  {
    FILE* f = std::fopen(path.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs(R"({"vocab_size": 11, "context": 8, "d_model": 8, "n_heads": 2, "n_layers": 1, "pattern": "A",
                  "ffn": {"width": 8}, "extra": 1})",
               f);
    std::fclose(f);
  }
  try {
    load_config(path);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    std::string what = e.what();
    EXPECT_NE(what.find(path), std::string::npos) << what;
    EXPECT_NE(what.find("extra"), std::string::npos) << what;
  }
  std::remove(path.c_str());
}

TEST(Config, ParamTableIsAlignedWithDocumentedFlags) {
  nlohmann::json j = small_config();
  j["pattern"] = "LF";
  j["relation"] = {{"lambda_frozen", true}};
  ModelConfig c = config_from_json(j);
  std::vector<ParamInfo> table = param_table(c);
  // In order, each at the first multiple of kParamAlign after the previous one's end.
  int64_t offset = 0, count = 0;
  for (const ParamInfo& p : table) {
    SCOPED_TRACE(p.name);
    EXPECT_EQ(p.offset % kParamAlign, 0);
    EXPECT_GE(p.offset, offset);
    EXPECT_LT(p.offset - offset, kParamAlign);
    EXPECT_EQ(p.numel, shape_numel(p.shape));
    EXPECT_EQ(p.decay, p.shape.size() == 2);
    EXPECT_EQ(p.trainable, p.name != "layers.1.mixer.lambda");
    offset = p.offset + p.numel;
    count += p.numel;
  }
  EXPECT_EQ(count, count_params(c));
  Model m(c);
  EXPECT_EQ(m.num_params(), offset);
  EXPECT_EQ(m.param("layers.0.mixer.w_alpha_up").shape(), (Shape{4, 8}));
  EXPECT_EQ(m.param_info("layers.1.mixer.lambda").group, "relation");
  EXPECT_EQ(m.param_info("layers.0.mixer.theta").group, "linear_relation");
  EXPECT_THROW(m.param("layers.9.ffn.up"), Error);
}

TEST(Config, InfoCommandReportsCounts) {
  std::string cmd = quiver::testing::cli_path() + " info alg110m-q2x2 --json";
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(cmd.c_str(), "r"), pclose);
  ASSERT_TRUE(pipe);
  std::string out;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof buf, pipe.get())) out.append(buf, n);
  nlohmann::json j = nlohmann::json::parse(out);
  EXPECT_EQ(j["params"].get<int64_t>(), 110631168);
  int64_t sum = 0;
  for (auto& [group, n] : j["groups"].items()) sum += n.get<int64_t>();
  EXPECT_EQ(sum, 110631168);
  EXPECT_EQ(j["groups"]["embedding"].get<int64_t>(), (50257 + 1536) * 768);
  EXPECT_EQ(j["config"]["ffn"]["law"], "Q2xQ2");
}

TEST(Config, InfoReadsCheckpointMetadata) {
  nlohmann::json j = small_config();
  j["pattern"] = "LF";
  ModelConfig c = config_from_json(j);
  Model m(c);
  m.init(1);
  std::map<std::string, Tensor> tensors;
  for (const ParamInfo& p : m.param_table()) tensors[p.name] = m.param(p.name);
  const std::string path = ::testing::TempDir() + "quiver_info_checkpoint.safetensors";
  std::map<std::string, std::string> meta = {{"quiver.format", "quiver-checkpoint-1"},
                                             {"quiver.config", config_to_json(c).dump()},
                                             {"quiver.tokenizer", ""},
                                             {"quiver.step", "17"}};
  write_safetensors(path, tensors, meta);

  auto run = [](const std::string& cmd, int* status) {
    FILE* pipe = popen((cmd + " 2>&1").c_str(), "r");
    std::string out;
    char buf[4096];
    while (size_t n = std::fread(buf, 1, sizeof buf, pipe)) out.append(buf, n);
    *status = pclose(pipe);
    return out;
  };
  int status = 0;
  std::string out = run(quiver::testing::cli_path() + " info " + path + " --json", &status);
  ASSERT_EQ(status, 0) << out;
  nlohmann::json info = nlohmann::json::parse(out);
  EXPECT_EQ(info["params"].get<int64_t>(), count_params(m.config()));
  EXPECT_EQ(info["checkpoint"]["step"], "17");
  EXPECT_EQ(info["config"]["pattern"], "LF");

  // A checkpoint whose tensors do not match its config is an error naming the tensor.
  tensors.erase("layers.1.mixer.lambda");
  write_safetensors(path, tensors, meta);
  out = run(quiver::testing::cli_path() + " info " + path, &status);
  EXPECT_NE(status, 0);
  EXPECT_NE(out.find("layers.1.mixer.lambda"), std::string::npos) << out;
  std::remove(path.c_str());
}
