#include "quiver/parallel.h"

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace quiver {
namespace {

int default_threads() {
  if (const char* env = std::getenv("QUIVER_NUM_THREADS")) {
    int n = std::atoi(env);
    if (n > 0) return n;
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

int g_threads = default_threads();

// A fixed pool that runs one parallel loop at a time; the caller thread works too.
class Pool {
 public:
  explicit Pool(int workers) {
    for (int i = 0; i < workers; ++i) threads_.emplace_back([this] { work(); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  int workers() const { return static_cast<int>(threads_.size()); }

  void run(int64_t chunks, const std::function<void(int64_t)>& task) {
    std::lock_guard<std::mutex> run_lock(run_mu_);
    {
      std::lock_guard<std::mutex> lock(mu_);
      task_ = &task;
      chunks_ = chunks;
      next_ = 0;
      pending_ = chunks;
      error_ = nullptr;
      ++generation_;
    }
    cv_.notify_all();
    drain();
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] { return pending_ == 0; });
    task_ = nullptr;
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void drain() {
    for (;;) {
      int64_t i;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (task_ == nullptr || next_ >= chunks_) return;
        i = next_++;
      }
      try {
        (*task_)(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu_);
        if (!error_) error_ = std::current_exception();
      }
      std::lock_guard<std::mutex> lock(mu_);
      if (--pending_ == 0) done_cv_.notify_all();
    }
  }
  void work() {
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
      }
      drain();
    }
  }

  std::vector<std::thread> threads_;
  std::mutex mu_, run_mu_;
  std::condition_variable cv_, done_cv_;
  const std::function<void(int64_t)>* task_ = nullptr;
  int64_t chunks_ = 0, next_ = 0, pending_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

Pool& pool() {
  static Pool p(std::max(0, g_threads - 1));
  return p;
}

thread_local bool t_inside_loop = false;

}  // namespace

int num_threads() { return g_threads; }
void set_num_threads(int n) { g_threads = std::max(1, n); }

void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  int64_t threads = std::min<int64_t>(g_threads, pool().workers() + 1);
  int64_t chunks = std::min<int64_t>(threads, (n + grain - 1) / grain);
  if (chunks <= 1 || t_inside_loop) {  // nested loops run inline
    fn(0, n);
    return;
  }
  int64_t step = (n + chunks - 1) / chunks;
  pool().run(chunks, [&](int64_t c) {
    t_inside_loop = true;
    int64_t b = c * step, e = std::min(n, b + step);
    if (b < e) fn(b, e);
    t_inside_loop = false;
  });
}

}  // namespace quiver
