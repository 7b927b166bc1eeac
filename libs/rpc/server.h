#pragma once

#include <grpcpp/server.h>
#include <grpcpp/support/status.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace grpc {
class CallbackGenericService;
class Channel;
class Service;
class ServerCredentials;
}  // namespace grpc

namespace shoal::rpc {

// Transport settings shared by every Shoal server. Limits and keepalive are set here only.
struct ServerOptions {
  std::string listen;        // HOST:PORT; port 0 picks a free port
  std::string service_name;  // for logs, e.g. "shoal-coordinator"
  // From rpc::Credentials (mutual TLS or plaintext); null means plaintext, for tests only.
  std::shared_ptr<grpc::ServerCredentials> credentials = nullptr;
  absl::Duration keepalive_time = absl::Seconds(20);
  absl::Duration keepalive_timeout = absl::Seconds(10);
  // Answers the calls of every method that no service registers (not owned; outlives the
  // server), e.g. a standby's refusals; null: gRPC's UNIMPLEMENTED.
  grpc::CallbackGenericService* generic_service = nullptr;
  // What the health service says at first: SERVING, or NOT_SERVING (a standby).
  bool serving = true;
};

// A started gRPC server with the standard health service (serving) and server reflection.
class Server {
 public:
  // Builds and starts a server for `services` (not owned; they must outlive the server).
  static absl::StatusOr<std::unique_ptr<Server>> Start(const ServerOptions& options,
                                                       const std::vector<grpc::Service*>& services);
  ~Server();

  // HOST:PORT actually bound (the real port when 0 was asked for).
  const std::string& address() const { return address_; }
  int port() const { return port_; }
  // A channel to this server with no socket (gRPC's in-process transport): the same services
  // and calls without TCP or HTTP/2 framing, for simulations in one process.
  std::shared_ptr<grpc::Channel> InProcessChannel() const;

  // Marks the health service NOT_SERVING, then stops accepting calls and waits up to `grace`
  // for calls in flight before cancelling them.
  void Shutdown(absl::Duration grace);

 private:
  Server(std::unique_ptr<grpc::Server> server, std::string address, int port);
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  int port_;
  bool shut_down_ = false;
};

}  // namespace shoal::rpc
