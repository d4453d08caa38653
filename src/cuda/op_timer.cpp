#include "cuda/op_timer.h"

#include <algorithm>
#include <map>

#include "cuda/check.h"

namespace quiver::cuda {

OpTimer::~OpTimer() {
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
}

void OpTimer::record(const char* label, cudaStream_t stream) {
  if (used_ == events_.size()) {
    cudaEvent_t e = nullptr;
    QV_CUDA_CHECK(cudaEventCreate(&e));
    events_.push_back(e);
    labels_.push_back(nullptr);
  }
  labels_[used_] = label;
  QV_CUDA_CHECK(cudaEventRecord(events_[used_], stream));
  ++used_;
}

std::vector<std::pair<std::string, double>> OpTimer::take() {
  std::map<std::string, double> total;
  if (used_ > 0) QV_CUDA_CHECK(cudaEventSynchronize(events_[used_ - 1]));
  for (size_t i = 0; i + 1 < used_; ++i) {
    if (!labels_[i]) continue;
    float ms = 0;
    QV_CUDA_CHECK(cudaEventElapsedTime(&ms, events_[i], events_[i + 1]));
    total[labels_[i]] += ms;
  }
  used_ = 0;
  std::vector<std::pair<std::string, double>> out(total.begin(), total.end());
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  return out;
}

}  // namespace quiver::cuda
