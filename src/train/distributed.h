// The device-independent parts of data-parallel training (one process per GPU, NCCL between
// them): how the global batch, the gradients and the optimizer state are divided among the
// ranks, and the rendezvous that hands rank 0's NCCL id to the other ranks.
//
// Data: the ranks share one sequential stream (train::BatchLoader with the GLOBAL micro-batch
// B·world); rank r takes the rows [r·B, (r+1)·B) of each global micro-batch. So a run on N GPUs
// sees exactly the windows, in the same order, as one GPU with the same global batch, every
// token once per pass, and the data cursor in a checkpoint means the same thing for any N.
//
// Gradients: buckets of whole parameter tensors in reverse table order (the backward finishes
// the last layers first), each at most cap bytes of fp32 (a larger tensor is a bucket of its
// own). The flat table is contiguous, so every bucket is one range of the flat gradient buffer.
// During the backward of a step's last micro-batch, each bucket is reduced as soon as the
// backward has finished all its gradients (buckets_complete), overlapping the rest of the
// backward.
//
// Optimizer state (ZeRO-1): rank r keeps AdamW's m and v only for its contiguous shard of the
// flat buffer (shard_ranges; optimizer_shard gives the optimizer's segments inside it). A
// bucket's reduction is a reduce-scatter over the parts of the bucket in each rank's shard
// (split_by_shards): each rank ends with the mean gradient of its shard, clips with the global
// norm (the shards' squared norms summed over the ranks), updates its shard, and the updated
// shards are all-gathered. Before a checkpoint the shards of m and v are gathered into the
// full state, so checkpoints keep the single-device layout; a resumed rank takes its shard of
// the full state, whatever the number of ranks that wrote it.
#pragma once
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "model/model.h"
#include "train/optimizer.h"

namespace quiver::train {

struct Range {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
};

// ZeRO-1 shards of [0, num_params): `world` contiguous ranges in rank order, covering it
// exactly; interior boundaries are multiples of `align` elements (aligned collective chunks),
// and sizes differ by at most `align`. world ≥ 1, align ≥ 1.
std::vector<Range> shard_ranges(int64_t num_params, int world, int64_t align = 64);

struct Bucket {
  Range range;                // in the flat buffer
  std::vector<size_t> params; // indices into the table, in the order the backward finishes them
};

// Gradient buckets (see the file comment); cap_bytes ≥ 1, counted as fp32 bytes. Every
// parameter is in exactly one bucket.
std::vector<Bucket> bucket_plan(const std::vector<model::ParamInfo>& table, int64_t cap_bytes);

// How many buckets of `plan` are complete once every table entry from `first_final` on has its
// final gradient (model::backward_stage_starts): plan order is reverse table order, so the
// complete buckets are a prefix of the plan, those whose parameters all have index ≥ first_final.
size_t buckets_complete(const std::vector<Bucket>& plan, size_t first_final);

// ZeRO-1: rank `rank`'s part of the optimizer over a flat buffer of num_params elements.
struct OptimizerShard {
  std::vector<Range> shards;  // every rank's shard, in rank order: shard_ranges(num_params, world, kParamAlign)
  Range range;                // this rank's, shards[rank]
  // The optimizer's segments intersected with `range`, with offsets relative to range.begin (so
  // they index the shard's own m and v); flags kept, empty intersections dropped. Alignment gaps
  // lie in no segment, so they stay outside every shard's segments too.
  std::vector<ParamSegment> segments;
};
// Errors name a rank outside [0, world) and segments that overlap or leave the buffer.
OptimizerShard optimizer_shard(std::vector<ParamSegment> segments, int64_t num_params, int rank, int world);

// The parts of `range` in each shard, in rank order: range ∩ shards[r], an empty range where
// they do not meet. These are the pieces of a bucket's reduce-scatter, one per owner.
std::vector<Range> split_by_shards(Range range, const std::vector<Range>& shards);

// Rank r's rows of a global micro-batch of `global_batch` rows; an error unless world divides
// it (naming both).
Range rank_rows(int64_t global_batch, int rank, int world);

// Rendezvous: rank 0 publishes `payload` (the NCCL unique id); every rank returns it. Errors
// name the address or path and the timeout.
//   file: rank 0 writes PATH atomically (temporary file, fsync, rename); the others wait for it.
//         PATH must not exist beforehand (a stale file would hand out an old id), so a
//         launcher uses a fresh path per run.
//   tcp:  rank 0 listens on 127.0.0.1:PORT (or ADDRESS:PORT), sends the payload to world − 1
//         connections and returns; the others connect (retrying until the timeout) and read.
std::string rendezvous_file(const std::string& path, int rank, const std::string& payload,
                            std::chrono::milliseconds timeout);
std::string rendezvous_tcp(const std::string& host, int port, int rank, int world, const std::string& payload,
                           std::chrono::milliseconds timeout);

// A rendezvous by its description: "tcp://ADDRESS:PORT" (IPv4; several hosts) or a file path
// (one host). Errors name a malformed description.
struct RendezvousSpec {
  bool tcp = false;
  std::string path;  // file
  std::string host;  // tcp
  int port = 0;
};
RendezvousSpec parse_rendezvous(const std::string& spec);
std::string rendezvous(const std::string& spec, int rank, int world, const std::string& payload,
                       std::chrono::milliseconds timeout);

}  // namespace quiver::train
