// The local data-parallel launcher (launch.h).
#include "launch.h"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>

#include <fmt/format.h>

#include "quiver/error.h"

extern char** environ;

namespace quiver::cli {
namespace {

std::vector<std::string>& argv_storage() {
  static std::vector<std::string> a;
  return a;
}

volatile sig_atomic_t g_forward = 0;  // a signal the launcher received, to pass on
void remember_signal(int sig) { g_forward = sig; }

int parse_int(const char* name, const char* text) {
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(text, &end, 10);
  QV_CHECK(errno == 0 && end != text && *end == '\0' && v >= 0 && v <= 1 << 20, "{}='{}' is not a rank number",
           name, text);
  return static_cast<int>(v);
}

std::string describe(int status) {
  if (WIFEXITED(status)) return fmt::format("exited with status {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return fmt::format("was killed by signal {} ({})", WTERMSIG(status), strsignal(WTERMSIG(status)));
  return fmt::format("ended with wait status {}", status);
}

}  // namespace

void record_argv(int argc, char** argv) {
  argv_storage().assign(argv, argv + argc);
}

train::Parallel launched_rank() {
  train::Parallel p;
  const char* rank = std::getenv(kRankEnv);
  if (!rank) {
    p.world = 0;
    return p;
  }
  const char* world = std::getenv(kWorldEnv);
  const char* rendezvous = std::getenv(kRendezvousEnv);
  QV_CHECK(world && rendezvous, "{} is set but {} or {} is not: start ranks with quiver train --gpus N", kRankEnv,
           kWorldEnv, kRendezvousEnv);
  p.rank = parse_int(kRankEnv, rank);
  p.world = parse_int(kWorldEnv, world);
  p.rendezvous = rendezvous;
  QV_CHECK(p.world >= 1 && p.rank < p.world, "{}={} is not below {}={}", kRankEnv, p.rank, kWorldEnv, p.world);
  return p;
}

std::string visible_device_for(int rank, int world, const char* parent_list) {
  if (!parent_list || !*parent_list) return std::to_string(rank);
  std::vector<std::string> entries;
  std::string item;
  for (const char* c = parent_list;; ++c) {
    if (*c == ',' || *c == '\0') {
      if (!item.empty()) entries.push_back(item);
      item.clear();
      if (*c == '\0') break;
    } else if (*c != ' ') {
      item += *c;
    }
  }
  QV_CHECK(static_cast<int>(entries.size()) >= world, "--gpus {}: CUDA_VISIBLE_DEVICES='{}' lists {} device(s)", world,
           parent_list, entries.size());
  return entries[static_cast<size_t>(rank)];
}

std::vector<std::string> rank_environment(int local, int gpus, int nodes, int node_rank,
                                          const std::string& rendezvous, const char* parent_devices) {
  QV_CHECK(gpus >= 1 && nodes >= 1 && local >= 0 && local < gpus && node_rank >= 0 && node_rank < nodes,
           "rank_environment: local rank {} of {} on host {} of {}", local, gpus, node_rank, nodes);
  return {fmt::format("{}={}", kRankEnv, node_rank * gpus + local), fmt::format("{}={}", kWorldEnv, nodes * gpus),
          fmt::format("{}={}", kRendezvousEnv, rendezvous),
          "CUDA_VISIBLE_DEVICES=" + visible_device_for(local, gpus, parent_devices), "NCCL_NVLS_ENABLE=0"};
}

void run_ranks(int gpus, int nodes, int node_rank, const std::string& tcp_rendezvous) {
  QV_CHECK(!argv_storage().empty(), "run_ranks: the command line was not recorded");
  const auto now = std::chrono::steady_clock::now().time_since_epoch().count();
  const std::string rendezvous =
      !tcp_rendezvous.empty()
          ? tcp_rendezvous
          : (std::filesystem::temp_directory_path() / fmt::format("quiver-rendezvous-{}-{}", ::getpid(), now)).string();
  const char* parent_devices = std::getenv("CUDA_VISIBLE_DEVICES");
  std::vector<std::vector<std::string>> rank_env;
  for (int r = 0; r < gpus; ++r)
    rank_env.push_back(rank_environment(r, gpus, nodes, node_rank, rendezvous, parent_devices));

  // The children's environment: ours, minus what we set.
  std::vector<std::string> base;
  for (char** e = environ; *e; ++e) {
    const std::string kv = *e;
    const std::string key = kv.substr(0, kv.find('='));
    if (key == kRankEnv || key == kWorldEnv || key == kRendezvousEnv || key == "CUDA_VISIBLE_DEVICES" ||
        key == "NCCL_NVLS_ENABLE")
      continue;
    base.push_back(kv);
  }
  std::vector<char*> args;
  for (std::string& a : argv_storage()) args.push_back(a.data());
  args.push_back(nullptr);

  struct sigaction forward {}, old_int {}, old_term {};
  forward.sa_handler = remember_signal;
  sigemptyset(&forward.sa_mask);
  sigaction(SIGINT, &forward, &old_int);
  sigaction(SIGTERM, &forward, &old_term);

  std::vector<pid_t> pids;
  auto stop_all = [&](int sig) {
    for (pid_t p : pids)
      if (p > 0) ::kill(p, sig);
  };
  std::string failure;
  for (int r = 0; r < gpus && failure.empty(); ++r) {
    std::vector<std::string> env = base;
    env.insert(env.end(), rank_env[r].begin(), rank_env[r].end());
    std::vector<char*> envp;
    for (std::string& kv : env) envp.push_back(kv.data());
    envp.push_back(nullptr);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    sigset_t defaults;
    sigemptyset(&defaults);
    sigaddset(&defaults, SIGINT);
    sigaddset(&defaults, SIGTERM);
    posix_spawnattr_setsigdefault(&attr, &defaults);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGDEF);
    pid_t pid = 0;
    const int err = posix_spawn(&pid, "/proc/self/exe", nullptr, &attr, args.data(), envp.data());
    posix_spawnattr_destroy(&attr);
    if (err != 0)
      failure = fmt::format("starting rank {} failed: {}", node_rank * gpus + r, std::strerror(err));
    else
      pids.push_back(pid);
  }
  if (!failure.empty()) stop_all(SIGTERM);

  // Wait for every rank; pass on signals; after a failure give the others 30 s, then kill them.
  int running = static_cast<int>(pids.size());
  std::chrono::steady_clock::time_point kill_at{};
  bool killing = !failure.empty();
  if (killing) kill_at = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (running > 0) {
    if (g_forward != 0) {
      stop_all(g_forward);
      g_forward = 0;
    }
    int status = 0;
    const pid_t done = ::waitpid(-1, &status, WNOHANG);
    if (done > 0) {
      for (size_t r = 0; r < pids.size(); ++r)
        if (pids[r] == done) {
          pids[r] = -1;
          --running;
          const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
          if (!ok && failure.empty()) {
            failure = fmt::format("rank {} {}", node_rank * gpus + static_cast<int>(r), describe(status));
            stop_all(SIGTERM);
            killing = true;
            kill_at = std::chrono::steady_clock::now() + std::chrono::seconds(30);
          }
        }
      continue;
    }
    if (killing && std::chrono::steady_clock::now() >= kill_at) {
      stop_all(SIGKILL);
      killing = false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);
  std::error_code ec;
  if (tcp_rendezvous.empty()) std::filesystem::remove(rendezvous, ec);
  QV_CHECK(failure.empty(), "data-parallel training stopped: {}", failure);
}

}  // namespace quiver::cli
