#pragma once

// What a standby coordinator serves while another coordinator holds its store's prefix
// (--store etcd://): every call on its gRPC address is answered UNAVAILABLE with a message that
// names the active coordinator, so that clients given several coordinator addresses move on to
// the next one; the health service says NOT_SERVING. The coordinator that takes over shuts it
// down and serves on the same address.

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "libs/rpc/server.h"

namespace grpc {
class CallbackGenericService;
class ServerCredentials;
}  // namespace grpc

namespace shoal::coordinator {

class StandbyServer {
 public:
  // Listens on `listen` (port 0: any free port). Errors: as rpc::Server::Start.
  static absl::StatusOr<std::unique_ptr<StandbyServer>> Start(
      const std::string& listen, std::shared_ptr<grpc::ServerCredentials> credentials);
  ~StandbyServer();

  // HOST:PORT actually bound.
  const std::string& address() const { return server_->address(); }
  // Who holds the prefix, as its key says (named in the refusals). Thread-safe.
  void SetActive(std::string holder) ABSL_LOCKS_EXCLUDED(mu_);
  // Whether SetActive was called: another coordinator held the prefix meanwhile.
  bool was_standby() const ABSL_LOCKS_EXCLUDED(mu_);
  // The message of the refusals. Thread-safe.
  std::string Refusal() const ABSL_LOCKS_EXCLUDED(mu_);
  // Stops serving and frees the address. Idempotent.
  void Shutdown();

 private:
  StandbyServer();

  mutable absl::Mutex mu_;
  std::string active_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<grpc::CallbackGenericService> refuser_;
  std::unique_ptr<rpc::Server> server_;
};

}  // namespace shoal::coordinator
