// Parallel CPU loops on one persistent thread pool.
// Thread count: QUIVER_NUM_THREADS if set, else the hardware concurrency.
#pragma once
#include <cstdint>
#include <functional>

namespace quiver {

int num_threads();
void set_num_threads(int n);  // takes effect for later loops

// Calls fn(begin, end) over disjoint chunks covering [0, n), each at least `grain`
// long (except the last). Runs inline when one chunk suffices. Exceptions thrown by
// fn are rethrown in the caller.
void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

}  // namespace quiver
