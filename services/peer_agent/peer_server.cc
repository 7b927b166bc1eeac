#include "services/peer_agent/peer_server.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "libs/capacity/blas_library.h"
#include "libs/capacity/local_capacity.h"
#include "libs/capacity/upload_probe.h"
#include "libs/common/address.h"
#include "libs/common/address_file.h"
#include "libs/common/clock.h"
#include "libs/common/log.h"
#include "libs/common/status_macros.h"
#include "libs/privacy/crypto.h"
#include "libs/privacy/secagg/identity.h"
#include "libs/rpc/address_list.h"
#include "libs/rpc/signals.h"
#include "libs/tensor/spill_file.h"
#include "libs/training/fashion_mnist.h"
#include "libs/training/trainer.h"
#include "services/peer_agent/flag_error.h"

namespace shoal::peer {

absl::Status PeerOptions::Validate() const {
  if (coordinator.empty()) return absl::InvalidArgumentError("--coordinator is required");
  SHOAL_RETURN_IF_ERROR(rpc::AddressList::Parse(coordinator, "--coordinator").status());
  SHOAL_RETURN_IF_ERROR(ParseHostPort(listen, "--listen").status());
  if (!advertise.empty()) {
    SHOAL_ASSIGN_OR_RETURN(HostPort hp, ParseHostPort(advertise, "--advertise"));
    if (hp.port == 0) return absl::InvalidArgumentError("--advertise: port must not be 0");
  }
  const bool relay_named = !relay.empty() && relay != "auto" && relay != "off";
  if (relay_named) {
    SHOAL_ASSIGN_OR_RETURN(HostPort hp, ParseHostPort(relay, "--relay"));
    if (hp.port == 0) return absl::InvalidArgumentError("--relay: port must not be 0");
    if (name.empty()) {
      return absl::InvalidArgumentError(
          "--relay needs --name: other peers reach this one at RELAY/NAME");
    }
    if (name.find('/') != std::string::npos) {
      return absl::InvalidArgumentError("--name: must not contain '/' (with --relay)");
    }
  }
  if ((relay_named || relay == "auto") && !advertise.empty()) {
    return absl::InvalidArgumentError(
        "--relay and --advertise exclude each other: a relayed peer is advertised as "
        "RELAY/NAME");
  }
  SHOAL_RETURN_IF_ERROR(ParseHostPort(metrics_listen, "--metrics-listen").status());
  if (supernode) SHOAL_RETURN_IF_ERROR(supernode_host.Validate());
  if (data_dir.empty()) return absl::InvalidArgumentError("--data-dir is required");
  std::error_code ec;
  if (!std::filesystem::exists(data_dir, ec)) {
    return absl::NotFoundError(absl::StrCat("--data-dir: ", data_dir, ": no such directory"));
  }
  if (!std::filesystem::is_directory(data_dir, ec)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--data-dir: ", data_dir, " is not a directory"));
  }
  SHOAL_RETURN_IF_ERROR(FlagError("--shard", training::ValidateShardSpec(shard)));
  // The directory the federated modes will use (AggregatorPeer): checked now, not mid-task.
  SHOAL_RETURN_IF_ERROR(
      FlagError("--scratch-dir", tensor::SpillFile::Create(scratch_dir).status()));
  if (!state_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(state_dir, ec);
    if (ec || !std::filesystem::is_directory(state_dir, ec)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--state-dir: ", state_dir, ": ", ec ? ec.message() : "not a directory"));
    }
    if (access(state_dir.c_str(), W_OK | X_OK) != 0) {
      return absl::PermissionDeniedError(
          absl::StrCat("--state-dir: ", state_dir, ": ", std::strerror(errno)));
    }
  }
  if (device != "cpu" && device != "cuda") {
    return absl::InvalidArgumentError(
        absl::StrCat("--device: unknown device \"", device, "\" (known: cpu, cuda)"));
  }
  SHOAL_RETURN_IF_ERROR(FlagError("--device", training::CheckDevice(device)));
  if (torch_threads < 1 || torch_threads > 256) {
    return absl::InvalidArgumentError(
        absl::StrCat("--torch-threads: must be in [1, 256], got ", torch_threads));
  }
  if (name.size() > 63) return absl::InvalidArgumentError("--name: at most 63 characters");
  if (upload_probe_bytes > capacity::kMaxUploadProbeBytes) {
    return absl::InvalidArgumentError(absl::StrCat("--upload-probe-bytes: at most ",
                                                   capacity::kMaxUploadProbeBytes, ", got ",
                                                   upload_probe_bytes));
  }
  return tls.Validate();
}

absl::StatusOr<std::unique_ptr<PeerServer>> PeerServer::Start(const PeerOptions& options) {
  SHOAL_RETURN_IF_ERROR(options.Validate());
  SHOAL_RETURN_IF_ERROR(
      FlagError("--torch-threads", training::SetTorchThreads(options.torch_threads)));
  // Load (and so fully check) Fashion-MNIST before connecting anywhere; every Fashion-MNIST
  // task reuses it. A directory of other data loads each task's files when it is assigned.
  std::shared_ptr<const training::RawDataset> train, test;
  if (training::CheckFashionMnistDir(options.data_dir).ok()) {
    absl::StatusOr<training::RawDataset> t =
        training::LoadFashionMnist(options.data_dir, training::Split::kTrain);
    if (!t.ok()) return FlagError("--data-dir", t.status());
    absl::StatusOr<training::RawDataset> e =
        training::LoadFashionMnist(options.data_dir, training::Split::kTest);
    if (!e.ok()) return FlagError("--data-dir", e.status());
    train = std::make_shared<const training::RawDataset>(*std::move(t));
    test = std::make_shared<const training::RawDataset>(*std::move(e));
  }

  SHOAL_ASSIGN_OR_RETURN(rpc::Credentials credentials, rpc::Credentials::Create(options.tls));
  std::unique_ptr<PeerServer> s(new PeerServer());
  s->aggregator_client_ = std::make_unique<aggregator::GrpcAggregatorClient>(credentials.channel());
  SHOAL_ASSIGN_OR_RETURN(s->metrics_server_,
                         metrics::MetricsServer::Start(options.metrics_listen, "--metrics-listen"));
  s->metrics_ = std::make_unique<PeerMetrics>(s->metrics_server_->registry());
  s->peer_client_ = std::make_unique<GrpcPeerClient>(credentials.channel(), s->metrics_.get());
  PeerServer* self = s.get();
  PeerServiceOptions service_options;
  service_options.peer_id = [self] {
    absl::MutexLock lock(&self->mu_);
    return self->peer_id_;
  };
  // The session measures the upload before its first Hello; until then nothing is paced.
  auto measured_upload = std::make_shared<std::atomic<double>>(0.0);
  s->pacer_ = std::make_unique<rpc::Pacer>([pacing = options.serve_pacing, measured_upload] {
    return pacing.RateFor(measured_upload->load());
  });
  service_options.pacer = s->pacer_.get();
  s->service_ =
      std::make_unique<PeerServiceImpl>(s->snapshots_, *s->metrics_, std::move(service_options));
  rpc::ServerOptions server_options;
  server_options.listen = options.listen;
  server_options.service_name = "shoal-peer";
  server_options.credentials = credentials.server();
  SHOAL_ASSIGN_OR_RETURN(s->server_, rpc::Server::Start(server_options, {s->service_.get()}));

  s->credentials_ = credentials.channel();
  {
    absl::MutexLock lock(&s->mu_);
    s->auto_relay_ = options.relay == "auto";
  }
  std::string advertise = options.advertise;
  if (!options.relay.empty() && options.relay != "auto" && options.relay != "off") {
    s->UseRelay(options.relay, options.name);
    RelayLink* link = nullptr;
    {
      absl::MutexLock lock(&s->mu_);
      link = s->relay_.get();  // nothing else replaces it before the session starts
    }
    SHOAL_RETURN_IF_ERROR(
        FlagError("--relay", link->WaitAttached(absl::Now() + absl::Seconds(30))));
    advertise = absl::StrCat(options.relay, "/", options.name);
  }

  SessionClientOptions session_options;
  session_options.coordinator = options.coordinator;
  session_options.credentials = credentials.channel();
  session_options.hello.set_name(options.name);
  session_options.hello.set_join_token(options.join_token);
  session_options.hello.set_listen_address(advertise.empty() ? s->server_->address() : advertise);
  session_options.hello.set_device(options.device);
  session_options.hello.set_shard_index(options.shard.index);
  session_options.hello.set_shard_count(options.shard.count);
  *session_options.hello.mutable_capacity() = capacity::MeasureLocalCapacity();
  session_options.upload_probe_bytes = options.upload_probe_bytes;
  session_options.measured_upload = measured_upload;
  session_options.hello.set_supernode(options.supernode);
  session_options.hello.set_wants_relay(options.relay == "auto");
  session_options.hello.set_relay_fallback(options.relay.empty());
  // Secure aggregation: an identity key for this session; the coordinator hands its public half
  // to the other peers of each round.
  SHOAL_ASSIGN_OR_RETURN(privacy::KeyPair identity, privacy::GenerateEd25519KeyPair());
  SHOAL_ASSIGN_OR_RETURN(std::unique_ptr<privacy::secagg::Ed25519KeySigner> signer,
                         privacy::secagg::Ed25519KeySigner::Create(identity.private_key));
  session_options.hello.set_identity_public_key(identity.public_key);
  if (options.supernode) {
    SupernodeHostOptions host = options.supernode_host;
    host.coordinator = options.coordinator;
    host.tls = options.tls;
    host.upload_probe_bytes = options.upload_probe_bytes;
    if (host.metrics_listen.empty()) {
      SHOAL_ASSIGN_OR_RETURN(HostPort hp,
                             ParseHostPort(options.metrics_listen, "--metrics-listen"));
      hp.port = 0;
      host.metrics_listen = hp.ToString();
    }
    s->supernode_ = std::make_unique<SupernodeHost>(std::move(host), &s->metrics_->supernode);
  }
  SHOAL_ASSIGN_OR_RETURN(
      s->session_, SessionClient::Create(
                       session_options, *s->metrics_,
                       [self](const coordinator::v1::CoordinatorEvent& e) {
                         if (e.has_welcome()) {
                           {
                             absl::MutexLock lock(&self->mu_);
                             self->peer_id_ = e.welcome().peer_id();
                           }
                           if (!e.welcome().relay_address().empty()) {
                             self->UseRelay(e.welcome().relay_address(), e.welcome().peer_id());
                           } else {
                             self->DropRelay();
                           }
                         }
                         if (e.has_relay_assigned()) {
                           self->OnRelayAssigned(e.relay_assigned().relay_address());
                           return;
                         }
                         if (e.has_become_supernode() || e.has_retire_supernode()) {
                           self->OnSupernodeEvent(e);
                           return;
                         }
                         self->agent_->OnEvent(e);
                       },
                       [self] { self->agent_->OnDisconnected(); }));

  PeerAgentOptions agent_options;
  agent_options.shard = options.shard;
  agent_options.device = options.device;
  agent_options.model_dir = options.model_dir;
  agent_options.scratch_dir = options.scratch_dir;
  agent_options.measured_upload = measured_upload;
  agent_options.state_dir = options.state_dir;
  agent_options.evaluate_beside_training = options.evaluate_beside_training;
  agent_options.download_against_held = options.download_against_held;
  agent_options.data_dir = options.data_dir;
  agent_options.hooks = options.hooks;
  agent_options.identity = std::move(signer);
  agent_options.identity_public_key = identity.public_key;
  SHOAL_ASSIGN_OR_RETURN(
      s->agent_,
      PeerAgent::Create(
          agent_options, std::move(train), std::move(test), *s->aggregator_client_,
          *s->peer_client_, s->snapshots_, *s->metrics_, RealClock::Get(),
          [self](const coordinator::v1::PeerMessage& m) { return self->session_->Send(m); },
          [self](const absl::Status& status) { self->OnFatal(status); }));

  if (!options.address_file.empty()) {
    SHOAL_RETURN_IF_ERROR(FlagError(
        "--address-file",
        WriteAddressFile(options.address_file, {{"grpc", s->server_->address()},
                                                {"metrics", s->metrics_server_->address()}})));
  }
  const capacity::BlasLibrary blas = capacity::LoadedBlas();
  LogInfo("serving PeerService on ", s->server_->address(),
          advertise.empty() ? std::string() : absl::StrCat(" (advertised as ", advertise, ")"),
          ", metrics on ", s->metrics_server_->address(), "; shard ", options.shard.ToString(),
          ", device ", options.device, "; coordinator ", options.coordinator, "; capacity ",
          capacity::Describe(session_options.hello.capacity()),
          options.device == "cpu" ? absl::StrCat("; BLAS: ", capacity::DescribeBlas(blas))
                                  : std::string());
  if (options.device == "cpu") {
    if (std::optional<std::string> warning = capacity::BlasWarning(blas)) LogWarning(*warning);
  }
  if (!credentials.secure()) {
    LogWarning("--insecure: PLAINTEXT gRPC without authentication; use only on a trusted network");
  }
  s->session_->Start();
  return s;
}

PeerServer::~PeerServer() { Shutdown(); }

void PeerServer::OnFatal(const absl::Status& status) {
  {
    absl::MutexLock lock(&mu_);
    if (fatal_.ok()) fatal_ = status;
  }
  rpc::RequestShutdown();
}

void PeerServer::OnSupernodeEvent(const coordinator::v1::CoordinatorEvent& event) {
  if (supernode_ == nullptr) {
    LogWarning(
        "the coordinator elected this peer supernode, but it does not offer to host one "
        "(--supernode): ignored");
    return;
  }
  if (event.has_retire_supernode()) {
    supernode_->Stop(
        absl::StrCat("retired by the coordinator: ", event.retire_supernode().reason()));
    return;
  }
  std::string id;
  {
    absl::MutexLock lock(&mu_);
    id = peer_id_;
  }
  supernode_->Start(id);
}

int PeerServer::Run() {
  int signal = rpc::WaitForShutdownSignal();
  bool fatal;
  {
    absl::MutexLock lock(&mu_);
    fatal = !fatal_.ok();
  }
  if (!fatal) LogInfo("shutting down (signal ", signal, ")");
  Shutdown();
  return fatal ? 1 : 0;
}

void PeerServer::Shutdown() {
  std::string reason = "shutdown";
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return;
    shut_down_ = true;
    if (!fatal_.ok()) reason = std::string(fatal_.message());
  }
  // Leave first, so no new events arrive, then stop training, then stop serving.
  if (session_) session_->Leave(reason);
  if (agent_) agent_->Stop();
  if (supernode_) {
    supernode_->Stop(reason);
    supernode_->Wait();
  }
  std::unique_ptr<RelayLink> relay;
  {
    absl::MutexLock lock(&mu_);
    relay = std::move(relay_);
  }
  relay.reset();
  if (server_) server_->Shutdown(absl::Seconds(2));
}

