// A minimal parallel-for over independent work items (e.g. (sequence, head) pairs).
#pragma once

#include <cstdint>
#include <functional>

namespace flashgla::cpu {

// Threads used: FLASHGLA_NUM_THREADS if set, else the hardware's count.
int num_threads();

// Runs fn(i) for i in [0, n), spread over threads; rethrows the first exception.
void parallel_for(int64_t n, const std::function<void(int64_t)>& fn);

}  // namespace flashgla::cpu
