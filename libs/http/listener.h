#pragma once

// Serving a cpp-httplib server on a thread of its own, the one way Shoal's HTTP endpoints (the
// metrics, the web console) bind and start.

#include <string>
#include <thread>
#include <utility>

#include "absl/status/statusor.h"
#include "libs/common/address.h"

namespace httplib {
class Server;
}  // namespace httplib

namespace shoal::http {

// A server listening on its own thread; Stop() (or the destructor) stops it and joins.
class Listener {
 public:
  Listener() = default;
  ~Listener() { Stop(); }
  Listener(Listener&& other) = default;
  Listener& operator=(Listener&& other) {
    if (this != &other) {
      Stop();
      server_ = other.server_;
      thread_ = std::move(other.thread_);
      address_ = std::move(other.address_);
    }
    return *this;
  }

  // Binds `server` to `listen` (port 0: a free one) and serves it on a new thread, once it
  // runs. The socket takes SO_REUSEADDR only, not cpp-httplib's default SO_REUSEPORT, so an
  // address in use is refused (UNAVAILABLE naming `flag`) instead of shared with another
  // process. `server` must outlive the listener.
  static absl::StatusOr<Listener> Start(httplib::Server& server, const HostPort& listen,
                                        const std::string& flag);

  // HOST:PORT actually bound.
  const std::string& address() const { return address_; }
  void Stop();

 private:
  httplib::Server* server_ = nullptr;
  std::thread thread_;
  std::string address_;
};

}  // namespace shoal::http
