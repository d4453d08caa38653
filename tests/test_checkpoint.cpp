// Checkpoints: round trip of every parameter and the metadata, the file as a plain
// safetensors file, and the errors for bad files (missing, extra, mis-shaped or mis-typed
// tensors, wrong format tag, corrupt config, truncation), and a failed write that must leave
// the previous checkpoint intact.
#include <gtest/gtest.h>

#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "quiver/safetensors.h"
#include "train/checkpoint.h"

using namespace quiver;
namespace fs = std::filesystem;

namespace {

// A tiny model of each mixer with an algebraic FFN, so that every parameter kind appears.
model::ModelConfig tiny_config() {
  model::ModelConfig c;
  c.name = "ckpt-test";
  c.vocab_size = 61;
  c.context = 16;
  c.d_model = 16;
  c.n_heads = 2;
  c.n_layers = 3;
  c.pattern = "AFL";
  c.ffn.width = 32;
  c.ffn.law = "Q2xQ2";
  c.ffn.schedule = "interval:8";
  c.tied_head = false;
  return c;
}

class Checkpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / fmt::format("quiver_ckpt_{}_{}", ::getpid(), info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string file(const std::string& name) const { return (dir_ / name).string(); }

  // Saves a fresh tiny model and returns its file's tensors and metadata for tampering.
  TensorFile saved(model::Model& m) {
    train::save_checkpoint(file("good.safetensors"), m, {{train::kMetaStep, "7"}});
    return read_safetensors(file("good.safetensors"));
  }

  // Expects load_checkpoint(path) to fail with a message containing every fragment.
  static void expect_load_error(const std::string& path, std::initializer_list<std::string> fragments) {
    try {
      train::load_checkpoint(path);
      ADD_FAILURE() << "loading " << path << " did not fail";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(path), std::string::npos) << msg;
      for (const std::string& f : fragments) EXPECT_NE(msg.find(f), std::string::npos) << "'" << f << "' not in: " << msg;
    }
  }

  fs::path dir_;
};

}  // namespace

TEST_F(Checkpoint, RoundTripKeepsEveryParameterAndTheMetadata) {
  model::Model m(tiny_config());
  m.init(11);
  const std::string path = file("model.safetensors");
  train::save_checkpoint(path, m, {{train::kMetaStep, "42"}, {train::kMetaTokenizer, "tok/sp.model"},
                                   {"user.note", "hello"}});
  std::map<std::string, std::string> meta;
  auto loaded = train::load_checkpoint(path, &meta);
  EXPECT_EQ(meta.at(train::kMetaFormat), train::kCheckpointFormat);
  EXPECT_EQ(meta.at(train::kMetaStep), "42");
  EXPECT_EQ(meta.at(train::kMetaTokenizer), "tok/sp.model");
  EXPECT_EQ(meta.at("user.note"), "hello");
  EXPECT_TRUE(train::config_differences(loaded->config(), m.config()).empty());
  ASSERT_EQ(loaded->num_params(), m.num_params());
  EXPECT_EQ(std::memcmp(loaded->params().raw(), m.params().raw(), m.params().nbytes()), 0);

  // As a plain safetensors file: exactly one F32 tensor per parameter, with its shape.
  TensorFile raw = read_safetensors(path);
  EXPECT_EQ(raw.tensors.size(), m.param_table().size());
  for (const model::ParamInfo& info : m.param_table()) {
    ASSERT_TRUE(raw.has(info.name)) << info.name;
    EXPECT_EQ(raw.get(info.name).shape(), info.shape) << info.name;
    EXPECT_EQ(raw.get(info.name).dtype(), DType::F32);
    EXPECT_EQ(rel_error(raw.get(info.name), m.param(info.name)), 0.0) << info.name;
  }
  EXPECT_EQ(train::read_checkpoint_config(path).pattern, "AFL");
}

TEST_F(Checkpoint, F64ModelIsStoredAsF32) {
  model::Model m(tiny_config(), DType::F64);
  m.init(3);
  train::save_checkpoint(file("m.safetensors"), m, {});
  auto loaded = train::load_checkpoint(file("m.safetensors"));
  EXPECT_EQ(loaded->params().dtype(), DType::F32);
  EXPECT_LT(rel_error(loaded->params(), m.params()), 1e-7);
}

TEST_F(Checkpoint, BadTensorsAreNamed) {
  model::Model m(tiny_config());
  m.init(1);
  TensorFile good = saved(m);
  const std::string victim = "layers.1.mixer.w1";
  ASSERT_TRUE(good.has(victim));

  auto missing = good.tensors;
  missing.erase(victim);
  write_safetensors(file("missing.safetensors"), missing, good.metadata);
  expect_load_error(file("missing.safetensors"), {victim, "missing"});

  auto extra = good.tensors;
  extra["layers.9.ffn.up"] = Tensor::zeros({2, 2}, DType::F32);
  write_safetensors(file("extra.safetensors"), extra, good.metadata);
  expect_load_error(file("extra.safetensors"), {"layers.9.ffn.up"});

  auto reshaped = good.tensors;
  reshaped[victim] = Tensor::zeros({16, 15}, DType::F32);
  write_safetensors(file("shape.safetensors"), reshaped, good.metadata);
  expect_load_error(file("shape.safetensors"), {victim, "[16, 15]", "[16, 16]"});

  auto retyped = good.tensors;
  retyped[victim] = good.get(victim).to(DType::BF16);
  write_safetensors(file("dtype.safetensors"), retyped, good.metadata);
  expect_load_error(file("dtype.safetensors"), {victim, "BF16", "F32"});
}

