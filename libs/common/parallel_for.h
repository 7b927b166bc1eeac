#pragma once

// Splitting a pass over a large model across threads started for the call: the strategies'
// passes over updates, the aggregator's encoding of a version against the held one.

#include <algorithm>
#include <cstddef>
#include <thread>
#include <vector>

namespace shoal::common {

// Below ~16 MB of floats a thread costs more than it saves on a plain pass.
inline constexpr size_t kMinFloatsPerThread = size_t{1} << 22;

// Runs fn(begin, end) over [0, n) split into up to `threads` contiguous parts of at least
// `min_per_thread` items each, the caller's thread included; the others are started and joined
// inside the call. fn must only touch what its range owns.
template <typename Fn>
void ParallelFor(size_t n, int threads, const Fn& fn, size_t min_per_thread = kMinFloatsPerThread) {
  size_t parts = std::min<size_t>(std::max(threads, 1),
                                  std::max<size_t>(n / std::max<size_t>(min_per_thread, 1), 1));
  if (parts <= 1) {
    fn(size_t{0}, n);
    return;
  }
  const size_t step = (n + parts - 1) / parts;
  std::vector<std::thread> workers;
  workers.reserve(parts - 1);
  for (size_t p = 1; p < parts; ++p) {
    const size_t begin = std::min(n, p * step), end = std::min(n, begin + step);
    workers.emplace_back([&fn, begin, end] { fn(begin, end); });
  }
  fn(size_t{0}, std::min(n, step));
  for (auto& w : workers) w.join();
}

}  // namespace shoal::common