void PeerServer::UseRelay(const std::string& relay, const std::string& id) {
  std::unique_ptr<RelayLink> old;
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_ || (relay_ != nullptr && relay_address_ == relay && relay_id_ == id)) return;
    old = std::move(relay_);
    RelayLinkOptions link;
    link.relay = relay;
    link.peer_id = id;
    link.credentials = credentials_;
    if (auto_relay_) {
      // A relay the coordinator picked that stays down: ask it for another.
      link.give_up_after = kRelayGiveUp;
      link.on_give_up = [this, relay] { session_->ReconnectWithout(relay); };
    }
    relay_ = std::make_unique<RelayLink>(std::move(link), snapshots_, *metrics_);
    relay_address_ = relay;
    relay_id_ = id;
  }
  LogInfo("other peers reach this one through the relay at ", relay, " as '", id, "'");
}

void PeerServer::DropRelay() {
  std::unique_ptr<RelayLink> old;  // closed outside the lock
  {
    absl::MutexLock lock(&mu_);
    if (!auto_relay_ || relay_ == nullptr) return;
    old = std::move(relay_);
    relay_address_.clear();
    relay_id_.clear();
  }
  LogWarning(
      "no aggregator can relay for this peer now: the others cannot fetch from it until "
      "one can (its next session asks again)");
}

void PeerServer::OnRelayAssigned(const std::string& relay) {
  std::string id;
  {
    absl::MutexLock lock(&mu_);
    auto_relay_ = true;
    id = peer_id_;
  }
  LogWarning("the coordinator cannot reach this peer at its address; it picked a relay");
  session_->AskForRelay();
  UseRelay(relay, id);
}

}  // namespace shoal::peer