TEST_F(Checkpoint, BadMetadataIsNamed) {
  model::Model m(tiny_config());
  m.init(1);
  TensorFile good = saved(m);

  auto meta = good.metadata;
  meta[train::kMetaFormat] = "quiver-checkpoint-0";
  write_safetensors(file("format.safetensors"), good.tensors, meta);
  expect_load_error(file("format.safetensors"), {"quiver-checkpoint-0", train::kCheckpointFormat});

  meta = good.metadata;
  meta.erase(train::kMetaFormat);
  write_safetensors(file("noformat.safetensors"), good.tensors, meta);
  expect_load_error(file("noformat.safetensors"), {"not a quiver checkpoint"});

  meta = good.metadata;
  meta[train::kMetaConfig] = "{\"name\": ";
  write_safetensors(file("json.safetensors"), good.tensors, meta);
  expect_load_error(file("json.safetensors"), {train::kMetaConfig, "not valid JSON"});

  meta = good.metadata;
  auto cfg = nlohmann::json::parse(good.metadata.at(train::kMetaConfig));
  cfg["ffn"]["law"] = "no-such-law";
  meta[train::kMetaConfig] = cfg.dump();
  write_safetensors(file("law.safetensors"), good.tensors, meta);
  expect_load_error(file("law.safetensors"), {"ffn.law"});
}

TEST_F(Checkpoint, TruncatedAndForeignFilesAreNamed) {
  model::Model m(tiny_config());
  m.init(1);
  saved(m);
  const std::string truncated = file("truncated.safetensors");
  fs::copy_file(file("good.safetensors"), truncated);
  fs::resize_file(truncated, fs::file_size(truncated) - 100);
  expect_load_error(truncated, {"cannot load checkpoint"});

  const std::string garbage = file("garbage.safetensors");
  {
    std::FILE* f = std::fopen(garbage.c_str(), "wb");
    std::fputs("this is not a checkpoint at all", f);
    std::fclose(f);
  }
  expect_load_error(garbage, {"cannot load checkpoint"});
  expect_load_error(file("absent.safetensors"), {"cannot"});
}

TEST_F(Checkpoint, FailedWriteLeavesThePreviousCheckpointIntact) {
  model::Model m(tiny_config());
  m.init(1);
  const std::string path = file("model.safetensors");
  train::save_checkpoint(path, m, {{train::kMetaStep, "1"}});
  const auto size_before = fs::file_size(path);

  model::Model other(tiny_config());
  other.init(2);
  // A file-size limit below the checkpoint's size makes the write fail as a full disk would.
  struct rlimit saved_limit {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &saved_limit), 0);
  auto saved_handler = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = saved_limit;
  small.rlim_cur = 4096;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  bool threw = false;
  try {
    train::save_checkpoint(path, other, {{train::kMetaStep, "2"}});
  } catch (const Error& e) {
    threw = true;
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &saved_limit);
  std::signal(SIGXFSZ, saved_handler);
  EXPECT_TRUE(threw);

  EXPECT_EQ(fs::file_size(path), size_before);
  std::map<std::string, std::string> meta;
  auto loaded = train::load_checkpoint(path, &meta);
  EXPECT_EQ(meta.at(train::kMetaStep), "1");
  EXPECT_EQ(std::memcmp(loaded->params().raw(), m.params().raw(), m.params().nbytes()), 0);
  int leftovers = 0;
  for (const auto& entry : fs::directory_iterator(dir_)) leftovers += entry.path().filename() != "model.safetensors";
  EXPECT_EQ(leftovers, 0);
}

TEST(ConfigDifferences, NamesEachDifferingField) {
  model::ModelConfig a = tiny_config(), b = tiny_config();
  EXPECT_TRUE(train::config_differences(a, b).empty());
  b.n_layers = 4;
  b.pattern = "AFLA";
  b.ffn.law = "Q4";
  b.relation.tau_s = 1.5;
  const auto diffs = train::config_differences(a, b);
  ASSERT_EQ(diffs.size(), 4u);
  std::string all;
  for (const auto& d : diffs) all += d + "\n";
  EXPECT_NE(all.find("n_layers: 3 vs 4"), std::string::npos) << all;
  EXPECT_NE(all.find("pattern: \"AFL\" vs \"AFLA\""), std::string::npos) << all;
  EXPECT_NE(all.find("ffn.law: \"Q2xQ2\" vs \"Q4\""), std::string::npos) << all;
  EXPECT_NE(all.find("relation.tau_s: 2.0 vs 1.5"), std::string::npos) << all;
}
