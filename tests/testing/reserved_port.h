#pragma once

// A TCP port on 127.0.0.1 held for a server that starts later (or restarts), so that no other
// test running at the same time is handed it by the kernel meanwhile.
//
// The port is held by a socket that is bound with SO_REUSEPORT but never listens: the kernel's
// port-0 allocation skips it, connections to it are refused (as to a server that is down), and
// a gRPC server, which binds with SO_REUSEPORT too, can still listen on it.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace shoal::testing {

// Owned by the test; closes the socket when destroyed. Not thread-safe.
class ReservedPort {
 public:
  // Reserves `port` (0: a free one chosen by the kernel) on 127.0.0.1. `port` may be one a
  // gRPC server of this process listens on right now.
  static absl::StatusOr<ReservedPort> Reserve(int port = 0) {
    ReservedPort r;
    r.fd_ = socket(AF_INET, SOCK_STREAM, 0);
    if (r.fd_ < 0) return absl::InternalError("socket() failed");
    const int one = 1;
    setsockopt(r.fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    setsockopt(r.fd_, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(r.fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      return absl::UnavailableError(absl::StrCat("cannot reserve 127.0.0.1:", port));
    }
    socklen_t len = sizeof(addr);
    getsockname(r.fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    r.port_ = ntohs(addr.sin_port);
    return r;
  }

  ReservedPort(ReservedPort&& other) noexcept : fd_(other.fd_), port_(other.port_) {
    other.fd_ = -1;
  }
  ReservedPort& operator=(ReservedPort&& other) noexcept {
    if (this != &other) {
      Release();
      fd_ = other.fd_;
      port_ = other.port_;
      other.fd_ = -1;
    }
    return *this;
  }
  ~ReservedPort() { Release(); }

  int port() const { return port_; }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }

  void Release() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

 private:
  ReservedPort() = default;
  int fd_ = -1;
  int port_ = 0;
};

// Whether something accepts TCP connections on 127.0.0.1:`port` now. (A gRPC channel that was
// refused backs off and may take seconds to notice a server that came up; this does not.)
inline bool AcceptsConnections(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool ok = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return ok;
}

}  // namespace shoal::testing
