#include "services/peer_agent/modes/gossip/static_gossip.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "libs/capacity/blas_library.h"
#include "libs/common/address.h"
#include "libs/common/address_file.h"
#include "libs/common/clock.h"
#include "libs/common/log.h"
#include "libs/common/status_macros.h"
#include "libs/gossip/gossip_spec.h"
#include "libs/rpc/signals.h"
#include "libs/task/task_file.h"
#include "libs/tensor/model_file.h"
#include "services/peer_agent/flag_error.h"
#include "services/peer_agent/modes/gossip/gossip_membership.h"
#include "services/peer_agent/modes/gossip/gossip_runner.h"

namespace shoal::peer {
namespace {

std::string JsonString(const std::string& s) { return task::JsonQuote(s); }

}  // namespace

absl::StatusOr<std::unique_ptr<StaticGossipPeer>> StaticGossipPeer::Start(
    const StaticGossipOptions& options) {
  if (options.task_file.empty()) {
    return absl::InvalidArgumentError("--task-file is required without a coordinator");
  }
  if (options.data_dir.empty()) return absl::InvalidArgumentError("--data-dir is required");
  if (!options.listen.empty()) {
    SHOAL_RETURN_IF_ERROR(ParseHostPort(options.listen, "--listen").status());
  }
  SHOAL_RETURN_IF_ERROR(ParseHostPort(options.metrics_listen, "--metrics-listen").status());
  SHOAL_RETURN_IF_ERROR(options.tls.Validate());
  if (options.torch_threads < 1 || options.torch_threads > 256) {
    return absl::InvalidArgumentError(
        absl::StrCat("--torch-threads: must be in [1, 256], got ", options.torch_threads));
  }

  absl::StatusOr<common::v1::TaskSpec> spec = task::LoadTaskFile(options.task_file);
  if (!spec.ok()) return FlagError("--task-file", spec.status());
  GossipMembershipOptions membership_options;
  membership_options.dpwa_config = options.dpwa_config;
  membership_options.node = options.node;
  membership_options.dht_listen = options.dht_listen;
  membership_options.dht_bootstrap = options.dht_bootstrap;
  membership_options.dht_min_members = options.dht_min_members;
  membership_options.tls = options.tls;
  SHOAL_ASSIGN_OR_RETURN(GossipMembership membership,
                         MakeGossipMembership(membership_options, spec->name()));
  // The dpwa file (or the task file's `gossip:` block) decides how to gossip; the task file
  // what to train.
  spec->set_mode(common::v1::MODE_GOSSIP);
  if (membership.gossip) spec->mutable_gossip()->MergeFrom(*membership.gossip);
  gossip::ApplyGossipDefaults(*spec->mutable_gossip());
  if (absl::Status s = task::ValidateTaskSpec(*spec); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(options.task_file, " + ", membership.source, ": ", s.message()));
  }

  training::ShardSpec shard = membership.shard;
  if (options.shard) shard = *options.shard;
  SHOAL_RETURN_IF_ERROR(FlagError("--shard", training::ValidateShardSpec(shard)));
  SHOAL_RETURN_IF_ERROR(
      FlagError("--torch-threads", training::SetTorchThreads(options.torch_threads)));

  std::unique_ptr<StaticGossipPeer> p(new StaticGossipPeer());
  p->options_ = options;
  p->spec_ = *spec;
  p->peer_id_ = membership.peer_id;
  p->start_members_ = membership.start_members;
  p->discovery_ = std::move(membership.discovery);

  training::TrainerOptions trainer_options;
  trainer_options.spec = *spec;
  trainer_options.data_dir = options.data_dir;
  trainer_options.shard = shard;
  trainer_options.device = options.device;
  trainer_options.model_dir = options.model_dir.empty()
                                  ? std::filesystem::path(options.task_file).parent_path().string()
                                  : options.model_dir;
  trainer_options.after_batch = BindAfterBatch(options.hooks.after_batch, p->wakeup_);
  absl::StatusOr<std::unique_ptr<training::Trainer>> trainer =
      training::Trainer::Create(trainer_options);
  if (!trainer.ok()) {
    // A model file that does not fit is the task's fault; everything else is the data's.
    if (spec->model() == training::kTorchScriptModel &&
        absl::StrContains(trainer.status().message(), "model")) {
      return FlagError("--task-file", trainer.status());
    }
    return FlagError("--data-dir", trainer.status());
  }
  p->trainer_ = *std::move(trainer);

