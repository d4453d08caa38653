#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "quiver/rng.h"
#include "quiver/safetensors.h"
#include "testing.h"

using namespace quiver;
namespace fs = std::filesystem;

namespace {

using Bytes = std::vector<unsigned char>;

// Each test gets its own fresh directory under the system temporary directory.
class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static std::atomic<int> counter{0};
    Rng rng(static_cast<uint64_t>(::getpid()) * 1000003u + counter++);
    dir_ = fs::temp_directory_path() /
           fmt::format("quiver_safetensors_{}_{:016x}", ::getpid(), rng.next_u64());
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  std::string file(const std::string& name) const { return (dir_ / name).string(); }

  std::vector<std::string> listing() const {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(dir_)) names.push_back(entry.path().filename());
    std::sort(names.begin(), names.end());
    return names;
  }

  fs::path dir_;
};

Bytes read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::string& path, const Bytes& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// A file in the published layout: 8-byte little-endian header length, the JSON text, data.
Bytes make_file(const std::string& header, const Bytes& data, int64_t length_override = -1) {
  uint64_t n = length_override >= 0 ? static_cast<uint64_t>(length_override) : header.size();
  Bytes out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<unsigned char>(n >> (8 * i)));
  out.insert(out.end(), header.begin(), header.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

// Reading `path` throws quiver::Error whose message names the file and contains `word`.
void expect_read_error(const std::string& path, const std::string& word) {
  try {
    read_safetensors(path);
    ADD_FAILURE() << "reading succeeded; expected an error containing '" << word << "'";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find(word), std::string::npos) << "message: " << msg << "\nexpected: " << word;
    EXPECT_NE(msg.find(path), std::string::npos) << "message does not name the file: " << msg;
  }
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  Tensor ca = a.clone(), cb = b.clone();
  return std::memcmp(ca.raw(), cb.raw(), ca.nbytes()) == 0;
}

}  // namespace

TEST_F(SafetensorsTest, RoundTripsDtypesShapesAndMetadata) {
  Rng rng(7);
  std::map<std::string, Tensor> tensors;
  tensors["w.f32"] = quiver::testing::random_tensor({3, 5}, DType::F32, rng);
  tensors["w.f64"] = quiver::testing::random_tensor({2, 3, 4}, DType::F64, rng);
  tensors["w.bf16"] = quiver::testing::random_tensor({7}, DType::BF16, rng);
  tensors["scalar"] = Tensor::empty({}, DType::F64);
  tensors["scalar"].fill(-2.5);
  tensors["empty"] = Tensor::empty({0, 4}, DType::F32);
  Tensor base = quiver::testing::random_tensor({4, 3}, DType::F64, rng);
  tensors["transposed"] = base.transpose(0, 1);
  ASSERT_FALSE(tensors["transposed"].is_contiguous());
  const std::map<std::string, std::string> metadata = {{"format", "pt"},
                                                       {"config", R"({"layers": 6, "name": "é"})"}};
  const std::string path = file("model.safetensors");
  write_safetensors(path, tensors, metadata);

  TensorFile f = read_safetensors(path);
  EXPECT_EQ(f.metadata, metadata);
  EXPECT_EQ(f.path, path);
  ASSERT_EQ(f.tensors.size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    ASSERT_TRUE(f.has(name)) << name;
    const Tensor& r = f.get(name);
    EXPECT_TRUE(r.is_contiguous()) << name;
    EXPECT_TRUE(same_bytes(r, t)) << name;
  }
  EXPECT_EQ(f.get("scalar").ndim(), 0);
  EXPECT_EQ(f.get("scalar").at({}), -2.5);
  EXPECT_EQ(f.get("transposed").shape(), (Shape{3, 4}));
  EXPECT_EQ(f.get("transposed").at({2, 1}), base.at({1, 2}));
  EXPECT_EQ(listing(), std::vector<std::string>{"model.safetensors"});
}

TEST_F(SafetensorsTest, WriterFollowsPublishedLayout) {
  std::map<std::string, Tensor> tensors;
  tensors["b"] = Tensor::empty({2}, DType::F32);
  tensors["b"].fill(1.5);
  tensors["a"] = Tensor::empty({1}, DType::F64);
  tensors["a"].fill(-0.25);
  const std::string path = file("layout.safetensors");
  write_safetensors(path, tensors, {{"k", "v"}});
  Bytes bytes = read_bytes(path);
  ASSERT_GE(bytes.size(), 8u);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[i];
  EXPECT_EQ(n % 8, 0u);
  ASSERT_EQ(bytes.size(), 8 + n + 16);
  std::string header(bytes.begin() + 8, bytes.begin() + 8 + static_cast<int64_t>(n));
  EXPECT_EQ(header.front(), '{');
  size_t last = header.find_last_not_of(' ');
  EXPECT_EQ(header[last], '}');
  auto j = nlohmann::json::parse(header);
  EXPECT_EQ(j["__metadata__"]["k"], "v");
  // Entries sorted by name, data in that order: "a" first.
  EXPECT_EQ(j["a"]["dtype"], "F64");
  EXPECT_EQ(j["a"]["shape"], nlohmann::json::array({1}));
  EXPECT_EQ(j["a"]["data_offsets"], nlohmann::json::array({0, 8}));
  EXPECT_EQ(j["b"]["dtype"], "F32");
  EXPECT_EQ(j["b"]["data_offsets"], nlohmann::json::array({8, 16}));
  EXPECT_LT(header.find("\"a\""), header.find("\"b\""));
  const Bytes expected_data = {0, 0, 0, 0, 0, 0, 0xD0, 0xBF,   // -0.25 as little-endian F64
                               0, 0, 0xC0, 0x3F, 0, 0, 0xC0, 0x3F};  // 1.5, 1.5 as F32
  EXPECT_EQ(Bytes(bytes.begin() + 8 + static_cast<int64_t>(n), bytes.end()), expected_data);
}

