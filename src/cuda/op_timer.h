// GPU time per op of the model's steps, for `quiver bench model --profile`: an event is
// recorded on the stream at each mark, and the time between consecutive marks is charged to
// the earlier mark's label. Off by default (then a mark is one branch). When on, marks add an
// event record each and nothing else; take() waits for the events. Not for use inside a
// CUDA-graph capture.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include <cuda_runtime.h>

namespace quiver::cuda {

class OpTimer {
 public:
  OpTimer() = default;
  ~OpTimer();
  OpTimer(const OpTimer&) = delete;
  OpTimer& operator=(const OpTimer&) = delete;

  void enable(bool on) { on_ = on; }
  bool enabled() const { return on_; }
  // Ends the current label (if any) and starts `label` (a string literal).
  void mark(const char* label, cudaStream_t stream) {
    if (on_) record(label, stream);
  }
  // Ends the current label.
  void stop(cudaStream_t stream) {
    if (on_) record(nullptr, stream);
  }
  // Milliseconds per label since the last take(), largest first; waits for the events.
  std::vector<std::pair<std::string, double>> take();

 private:
  void record(const char* label, cudaStream_t stream);
  bool on_ = false;
  std::vector<cudaEvent_t> events_;      // a pool, reused after take()
  std::vector<const char*> labels_;      // labels_[i] starts at events_[i]; null: a stop
  size_t used_ = 0;
};

}  // namespace quiver::cuda
