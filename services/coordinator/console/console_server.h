#pragma once

#include <atomic>
#include <memory>
#include <set>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "libs/http/listener.h"
#include "services/coordinator/console/console_api.h"
#include "services/coordinator/console/console_auth.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace shoal::coordinator::console {

struct ConsoleOptions {
  std::string listen;       // --console-listen HOST:PORT (port 0 = any free port)
  std::string tokens_file;  // --console-tokens FILE (required with listen)
  // TLS with the certificate and key of this directory (tls.crt, tls.key: the coordinator's
  // --tls-dir); empty = plaintext HTTP (the coordinator runs --insecure).
  std::string tls_dir;
  // How often an idle event stream sends a comment: a closed connection is found (and its
  // WatchTask call ended) by the second write after it closed.
  absl::Duration keep_alive = absl::Seconds(5);

  // Errors name the flag.
  absl::Status Validate() const;
};

// The HTTP status for a call's status code (NOT_FOUND 404, INVALID_ARGUMENT 400, ...).
int HttpStatusFor(absl::StatusCode code);

// The web console: the page's assets (embedded at build time) and a JSON API over ConsoleApi,
// served by cpp-httplib on its own threads. Every /api/ path but /api/login needs a credential
// (the session cookie of a login, or `Authorization: Bearer TOKEN`), checked before anything
// else: none or a wrong one is 401, a viewer asking for an admin action 403.
class ConsoleServer {
 public:
  // `stub` (a ControlService client, e.g. on the coordinator's in-process channel) outlives the
  // server; `owners`: the coordinators serving the tasks `stub`'s does not (ConsoleApi).
  static absl::StatusOr<std::unique_ptr<ConsoleServer>> Start(
      const ConsoleOptions& options, v1::ControlService::StubInterface& stub,
      ConsoleApi::OwnerStubs owners = nullptr);
  ~ConsoleServer();

  const std::string& address() const { return listener_.address(); }  // HOST:PORT bound
  bool tls() const { return tls_; }
  // The console's URL, http(s)://HOST:PORT/.
  std::string url() const;
  // The event streams open now.
  size_t event_streams() const ABSL_LOCKS_EXCLUDED(mu_);

  // Ends the event streams, stops accepting requests and joins every thread. Idempotent.
  void Shutdown();

 private:
  ConsoleServer(TokenTable tokens, v1::ControlService::StubInterface& stub,
                ConsoleApi::OwnerStubs owners, absl::Duration keep_alive);
  void Route();
  // The caller's role, or nullopt after answering 401 (or 403 when `admin` is needed).
  std::optional<Role> Authorize(const httplib::Request& req, httplib::Response& res, bool admin);
  void Login(const httplib::Request& req, httplib::Response& res);
  void Logout(const httplib::Request& req, httplib::Response& res);
  void Events(const httplib::Request& req, httplib::Response& res);
  void Model(const httplib::Request& req, httplib::Response& res);
  // Answers a JSON result, or the error's HTTP status with {"error": message, "code": name}.
  void Reply(const absl::StatusOr<std::string>& result, httplib::Response& res, int ok = 200);

  TokenTable tokens_;
  SessionTable sessions_;
  ConsoleApi api_;
  const absl::Duration keep_alive_;
  bool tls_ = false;
  std::unique_ptr<httplib::Server> http_;
  http::Listener listener_;
  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::set<TaskWatch*> watches_ ABSL_GUARDED_BY(mu_);  // the open event streams
};

}  // namespace shoal::coordinator::console