TEST_F(SafetensorsTest, ReadsHandBuiltFile) {
  // Entries out of name order, unpadded header, and a zero-size tensor: all allowed by the format.
  const std::string header =
      R"({"z":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("y":{"dtype":"BF16","shape":[1,2],"data_offsets":[16,20]},)"
      R"("e":{"dtype":"F64","shape":[3,0],"data_offsets":[20,20]},)"
      R"("x":{"dtype":"F64","shape":[],"data_offsets":[8,16]},)"
      R"("__metadata__":{"format":"pt"}})";
  const Bytes data = {0, 0, 0xC0, 0x3F, 0, 0, 0, 0xC1,       // z = [1.5, -8]
                      0, 0, 0, 0, 0, 0, 0xD0, 0xBF,          // x = -0.25
                      0x80, 0x3F, 0x00, 0xC0};               // y = [[1, -2]] (BF16)
  const std::string path = file("hand.safetensors");
  write_bytes(path, make_file(header, data));
  TensorFile f = read_safetensors(path);
  EXPECT_EQ(f.metadata, (std::map<std::string, std::string>{{"format", "pt"}}));
  ASSERT_EQ(f.tensors.size(), 4u);
  EXPECT_EQ(f.get("z").dtype(), DType::F32);
  EXPECT_EQ(f.get("z").at({0}), 1.5);
  EXPECT_EQ(f.get("z").at({1}), -8.0);
  EXPECT_EQ(f.get("x").ndim(), 0);
  EXPECT_EQ(f.get("x").at({}), -0.25);
  EXPECT_EQ(f.get("y").dtype(), DType::BF16);
  EXPECT_EQ(f.get("y").shape(), (Shape{1, 2}));
  EXPECT_EQ(f.get("y").at({0, 0}), 1.0);
  EXPECT_EQ(f.get("y").at({0, 1}), -2.0);
  EXPECT_EQ(f.get("e").shape(), (Shape{3, 0}));
  EXPECT_EQ(f.get("e").numel(), 0);
}

TEST_F(SafetensorsTest, TruncatedFilesThrow) {
  std::map<std::string, Tensor> tensors;
  tensors["a"] = Tensor::zeros({4, 4}, DType::F32);
  tensors["b"] = Tensor::zeros({3}, DType::F64);
  const std::string good = file("good.safetensors");
  write_safetensors(good, tensors);
  const Bytes bytes = read_bytes(good);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[i];
  const std::string path = file("cut.safetensors");
  struct Cut {
    size_t size;
    const char* word;
  };
  const std::vector<Cut> cuts = {{0, "shorter"},     {5, "shorter"},     {7, "shorter"},
                                 {8, "exceeds"},     {8 + n / 2, "exceeds"}, {8 + n - 1, "exceeds"},
                                 {8 + n, "outside"}, {8 + n + 20, "outside"}, {bytes.size() - 1, "outside"}};
  for (const Cut& cut : cuts) {
    SCOPED_TRACE(cut.size);
    write_bytes(path, Bytes(bytes.begin(), bytes.begin() + static_cast<int64_t>(cut.size)));
    expect_read_error(path, cut.word);
  }
}

