#pragma once

// The baseline of the transfer benchmarks: the same bytes over one plain loopback TCP
// connection, measured in the same run.

#include <cstddef>
#include <vector>

namespace shoal::bench {

// Sends `size` bytes from `data` to a receiver thread over one loopback TCP connection, in
// send()/recv() calls of at most `chunk` bytes, the receiver writing into `sink` (at least
// `size` bytes, already touched). Returns seconds; exits the process on a socket error.
double RawTcpSeconds(const char* data, size_t size, size_t chunk, std::vector<char>& sink);

}  // namespace shoal::bench
