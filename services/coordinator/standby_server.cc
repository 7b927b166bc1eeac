#include "services/coordinator/standby_server.h"

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/support/server_callback.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "libs/common/status_macros.h"

namespace shoal::coordinator {
namespace {

// Answers every call at once with UNAVAILABLE and the standby's message.
class Refuser final : public grpc::CallbackGenericService {
 public:
  explicit Refuser(const StandbyServer& standby) : standby_(standby) {}

  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext*) override {
    class Refusal final : public grpc::ServerGenericBidiReactor {
     public:
      explicit Refusal(std::string message) {
        Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, std::move(message)));
      }
      void OnDone() override { delete this; }
    };
    return new Refusal(standby_.Refusal());
  }

 private:
  const StandbyServer& standby_;
};

}  // namespace

StandbyServer::StandbyServer() : refuser_(std::make_unique<Refuser>(*this)) {}

StandbyServer::~StandbyServer() { Shutdown(); }

absl::StatusOr<std::unique_ptr<StandbyServer>> StandbyServer::Start(
    const std::string& listen, std::shared_ptr<grpc::ServerCredentials> credentials) {
  std::unique_ptr<StandbyServer> s(new StandbyServer());
  rpc::ServerOptions options;
  options.listen = listen;
  options.service_name = "shoal-coordinator (standby)";
  options.credentials = std::move(credentials);
  options.generic_service = s->refuser_.get();
  options.serving = false;
  SHOAL_ASSIGN_OR_RETURN(s->server_, rpc::Server::Start(options, {}));
  return s;
}

void StandbyServer::SetActive(std::string holder) {
  absl::MutexLock lock(&mu_);
  active_ = std::move(holder);
}

bool StandbyServer::was_standby() const {
  absl::MutexLock lock(&mu_);
  return !active_.empty();
}

std::string StandbyServer::Refusal() const {
  absl::MutexLock lock(&mu_);
  return absl::StrCat("this coordinator is a standby; the active one is ",
                      active_.empty() ? "not known yet" : active_);
}

void StandbyServer::Shutdown() {
  if (server_ != nullptr) server_->Shutdown(absl::ZeroDuration());
}

}  // namespace shoal::coordinator
