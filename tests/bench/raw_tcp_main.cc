// The raw TCP baseline on its own, for the scripts that time real processes (bench-decentralized):
// `bytes` moved `times` times one after another over one loopback TCP connection each, as
// RawTcpSeconds does.
//
//   raw_tcp_bench --mb N [--times K] [--chunk-kib 1024]
//
// Prints "RESULT seconds=S gbps=G" (S the total of the K transfers).

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "tests/bench/raw_tcp.h"

int main(int argc, char** argv) {
  size_t mb = 0;
  size_t times = 1;
  size_t chunk_kib = 1024;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const size_t value = std::strtoul(argv[i + 1], nullptr, 10);
    if (flag == "--mb") {
      mb = value;
    } else if (flag == "--times") {
      times = value;
    } else if (flag == "--chunk-kib") {
      chunk_kib = value;
    } else {
      std::fprintf(stderr, "raw_tcp_bench: unknown flag %s (use --mb N --times K --chunk-kib N)\n",
                   flag.c_str());
      return 2;
    }
  }
  if (mb == 0 || times == 0 || chunk_kib == 0 || argc % 2 == 0) {
    std::fprintf(stderr, "usage: raw_tcp_bench --mb N [--times K] [--chunk-kib 1024]\n");
    return 2;
  }
  const size_t bytes = mb * 1000 * 1000;
  std::vector<char> data(bytes, 7);
  std::vector<char> sink(bytes, 1);  // touched, like a buffer a receiver reuses
  double seconds = 0;
  for (size_t k = 0; k < times; ++k) {
    seconds += shoal::bench::RawTcpSeconds(data.data(), bytes, chunk_kib << 10, sink);
  }
  std::printf("RESULT seconds=%.3f gbps=%.3f\n", seconds, bytes * times / 1e9 / seconds);
  return 0;
}
