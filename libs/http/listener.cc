#include "libs/http/listener.h"

#include <httplib.h>
#include <sys/socket.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace shoal::http {

absl::StatusOr<Listener> Listener::Start(httplib::Server& server, const HostPort& listen,
                                         const std::string& flag) {
  server.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  int port = listen.port;
  if (port == 0) {
    port = server.bind_to_any_port(listen.host);
  } else if (!server.bind_to_port(listen.host, port)) {
    port = -1;
  }
  if (port <= 0) {
    return absl::UnavailableError(absl::StrCat(flag, ": cannot listen on ", listen.ToString()));
  }
  Listener l;
  l.server_ = &server;
  l.address_ = HostPort{listen.host, port}.ToString();
  l.thread_ = std::thread([&server] { server.listen_after_bind(); });
  // stop() before the thread runs the server would be missed: wait until it does.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (!server.is_running()) {
    if (absl::Now() > deadline) {
      // listen_after_bind has not started in 10 s; its thread cannot be stopped before it does.
      l.thread_.detach();
      return absl::InternalError(absl::StrCat(flag, ": the HTTP server did not start"));
    }
    absl::SleepFor(absl::Milliseconds(1));
  }
  return l;
}

void Listener::Stop() {
  if (!thread_.joinable()) return;
  server_->stop();
  thread_.join();
}

}  // namespace shoal::http
