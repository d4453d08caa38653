// NCCL through dlopen (nccl.h).
#include "cuda/nccl.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <vector>

#include <fmt/format.h>

#include "quiver/error.h"
#include "train/distributed.h"

namespace quiver::cuda {
namespace {

// From NCCL 2's nccl.h.
using ncclResult_t = int;
constexpr ncclResult_t kNcclSuccess = 0;
constexpr int kNcclFloat32 = 7, kNcclFloat64 = 8;
constexpr int kNcclSum = 0, kNcclMax = 2, kNcclAvg = 4;
constexpr size_t kUniqueIdBytes = 128;
struct UniqueId {
  char internal[kUniqueIdBytes];
};
using Comm = void*;

struct Api {
  void* handle = nullptr;
  const char* (*get_error_string)(ncclResult_t) = nullptr;
  ncclResult_t (*get_version)(int*) = nullptr;
  ncclResult_t (*get_unique_id)(UniqueId*) = nullptr;
  ncclResult_t (*comm_init_rank)(Comm*, int, UniqueId, int) = nullptr;
  ncclResult_t (*comm_destroy)(Comm) = nullptr;
  ncclResult_t (*all_reduce)(const void*, void*, size_t, int, int, Comm, cudaStream_t) = nullptr;
  ncclResult_t (*reduce)(const void*, void*, size_t, int, int, int, Comm, cudaStream_t) = nullptr;
  ncclResult_t (*broadcast)(const void*, void*, size_t, int, int, Comm, cudaStream_t) = nullptr;
  ncclResult_t (*group_start)() = nullptr;
  ncclResult_t (*group_end)() = nullptr;
};

template <class F>
void bind(Api& api, F& fn, const char* name) {
  fn = reinterpret_cast<F>(dlsym(api.handle, name));
  QV_CHECK(fn != nullptr, "NCCL: the library has no symbol '{}' (is it NCCL 2?)", name);
}

const Api& api() {
  static std::once_flag once;
  static Api a;
  std::call_once(once, [] {
    std::vector<std::string> tried;
    if (const char* env = std::getenv("QUIVER_NCCL_LIBRARY")) tried.push_back(env);
    tried.push_back("libnccl.so.2");
    tried.push_back("/usr/local/cuda/lib64/libnccl.so.2");
    for (const char* py : {"python3.12", "python3.11", "python3.10"})
      for (const char* root : {"/usr/local/lib", "/usr/lib"})
        tried.push_back(fmt::format("{}/{}/dist-packages/nvidia/nccl/lib/libnccl.so.2", root, py));
    std::string failures;
    for (const std::string& path : tried) {
      a.handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (a.handle) break;
      failures += "\n  " + path + ": " + dlerror();
    }
    QV_CHECK(a.handle != nullptr, "NCCL was not found (set QUIVER_NCCL_LIBRARY to libnccl.so.2); tried:{}", failures);
    bind(a, a.get_error_string, "ncclGetErrorString");
    bind(a, a.get_version, "ncclGetVersion");
    bind(a, a.get_unique_id, "ncclGetUniqueId");
    bind(a, a.comm_init_rank, "ncclCommInitRank");
    bind(a, a.comm_destroy, "ncclCommDestroy");
    bind(a, a.all_reduce, "ncclAllReduce");
    bind(a, a.reduce, "ncclReduce");
    bind(a, a.broadcast, "ncclBroadcast");
    bind(a, a.group_start, "ncclGroupStart");
    bind(a, a.group_end, "ncclGroupEnd");
  });
  return a;
}

void check(ncclResult_t r, const char* what) {
  if (r != kNcclSuccess) fail("NCCL {} failed: {} (error {})", what, api().get_error_string(r), r);
}

std::string to_hex(const UniqueId& id) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (char c : id.internal) {
    s += digits[(static_cast<unsigned char>(c) >> 4) & 15];
    s += digits[static_cast<unsigned char>(c) & 15];
  }
  return s;
}

UniqueId from_hex(const std::string& s) {
  QV_CHECK(s.size() == 2 * kUniqueIdBytes, "NCCL: the rendezvous handed out {} characters, expected {}", s.size(),
           2 * kUniqueIdBytes);
  auto value = [&](char c) {
    QV_CHECK((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'), "NCCL: the rendezvous id has a bad character '{}'", c);
    return c <= '9' ? c - '0' : c - 'a' + 10;
  };
  UniqueId id{};
  for (size_t i = 0; i < kUniqueIdBytes; ++i)
    id.internal[i] = static_cast<char>(value(s[2 * i]) * 16 + value(s[2 * i + 1]));
  return id;
}

}  // namespace

int nccl_version() {
  int v = 0;
  check(api().get_version(&v), "ncclGetVersion");
  return v;
}

Communicator::Communicator(int rank, int world, const std::string& rendezvous, double timeout_s)
    : rank_(rank), world_(world) {
  QV_CHECK(world >= 1 && rank >= 0 && rank < world, "NCCL: rank {} of world {}", rank, world);
  ::setenv("NCCL_NVLS_ENABLE", "0", 1);
  const Api& a = api();
  std::string payload;
  if (rank == 0) {
    UniqueId id{};
    check(a.get_unique_id(&id), "ncclGetUniqueId");
    payload = to_hex(id);
  }
  payload = train::rendezvous(rendezvous, rank, world, payload,
                              std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
  Comm comm = nullptr;
  check(a.comm_init_rank(&comm, world, from_hex(payload), rank), "ncclCommInitRank");
  comm_ = comm;
}

Communicator::~Communicator() {
  if (comm_) api().comm_destroy(comm_);
}

void Communicator::all_reduce_mean(float* data, size_t count, cudaStream_t stream) {
  if (count == 0) return;
  check(api().all_reduce(data, data, count, kNcclFloat32, kNcclAvg, comm_, stream), "ncclAllReduce (mean)");
}

void Communicator::all_reduce_max(float* data, size_t count, cudaStream_t stream) {
  if (count == 0) return;
  check(api().all_reduce(data, data, count, kNcclFloat32, kNcclMax, comm_, stream), "ncclAllReduce (max)");
}

void Communicator::broadcast(float* data, size_t count, cudaStream_t stream) {
  if (count == 0) return;
  check(api().broadcast(data, data, count, kNcclFloat32, 0, comm_, stream), "ncclBroadcast");
}

void Communicator::all_reduce_sum(double* data, size_t count, cudaStream_t stream) {
  if (count == 0) return;
  check(api().all_reduce(data, data, count, kNcclFloat64, kNcclSum, comm_, stream), "ncclAllReduce (sum)");
}

namespace {

void check_parts(const std::vector<train::Range>& parts, int world, const char* what) {
  QV_CHECK(parts.size() == static_cast<size_t>(world), "NCCL {}: {} parts for {} ranks", what, parts.size(), world);
  for (const train::Range& p : parts)
    QV_CHECK(p.begin >= 0 && p.begin <= p.end, "NCCL {}: the part [{}, {}) is not a range", what, p.begin, p.end);
}

}  // namespace

void Communicator::reduce_scatter_mean(float* data, const std::vector<train::Range>& parts, cudaStream_t stream) {
  check_parts(parts, world_, "reduce-scatter");
  group_start();
  for (int r = 0; r < world_; ++r) {
    float* part = data + parts[r].begin;
    if (parts[r].size() > 0)
      check(api().reduce(part, part, static_cast<size_t>(parts[r].size()), kNcclFloat32, kNcclAvg, r, comm_, stream),
            "ncclReduce (mean)");
  }
  group_end();
}

void Communicator::all_gather(float* data, const std::vector<train::Range>& parts, cudaStream_t stream) {
  check_parts(parts, world_, "all-gather");
  group_start();
  for (int r = 0; r < world_; ++r) {
    float* part = data + parts[r].begin;
    if (parts[r].size() > 0)
      check(api().broadcast(part, part, static_cast<size_t>(parts[r].size()), kNcclFloat32, r, comm_, stream),
            "ncclBroadcast");
  }
  group_end();
}

void Communicator::group_start() { check(api().group_start(), "ncclGroupStart"); }
void Communicator::group_end() { check(api().group_end(), "ncclGroupEnd"); }

}  // namespace quiver::cuda
