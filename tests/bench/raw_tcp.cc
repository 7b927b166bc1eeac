#include "tests/bench/raw_tcp.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

namespace shoal::bench {
namespace {

[[noreturn]] void Die(const char* what) {
  std::perror(what);
  std::exit(1);
}

}  // namespace

double RawTcpSeconds(const char* data, size_t size, size_t chunk, std::vector<char>& sink) {
  int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  if (::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) Die("raw TCP bind");
  socklen_t len = sizeof(addr);
  ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len);
  ::listen(listener, 1);
  size_t received = 0;
  std::thread receiver([&] {
    int fd = ::accept(listener, nullptr, nullptr);
    while (received < size) {
      ssize_t n = ::recv(fd, sink.data() + received, std::min(chunk, size - received), 0);
      if (n <= 0) break;
      received += static_cast<size_t>(n);
    }
    ::close(fd);
  });
  const auto start = std::chrono::steady_clock::now();
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) Die("raw TCP connect");
  size_t sent = 0;
  while (sent < size) {
    ssize_t n = ::send(fd, data + sent, std::min(chunk, size - sent), 0);
    if (n <= 0) Die("raw TCP send");
    sent += static_cast<size_t>(n);
  }
  receiver.join();
  const auto end = std::chrono::steady_clock::now();
  ::close(fd);
  ::close(listener);
  if (received != size) {
    std::fprintf(stderr, "raw TCP: the receiver got %zu of %zu bytes\n", received, size);
    std::exit(1);
  }
  return std::chrono::duration<double>(end - start).count();
}

}  // namespace shoal::bench