  SHOAL_ASSIGN_OR_RETURN(rpc::Credentials credentials, rpc::Credentials::Create(options.tls));
  SHOAL_ASSIGN_OR_RETURN(p->metrics_server_,
                         metrics::MetricsServer::Start(options.metrics_listen, "--metrics-listen"));
  p->metrics_ = std::make_unique<PeerMetrics>(p->metrics_server_->registry());
  p->peer_client_ = std::make_unique<GrpcPeerClient>(credentials.channel(), p->metrics_.get());
  PeerServiceOptions service_options;
  const std::string id = p->peer_id_;
  service_options.peer_id = [id] { return id; };
  p->pacer_ = std::make_unique<rpc::Pacer>(
      [pacing = options.serve_pacing] { return pacing.RateFor(/*measured_upload=*/0); });
  service_options.pacer = p->pacer_.get();
  p->service_ =
      std::make_unique<PeerServiceImpl>(p->snapshots_, *p->metrics_, std::move(service_options));
  rpc::ServerOptions server_options;
  server_options.listen = options.listen.empty() ? membership.listen : options.listen;
  server_options.service_name = "shoal-peer";
  server_options.credentials = credentials.server();
  absl::StatusOr<std::unique_ptr<rpc::Server>> server =
      rpc::Server::Start(server_options, {p->service_.get()});
  if (!server.ok()) return FlagError("--listen", server.status());
  p->server_ = *std::move(server);

  ModeRunnerDeps deps;
  deps.assigned.mutable_spec()->CopyFrom(*spec);
  deps.trainer = p->trainer_.get();
  deps.snapshots = &p->snapshots_;
  deps.peers = p->peer_client_.get();
  deps.metrics = p->metrics_.get();
  deps.clock = &p->clock_;
  deps.wakeup = &p->wakeup_;
  deps.peer_id = p->peer_id_;
  deps.update_hooks = options.hooks.update;
  StaticGossipPeer* self = p.get();
  deps.send = [self](const coordinator::v1::PeerMessage& m) { self->OnMessage(m); };
  absl::StatusOr<std::unique_ptr<ModeRunner>> runner = CreateGossipRunner(std::move(deps));
  if (!runner.ok()) return runner.status();
  p->runner_ = *std::move(runner);

  // Members arrive from now on (the first list at once, inside Start).
  SHOAL_RETURN_IF_ERROR(p->discovery_->Start(
      {p->peer_id_, p->server_->address()},
      [self](const std::vector<discovery::Member>& members) { self->OnMembers(members); }));

  if (!options.address_file.empty()) {
    std::map<std::string, std::string> addresses = {{"grpc", p->server_->address()},
                                                    {"metrics", p->metrics_server_->address()}};
    if (!membership.dht_address.empty()) addresses["dht"] = membership.dht_address;
    SHOAL_RETURN_IF_ERROR(
        FlagError("--address-file", WriteAddressFile(options.address_file, addresses)));
  }
  const capacity::BlasLibrary blas = capacity::LoadedBlas();
  LogInfo("static gossip: node ", p->peer_id_, " (", membership.source, "), task ", spec->name(),
          ", shard ", shard.ToString(), "; serving PeerService on ", p->server_->address(),
          ", metrics on ", p->metrics_server_->address(),
          options.device == "cpu" ? absl::StrCat("; BLAS: ", capacity::DescribeBlas(blas))
                                  : std::string());
  if (options.device == "cpu") {
    if (std::optional<std::string> warning = capacity::BlasWarning(blas)) LogWarning(*warning);
  }
  if (!credentials.secure()) {
    LogWarning("--insecure: PLAINTEXT gRPC without authentication; use only on a trusted network");
  }
  p->worker_ = std::thread([self] { self->Work(); });
  return p;
}

StaticGossipPeer::~StaticGossipPeer() { Shutdown(); }

void StaticGossipPeer::OnMessage(const coordinator::v1::PeerMessage& m) {
  absl::MutexLock lock(&mu_);
  if (m.has_gossip_progress()) last_progress_ = m.gossip_progress();
  if (m.has_eval_report()) eval_ = m.eval_report();
  if (m.has_error()) {
    LogError("static gossip: ", m.error().message());
    failed_ = true;
  }
}