TEST_F(SafetensorsTest, CorruptHeadersThrowNamedErrors) {
  const std::string path = file("bad.safetensors");
  const Bytes data8(8, 0);
  auto entry = [](const std::string& dtype, const std::string& shape, const std::string& offsets) {
    return R"({"t":{"dtype":")" + dtype + R"(","shape":)" + shape + R"(,"data_offsets":)" + offsets +
           "}}";
  };
  struct Case {
    std::string header;
    Bytes data;
    const char* word;
  };
  const std::vector<Case> cases = {
      {R"({"t":)", data8, "not valid JSON"},
      {"", {}, "not valid JSON"},
      {"[1, 2]", {}, "JSON object"},
      {R"({"t": 3})", {}, "must be an object"},
      {R"({"t":{"shape":[2],"data_offsets":[0,8]}})", data8, "missing 'dtype'"},
      {R"({"t":{"dtype":"F32","data_offsets":[0,8]}})", data8, "missing 'shape'"},
      {R"({"t":{"dtype":"F32","shape":[2]}})", data8, "missing 'data_offsets'"},
      {entry("F16", "[4]", "[0,8]"), data8, "unsupported dtype 'F16'"},
      {entry("I64", "[1]", "[0,8]"), data8, "unsupported dtype 'I64'"},
      {entry("Q7", "[2]", "[0,8]"), data8, "unknown dtype 'Q7'"},
      {entry("F32", "[-2]", "[0,8]"), data8, "negative"},
      {entry("F32", "[2.5]", "[0,8]"), data8, "not an integer"},
      {entry("F32", R"(["2"])", "[0,8]"), data8, "not an integer"},
      {entry("F32", "[2]", "[8,0]"), data8, "end before"},
      {entry("F32", "[2]", "[0]"), data8, "data_offsets must be [begin, end]"},
      {entry("F32", "[2]", "[0,8,9]"), data8, "data_offsets must be [begin, end]"},
      {entry("F32", "[2]", "[-1,7]"), data8, "negative"},
      {entry("F32", "[2]", "[8,16]"), data8, "outside"},
      {entry("F32", "[3]", "[0,8]"), data8, "wrong size"},
      {entry("F32", "[1]", "[0,8]"), data8, "wrong size"},
      {entry("F32", "[4000000000,4000000000,4000000000]", "[0,8]"), data8, "too many"},
      {entry("F32", "[2]", "[0,8]"), Bytes(12, 0), "trailing"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
       R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
       Bytes(12, 0), "overlaps"},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
       R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
       Bytes(12, 0), "gap"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
       R"("a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
       Bytes(16, 0), "duplicate"},
      {R"({"__metadata__":{"k":1}})", {}, "__metadata__"},
      {R"({"__metadata__":["k"]})", {}, "__metadata__"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.header);
    write_bytes(path, make_file(c.header, c.data));
    expect_read_error(path, c.word);
  }
  // Header lengths that do not fit the file.
  write_bytes(path, make_file("{}", {}, 1000));
  expect_read_error(path, "exceeds");
  write_bytes(path, make_file("{}", {}, int64_t{1} << 40));
  expect_read_error(path, "absurdly large");
  // A missing file and a directory.
  expect_read_error(file("absent.safetensors"), "cannot open");
  expect_read_error(dir_.string(), "not a regular file");
}

TEST_F(SafetensorsTest, MissingTensorErrorListsNames) {
  std::map<std::string, Tensor> tensors;
  tensors["blocks.0.w"] = Tensor::zeros({2}, DType::F32);
  tensors["embed"] = Tensor::zeros({2}, DType::F32);
  const std::string path = file("names.safetensors");
  write_safetensors(path, tensors);
  TensorFile f = read_safetensors(path);
  try {
    f.get("head");
    ADD_FAILURE() << "get of a missing tensor succeeded";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("'head'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("blocks.0.w"), std::string::npos) << msg;
    EXPECT_NE(msg.find("embed"), std::string::npos) << msg;
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
  }
}

TEST_F(SafetensorsTest, WriteFailuresLeaveNoFiles) {
  std::map<std::string, Tensor> tensors;
  tensors["w"] = Tensor::zeros({3}, DType::F32);
  // Missing directory: the temporary cannot be created.
  const std::string missing = (dir_ / "no_such_dir" / "x.safetensors").string();
  try {
    write_safetensors(missing, tensors);
    ADD_FAILURE() << "writing into a missing directory succeeded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(missing), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(dir_ / "no_such_dir"));
  // The rename fails (the target is a directory): the temporary must be removed.
  fs::create_directory(dir_ / "target");
  EXPECT_THROW(write_safetensors(file("target"), tensors), Error);
  EXPECT_EQ(listing(), std::vector<std::string>{"target"});
  // Reserved name and undefined tensors are refused before anything is written.
  std::map<std::string, Tensor> reserved = {{"__metadata__", Tensor::zeros({1}, DType::F32)}};
  EXPECT_THROW(write_safetensors(file("r.safetensors"), reserved), Error);
  std::map<std::string, Tensor> undefined = {{"u", Tensor()}};
  EXPECT_THROW(write_safetensors(file("u.safetensors"), undefined), Error);
  EXPECT_EQ(listing(), std::vector<std::string>{"target"});
}

TEST_F(SafetensorsTest, ReplacesExistingFileAtomically) {
  const std::string path = file("ckpt.safetensors");
  std::map<std::string, Tensor> first = {{"w", Tensor::zeros({100}, DType::F64)}};
  write_safetensors(path, first, {{"step", "1"}});
  std::map<std::string, Tensor> second = {{"v", Tensor::zeros({2}, DType::F32)}};
  second["v"].fill(3.0);
  write_safetensors(path, second, {{"step", "2"}});
  TensorFile f = read_safetensors(path);
  EXPECT_EQ(f.metadata.at("step"), "2");
  EXPECT_FALSE(f.has("w"));
  EXPECT_EQ(f.get("v").at({1}), 3.0);
  EXPECT_EQ(listing(), std::vector<std::string>{"ckpt.safetensors"});
}
