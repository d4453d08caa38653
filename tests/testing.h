// Shared test helpers: random tensors and finite-difference gradient checks.
// With `using namespace quiver;` write quiver::testing:: (gtest owns ::testing).
#pragma once
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "quiver/rng.h"
#include "quiver/tensor.h"

namespace quiver::testing {

inline Tensor random_tensor(const Shape& shape, DType dtype, Rng& rng, double stddev = 1.0) {
  Tensor t = Tensor::empty(shape, dtype);
  rng.fill_normal(t, 0.0, stddev);
  return t;
}

// Fills a tensor with NaN so that elements a kernel forgot to write show up.
// A Markov chain a tiny model learns quickly: next = (5·prev + 1 + r) mod vocab, r ∈ {0, 1}.
inline std::vector<int32_t> markov_tokens(int64_t n, int64_t vocab, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> out(static_cast<size_t>(n));
  int32_t t = 0;
  for (auto& x : out) x = t = static_cast<int32_t>((5 * t + 1 + static_cast<int32_t>(rng.below(2))) % vocab);
  return out;
}

inline Tensor poisoned(const Shape& shape, DType dtype) {
  Tensor t = Tensor::empty(shape, dtype);
  t.fill(std::numeric_limits<double>::quiet_NaN());
  return t;
}

// Central finite differences of a scalar function of `param` (an F64 CPU tensor that
// `loss` reads), compared with `analytic` (same shape): returns ‖fd − analytic‖/‖fd‖.
// Probes at most `max_probes` elements spread over the tensor (all when it is small).
inline double finite_difference_error(const std::function<double()>& loss, Tensor& param,
                                      const Tensor& analytic, double eps = 1e-6,
                                      int64_t max_probes = 64) {
  QV_CHECK(param.dtype() == DType::F64 && param.is_contiguous(),
           "finite differences need a contiguous F64 parameter");
  Tensor a = analytic.to(DType::F64);
  double* p = param.data<double>();
  const double* g = a.data<double>();
  int64_t n = param.numel();
  int64_t stride = n <= max_probes ? 1 : n / max_probes;
  double diff = 0, ref = 0;
  for (int64_t i = 0; i < n; i += stride) {
    double saved = p[i];
    p[i] = saved + eps;
    double up = loss();
    p[i] = saved - eps;
    double down = loss();
    p[i] = saved;
    double fd = (up - down) / (2 * eps);
    diff += (fd - g[i]) * (fd - g[i]);
    ref += fd * fd;
  }
  return ref > 0 ? std::sqrt(diff / ref) : std::sqrt(diff);
}

// Σ out ⊙ weight in double: the scalar loss whose gradient w.r.t. out is `weight`.
inline double dot(const Tensor& out, const Tensor& weight) {
  Tensor a = out.to(DType::F64), b = weight.to(DType::F64);
  const double* x = a.data<double>();
  const double* y = b.data<double>();
  double s = 0;
  for (int64_t i = 0; i < a.numel(); ++i) s += x[i] * y[i];
  return s;
}

// Path of the built CLI, for tests that run it.
inline std::string cli_path() { return QUIVER_CLI_PATH; }

// A fresh scratch directory (mkdtemp), removed with everything in it on destruction.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& name = "test") {
    std::string pattern =
        (std::filesystem::temp_directory_path() / fmt::format("quiver_{}_XXXXXX", name)).string();
    QV_CHECK(::mkdtemp(pattern.data()) != nullptr, "cannot create a scratch directory {}", pattern);
    path_ = pattern;
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  std::string operator/(const std::string& name) const { return file(name); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

struct CliResult {
  int status = 0;  // the shell's status; 0 on success
  std::string out, err;
};

inline std::string read_text(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Runs `quiver ARGS` with stdout and stderr captured into files of `dir`.
inline CliResult run_cli(const std::string& args, const ScratchDir& dir) {
  std::string out = dir.file("cli_stdout.txt"), err = dir.file("cli_stderr.txt");
  std::string cmd = fmt::format("\"{}\" {} > \"{}\" 2> \"{}\" < /dev/null", cli_path(), args, out, err);
  CliResult r;
  r.status = std::system(cmd.c_str());
  r.out = read_text(out);
  r.err = read_text(err);
  return r;
}

}  // namespace quiver::testing
