// `quiver train --gpus N`: one process per GPU on this host. The launcher re-runs this same
// command line N times, each child with its rank in the environment, one visible GPU, a fresh
// rendezvous file for the NCCL id and NVLink multicast off, then waits for all of them.
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

// Starts `world` ranks of the recorded command line and waits. SIGINT and SIGTERM reach every
// rank (they stop at the same step and checkpoint); when a rank fails, the others are sent
// SIGTERM and, if still running after a grace period, SIGKILL. Throws naming the first rank
// that failed and how.
void run_ranks(int world);

}  // namespace quiver::cli
