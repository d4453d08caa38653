// `quiver train --gpus N [--nodes M --node-rank R --rendezvous ADDRESS:PORT]`: one process per
// GPU. On each host the launcher re-runs this same command line N times, each child with its
// global rank (R·N + local index) and the world size M·N in the environment, one visible GPU,
// NVLink multicast off and the rendezvous for the NCCL id: a fresh file on one host, or
// tcp://ADDRESS:PORT (where host 0's rank 0 listens) across hosts. Then it waits for all of them.
#pragma once
#include <string>
#include <vector>

#include "train/engine.h"

namespace quiver::cli {

// The environment a launched rank reads.
constexpr const char* kRankEnv = "QUIVER_RANK";
constexpr const char* kWorldEnv = "QUIVER_WORLD_SIZE";
constexpr const char* kRendezvousEnv = "QUIVER_RENDEZVOUS";

void record_argv(int argc, char** argv);  // main() records its arguments for the children

// This process's place when the launcher started it (QUIVER_RANK set); world = 0 when it was
// not started as a rank. Errors name a malformed variable.
train::Parallel launched_rank();

// The CUDA_VISIBLE_DEVICES value for rank r: the r-th entry of the parent's list if it has
// one, else r. Errors when the list has fewer than `world` entries.
std::string visible_device_for(int rank, int world, const char* parent_list);

// The environment of local rank `local` of host `node_rank` (of `nodes`, `gpus` ranks each):
// the rank and world variables, the rendezvous, its one visible GPU and NCCL_NVLS_ENABLE=0.
std::vector<std::string> rank_environment(int local, int gpus, int nodes, int node_rank,
                                          const std::string& rendezvous, const char* parent_devices);

// Starts this host's `gpus` ranks of the recorded command line and waits. tcp_rendezvous:
// "tcp://ADDRESS:PORT" for several hosts, empty for one (a fresh file is used). SIGINT and
// SIGTERM reach every rank (they stop at the same step and checkpoint); when a rank fails, the
// others on this host are sent SIGTERM and, if still running after a grace period, SIGKILL.
// Throws naming the first rank that failed and how.
void run_ranks(int gpus, int nodes, int node_rank, const std::string& tcp_rendezvous);

}  // namespace quiver::cli
