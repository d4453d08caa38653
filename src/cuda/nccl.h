// NCCL, loaded at run time (dlopen), and a communicator over it for data-parallel training.
//
// The library is opened on first use, not linked: a build on a machine with NCCL's headers
// must still run where only one GPU and no NCCL are present. It is looked up as
// QUIVER_NCCL_LIBRARY if set, else libnccl.so.2 on the loader's path, else beside the CUDA
// toolkit and in the NVIDIA Python wheel's folder; an error lists where it looked. The few
// declarations used are those of NCCL 2's nccl.h (ABI-stable across 2.x).
//
// NVLink multicast (NVLS) is switched off (NCCL_NVLS_ENABLE=0) before a communicator is made:
// the collectives here do not need it, and on shared hosts it can take GPUs out of service.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <string>
#include <vector>

#include "train/distributed.h"

namespace quiver::cuda {

// NCCL's version as major·10000 + minor·100 + patch (loads the library).
int nccl_version();

class Communicator {
 public:
  // Every rank calls this; rank 0 creates the id and hands it out through `rendezvous` (a
  // fresh file path on one host, tcp://ADDRESS:PORT across hosts: train::rendezvous), waiting
  // at most timeout_s for the others.
  Communicator(int rank, int world, const std::string& rendezvous, double timeout_s = 300);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int world() const { return world_; }
  // In place on `stream`: data[i] = mean (or max) over the ranks of data[i]; fp32.
  void all_reduce_mean(float* data, size_t count, cudaStream_t stream);
  void all_reduce_max(float* data, size_t count, cudaStream_t stream);
  // In place: data[i] = Σ over the ranks of data[i]; fp64 (the shards' squared gradient norms).
  void all_reduce_sum(double* data, size_t count, cudaStream_t stream);
  // data = rank 0's data on every rank; fp32.
  void broadcast(float* data, size_t count, cudaStream_t stream);

  // The ZeRO-1 collectives over a flat fp32 buffer that every rank holds whole, in place;
  // parts[r] is rank r's part of it (world disjoint ranges, any sizes, empty ones skipped).
  //   reduce_scatter_mean: rank r's data[parts[r]] becomes the mean over the ranks of their
  //     data[parts[r]]; a rank's copy of the other ranks' parts is left unspecified.
  //   all_gather: every rank's data[parts[r]] becomes rank r's data[parts[r]].
  // The parts differ in size (a gradient bucket usually lies in one rank's shard), and
  // ncclReduceScatter / ncclAllGather need equal chunks at rank-strided offsets, so each is one
  // ncclReduce (ncclAvg) or ncclBroadcast per part, rooted at its owner and grouped into one
  // launch: no padding and no copies, as PyTorch's ProcessGroupNCCL does for uneven sizes.
  // Every rank passes the same parts.
  void reduce_scatter_mean(float* data, const std::vector<train::Range>& parts, cudaStream_t stream);
  void all_gather(float* data, const std::vector<train::Range>& parts, cudaStream_t stream);
  // Brackets several collectives into one launch (ncclGroupStart / ncclGroupEnd).
  void group_start();
  void group_end();

 private:
  int rank_, world_;
  void* comm_ = nullptr;
};

}  // namespace quiver::cuda