void StaticGossipPeer::OnMembers(const std::vector<discovery::Member>& members) {
  coordinator::v1::CoordinatorEvent event;
  event.set_task(spec_.name());
  for (const discovery::Member& m : members) {
    coordinator::v1::PeerEndpoint* e = event.mutable_gossip_members()->add_peers();
    e->set_peer_id(m.peer_id);
    e->set_address(m.address);
  }
  {
    absl::MutexLock lock(&mu_);
    other_members_ = members.empty() ? 0 : members.size() - 1;
  }
  runner_->Intercept(event);
}

void StaticGossipPeer::Work() {
  {
    absl::MutexLock lock(&mu_);
    if (!ReadyToStart()) {
      LogInfo("static gossip: waiting until ", start_members_, " members are known (",
              other_members_ + 1, " so far)");
    }
    // Ends on a shutdown signal too (stopping_).
    mu_.Await(absl::Condition(this, &StaticGossipPeer::ReadyToStart));
    if (stopping_) return;
  }
  const absl::Time start = clock_.Now();
  // The members are the runner's already (OnMembers): this only starts the loop.
  coordinator::v1::CoordinatorEvent go;
  go.set_task(spec_.name());
  go.mutable_gossip_members()->set_start(true);
  runner_->Handle(go, [this] {
    absl::MutexLock lock(&mu_);
    return !stopping_;
  });
  coordinator::v1::GossipProgress progress;
  std::optional<coordinator::v1::EvalReport> eval;
  bool failed;
  size_t other_members;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    other_members = other_members_;
    progress = last_progress_;
    eval = eval_;
    failed = failed_ || !eval.has_value();
  }
  if (!options_.final_model_out.empty()) {
    absl::StatusOr<tensor::FlatModel> model = trainer_->GetParameters();
    absl::Status s =
        model.ok() ? tensor::WriteModelFile(options_.final_model_out, *model) : model.status();
    if (!s.ok()) {
      LogError("--final-model-out: ", s.message());
      failed = true;
    }
  }
  if (!options_.report_out.empty()) {
    const double accuracy =
        eval && eval->total() > 0 ? static_cast<double>(eval->correct()) / eval->total() : 0;
    std::string json = absl::StrCat(
        "{\"node\": ", JsonString(peer_id_), ", \"task\": ", JsonString(spec_.name()),
        ", \"ok\": ", failed ? "false" : "true", ", \"steps\": ", progress.step(),
        ", \"clock\": ", task::JsonNumber(progress.clock()), ", \"members\": ", other_members + 1,
        ", \"fetches\": ", progress.fetches(), ", \"bytes_pulled\": ", progress.bytes_pulled(),
        ", \"fetches_started\": ", task::JsonNumber(metrics_->gossip.fetches_started.Value()),
        ", \"bytes_served\": ", task::JsonNumber(metrics_->bytes_sent.Value()),
        ", \"correct\": ", eval ? eval->correct() : 0, ", \"total\": ", eval ? eval->total() : 0,
        ", \"accuracy\": ", task::JsonNumber(accuracy), ", \"test_loss\": ",
        task::JsonNumber(eval && eval->total() > 0 ? eval->loss_sum() / eval->total() : 0),
        ", \"wall_seconds\": ", task::JsonNumber(absl::ToDoubleSeconds(clock_.Now() - start)),
        "}\n");
    const std::string tmp = options_.report_out + ".tmp";
    std::ofstream out(tmp, std::ios::trunc);
    out << json;
    out.close();
    if (!out || std::rename(tmp.c_str(), options_.report_out.c_str()) != 0) {
      LogError("--report-out: cannot write ", options_.report_out);
      failed = true;
    }
  }
  bool exit_now;
  {
    absl::MutexLock lock(&mu_);
    failed_ = failed;
    exit_now = options_.exit_when_done;
  }
  if (exit_now) {
    rpc::RequestShutdown();
  } else {
    LogInfo("static gossip: done; serving the final model until stopped");
  }
}

int StaticGossipPeer::Run() {
  int signal = rpc::WaitForShutdownSignal();
  bool failed;
  {
    absl::MutexLock lock(&mu_);
    failed = failed_;
  }
  if (signal > 0) LogInfo("shutting down (signal ", signal, ")");
  Shutdown();
  return failed ? 1 : 0;
}

void StaticGossipPeer::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return;
    shut_down_ = true;
    stopping_ = true;
  }
  // No membership change reaches the runner after this.
  if (discovery_) discovery_->Stop();
  wakeup_.Notify();
  if (worker_.joinable()) worker_.join();
  runner_.reset();
  if (server_) server_->Shutdown(absl::Seconds(2));
}

}  // namespace shoal::peer
