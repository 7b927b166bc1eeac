// Measures shipping one large delta peer -> aggregator over 127.0.0.1 with PushUpdate (1 MiB
// chunks, validated and folded by the real AggregatorService), and downloading the aggregated
// model with GetModel (raw into storage kept from the repetition before, as a cluster aggregator
// fetches its parent's version; through the generated stub into a fresh buffer; and as a peer
// does: into a spill file, then into its parameters), against a raw TCP socket that moves the same
// bytes, in the same run. Prints, per path, its GB/s and its ratio to raw TCP (medians over the
// repetitions), the worst repetition's ratio, and the CPU seconds per GB the process spent (both
// ends).
//
// It also downloads a checkpoint of the same size from a coordinator (ControlService.GetModel)
// into a model file as shoalctl does, and fetches it from a peer's PeerService.GetSnapshot: as the
// decentralized exchange does (a round's update) and as a gossip fetch does (the latest snapshot,
// then interpolated into the fetching peer's parameters), each into storage kept from before.
//
//   transfer_bench [--mb 400] [--reps 3] [--chunk-kib 1024] [--tls-dir DIR]
//
// With --tls-dir (a directory from scripts/gen-certs with the identities aggregator-0,
// coordinator, peer-0 and peer-1) every path is measured twice in each repetition: plaintext and
// over mutual TLS.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <prometheus/registry.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "libs/common/clock.h"
#include "libs/common/executor.h"
#include "libs/gossip/interpolation.h"
#include "libs/rpc/channel.h"
#include "libs/rpc/model_stream.h"
#include "libs/rpc/server.h"
#include "libs/rpc/status.h"
#include "libs/rpc/tls.h"
#include "libs/tensor/model_file.h"
#include "libs/tensor/spill_file.h"
#include "libs/tensor/xor_delta.h"
#include "services/aggregator/aggregator_core.h"
#include "services/aggregator/aggregator_metrics.h"
#include "services/aggregator/aggregator_service.h"
#include "services/aggregator/download_deltas.h"
#include "services/aggregator/grpc_aggregator_client.h"
#include "services/aggregator/grpc_parent_link.h"
#include "services/coordinator/coordinator_server.h"
#include "services/coordinator/store/sqlite_task_store.h"
#include "services/peer_agent/grpc_peer_client.h"
#include "services/peer_agent/peer_metrics.h"
#include "services/peer_agent/peer_service.h"
#include "services/peer_agent/snapshot_store.h"
#include "services/shoalctl/control_client.h"
#include "shoal/aggregator/v1/aggregator.grpc.pb.h"
#include "tests/bench/raw_tcp.h"

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "transfer_bench: %s\n", what.c_str());
  std::exit(1);
}

// CPU seconds (user + system, all threads) this process has used so far.
double CpuSeconds(const struct rusage& ru) {
  auto s = [](const timeval& tv) { return tv.tv_sec + tv.tv_usec / 1e6; };
  return s(ru.ru_utime) + s(ru.ru_stime);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The peer id of every push: with TLS, the name of the peer certificate the pushes use.
constexpr char kPeer[] = "peer-0";

// One aggregator server over one core, and the channels that call it: the coordinator's (puts,
// rounds, downloads) and a peer's (pushes). With a TLS directory from scripts/gen-certs
// (identities aggregator-0, coordinator and peer-0), everything is mutual TLS.
struct Endpoint {
  std::string name;
  // Where a child round's partial sum would go (no tree round runs here).
  std::unique_ptr<shoal::aggregator::GrpcAggregatorClient> parents;
  std::unique_ptr<shoal::aggregator::GrpcParentLink> parent_link;
  std::unique_ptr<shoal::aggregator::DownloadDeltas> downloads;  // none ask against held here
  std::unique_ptr<shoal::aggregator::AggregatorServiceImpl> service;
  std::unique_ptr<shoal::rpc::Server> server;
  std::shared_ptr<grpc::Channel> channel;       // as the coordinator
  std::shared_ptr<grpc::Channel> peer_channel;  // as peer-0
  std::unique_ptr<shoal::aggregator::v1::AggregatorService::Stub> stub, peer_stub;
  std::unique_ptr<shoal::aggregator::GrpcAggregatorClient> client;  // as the coordinator
  // A real coordinator serving a checkpoint of the delta (ControlService.GetModel), and
  // shoalctl's client of it.
  std::string state_dir;
  std::unique_ptr<shoal::coordinator::CoordinatorServer> coordinator;
  std::unique_ptr<shoal::shoalctl::ControlClient> control;
  std::vector<double> push_zc, push_pb, get_raw, get_pb, get_file, get_checkpoint;  // s per rep
  std::vector<double> write_checkpoint, restore_checkpoint;                         // s per rep
  // A peer (peer-1) serving snapshots (PeerService.GetSnapshot), and peer-0's client of it.
  std::unique_ptr<shoal::peer::PeerServiceImpl> peer_service;
  std::unique_ptr<shoal::rpc::Server> peer_server;
  std::unique_ptr<shoal::peer::GrpcPeerClient> peer_client;
  std::vector<double> get_snapshot, gossip_fetch;  // s per rep
  // Storage touched before, as the services decode into after their first rounds: a
  // decentralized fetch into a folded update's (tensor::BufferPool), a gossip fetch into the
  // last snapshot's it mixed in (kept_update); a cluster aggregator's fetch of its parent's
  // version into a staging buffer kept for the pushes (AggregatorCore::TakeBuffer; kept_version).
  std::vector<float> kept_update, kept_version;
  // The process's CPU seconds (both ends: one process) per rep, by the path's vector above.
  std::map<const std::vector<double>*, std::vector<double>> cpu_s;
  ~Endpoint() {
    if (peer_server) peer_server->Shutdown(absl::Seconds(1));
    if (coordinator) coordinator->Shutdown();
    coordinator.reset();
    if (!state_dir.empty()) std::filesystem::remove_all(state_dir);
  }
};

// A coordinator state directory holding a completed task "bench" whose newest checkpoint is
// `model`, as a coordinator leaves it; the coordinator started on it serves that checkpoint.
void WriteCheckpointState(const std::string& dir, const shoal::tensor::FlatModel& model) {
  auto store = shoal::coordinator::SqliteTaskStore::Open(dir);
  if (!store.ok()) Die("state dir: " + store.status().ToString());
  shoal::coordinator::v1::TaskStatus status;
  status.mutable_spec()->set_name("bench");
  status.mutable_spec()->set_mode(shoal::common::v1::MODE_FEDERATED_SYNC);
  status.set_state(shoal::coordinator::v1::TASK_STATE_COMPLETED);
  status.set_model_version(1);
  if (absl::Status s = (*store)->PutTask(status); !s.ok()) Die("PutTask: " + s.ToString());
  shoal::coordinator::StoredCheckpoint c;
  c.task = "bench";
  c.version = 1;
  c.round = 1;
  c.digest = absl::StrFormat("%016x", model.Digest());
  c.path = (*store)->checkpoint_dir() + "/" + c.digest + ".model";
  if (absl::Status s = shoal::tensor::WriteModelFile(c.path, model); !s.ok()) {
    Die("checkpoint: " + s.ToString());
  }
  if (absl::Status s = (*store)->PutCheckpoint(c); !s.ok()) Die("PutCheckpoint: " + s.ToString());
}

std::shared_ptr<grpc::ChannelCredentials> ClientCredentials(const std::string& tls_dir,
                                                            const std::string& identity) {
  if (tls_dir.empty()) return grpc::InsecureChannelCredentials();
  auto credentials = shoal::rpc::Credentials::Create({tls_dir + "/" + identity, false});
  if (!credentials.ok()) Die(std::string(credentials.status().message()));
  return credentials->channel();
}

// A server of `service` on 127.0.0.1:0; with a TLS directory, mutual TLS as `identity`.
std::unique_ptr<shoal::rpc::Server> StartServer(const std::string& name, const std::string& tls_dir,
                                                const std::string& identity,
                                                grpc::Service* service) {
  shoal::rpc::ServerOptions options;
  options.listen = "127.0.0.1:0";
  options.service_name = name;
  if (!tls_dir.empty()) {
    auto credentials = shoal::rpc::Credentials::Create({tls_dir + "/" + identity, false});
    if (!credentials.ok()) Die(std::string(credentials.status().message()));
    options.credentials = credentials->server();
  }
  auto server = shoal::rpc::Server::Start(options, {service});
  if (!server.ok()) Die(std::string(server.status().message()));
  return *std::move(server);
}

std::unique_ptr<Endpoint> StartEndpoint(const std::string& name, const std::string& tls_dir,
                                        shoal::aggregator::AggregatorCore& core,
                                        shoal::Executor& executor,
                                        shoal::aggregator::AggregatorMetrics& metrics,
                                        const shoal::aggregator::AggregatorCoreOptions& options,
                                        const shoal::tensor::FlatModel& checkpoint,
                                        const shoal::peer::SnapshotStore& snapshots,
                                        shoal::peer::PeerMetrics& peer_metrics) {
  auto e = std::make_unique<Endpoint>();
  e->name = name;
  e->parents = std::make_unique<shoal::aggregator::GrpcAggregatorClient>();
  e->parent_link = std::make_unique<shoal::aggregator::GrpcParentLink>(*e->parents, metrics);
  e->downloads = std::make_unique<shoal::aggregator::DownloadDeltas>(executor);
  e->service = std::make_unique<shoal::aggregator::AggregatorServiceImpl>(
      shoal::aggregator::AggregatorServiceOptions{options.limits}, core, executor, executor,
      metrics, *e->parents, *e->parent_link, *e->downloads);
  e->server = StartServer("transfer-bench", tls_dir, "aggregator-0", e->service.get());
  const auto coordinator = ClientCredentials(tls_dir, "coordinator");
  e->channel = shoal::rpc::MakeChannel(e->server->address(), coordinator);
  e->peer_channel =
      shoal::rpc::MakeChannel(e->server->address(), ClientCredentials(tls_dir, kPeer));
  e->stub = shoal::aggregator::v1::AggregatorService::NewStub(e->channel);
  e->peer_stub = shoal::aggregator::v1::AggregatorService::NewStub(e->peer_channel);
  e->client = std::make_unique<shoal::aggregator::GrpcAggregatorClient>(coordinator);

  char dir[] = "/tmp/shoal-transfer-bench-XXXXXX";
  if (::mkdtemp(dir) == nullptr) Die("mkdtemp");
  e->state_dir = dir;
  WriteCheckpointState(e->state_dir, checkpoint);
  shoal::coordinator::CoordinatorServerOptions coordinator_options;
  coordinator_options.listen = "127.0.0.1:0";
  coordinator_options.metrics_listen = "127.0.0.1:0";
  coordinator_options.state_dir = e->state_dir;
  coordinator_options.tls.insecure = tls_dir.empty();
  if (!tls_dir.empty()) coordinator_options.tls.dir = tls_dir + "/coordinator";
  auto started = shoal::coordinator::CoordinatorServer::Start(coordinator_options);
  if (!started.ok()) Die("coordinator: " + started.status().ToString());
  e->coordinator = *std::move(started);
  auto control = shoal::shoalctl::ControlClient::Create(e->coordinator->address(),
                                                        ClientCredentials(tls_dir, kPeer));
  if (!control.ok()) Die("control client: " + control.status().ToString());
  e->control = *std::move(control);

  e->peer_service = std::make_unique<shoal::peer::PeerServiceImpl>(snapshots, peer_metrics);
  e->peer_server = StartServer("transfer-bench-peer", tls_dir, "peer-1", e->peer_service.get());
  e->peer_client = std::make_unique<shoal::peer::GrpcPeerClient>(
      tls_dir.empty() ? nullptr : ClientCredentials(tls_dir, kPeer));
  return e;
}

}  // namespace

int main(int argc, char** argv) {
  shoal::rpc::TuneAllocatorForModelStreams();
  size_t mb = 400;
  int reps = 3;
  size_t chunk_kib = 1024;
  std::string tls_dir;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i];
    if (flag == "--mb")
      mb = std::strtoul(argv[i + 1], nullptr, 10);
    else if (flag == "--reps")
      reps = std::atoi(argv[i + 1]);
    else if (flag == "--chunk-kib")
      chunk_kib = std::strtoul(argv[i + 1], nullptr, 10);
    else if (flag == "--tls-dir")
      tls_dir = argv[i + 1];
    else
      Die("unknown flag " + flag + " (use --mb N --reps N --chunk-kib N --tls-dir DIR)");
  }
  if (mb == 0 || reps < 1 || chunk_kib == 0 || chunk_kib > 4096) Die("bad arguments");
  const size_t chunk = chunk_kib << 10;

  // A model shaped like a few big layers: 4 tensors, `mb` MB of float32 in total.
  const size_t total = mb * 1000 * 1000 / sizeof(float);
  const size_t quarter = total / 4;
  auto layout = shoal::tensor::ModelLayout::Create(
      {{"layer1.weight", {static_cast<int64_t>(quarter)}},
       {"layer2.weight", {static_cast<int64_t>(quarter)}},
       {"layer3.weight", {static_cast<int64_t>(quarter)}},
       {"layer4.weight", {static_cast<int64_t>(total - 3 * quarter)}}});
  if (!layout.ok()) Die(std::string(layout.status().message()));
  shoal::tensor::FlatModel base;
  auto delta_owned = std::make_shared<shoal::tensor::FlatModel>();
  base.layout = delta_owned->layout = *layout;
  base.values.assign(total, 0.5f);
  delta_owned->values.resize(total);
  for (size_t i = 0; i < total; ++i) {
    delta_owned->values[i] = 1e-3f * static_cast<float>(i % 1000);
  }
  std::shared_ptr<const shoal::tensor::FlatModel> delta = delta_owned;
  const size_t bytes = delta->layout.total_bytes();
  std::printf("delta: %.1f MB in %zu tensors, %zu KiB chunks, %d reps\n", bytes / 1e6,
              delta->layout.num_tensors(), chunk_kib, reps);

  // The real aggregator service, in process, over real gRPC on 127.0.0.1: plaintext, and with
  // mutual TLS when --tls-dir is given (both servers share one AggregatorCore).
  prometheus::Registry registry;
  shoal::aggregator::AggregatorMetrics metrics(registry);
  shoal::aggregator::AggregatorCoreOptions core_options;
  core_options.max_concurrent_pushes = 2;  // pooled staging buffers are reused
  auto core =
      shoal::aggregator::AggregatorCore::Create(core_options, shoal::RealClock::Get(), metrics);
  if (!core.ok()) Die(std::string(core.status().message()));
  shoal::ThreadPool executor(2, 16);
  // What a peer publishes: its round-1 update (the decentralized exchange) and its latest
  // parameters (gossip), both the delta.
  shoal::peer::SnapshotStore snapshots;
  snapshots.Publish({.task = "bench",
                     .version = 1,
                     .model = delta,
                     .kind = shoal::peer::v1::SNAPSHOT_KIND_ROUND_UPDATE,
                     .round = 1,
                     .num_samples = 1});
  snapshots.Publish({.task = "bench", .version = 1, .model = delta});
  shoal::peer::PeerMetrics peer_metrics(registry);
  std::vector<std::unique_ptr<Endpoint>> endpoints;
  endpoints.push_back(StartEndpoint("plaintext", "", **core, executor, metrics, core_options,
                                    *delta, snapshots, peer_metrics));
  if (!tls_dir.empty()) {
    endpoints.push_back(StartEndpoint("TLS", tls_dir, **core, executor, metrics, core_options,
                                      *delta, snapshots, peer_metrics));
  }

  {
    Endpoint& e = *endpoints.front();
    grpc::ClientContext ctx;
    shoal::rpc::SetTimeout(ctx, absl::Seconds(120));
    shoal::aggregator::v1::PutModelResponse response;
    auto writer = e.stub->PutModel(&ctx, &response);
    auto start = Clock::now();
    absl::Status s = shoal::rpc::WritePutModel(
        *writer, shoal::tensor::MakeModelMeta("bench", 0, base), base, chunk);
    if (!s.ok()) Die("PutModel: " + s.ToString());
    std::printf("PutModel (base model, fresh buffers): %.2f GB/s\n",
                bytes / 1e9 / Seconds(start, Clock::now()));
  }

  std::vector<char> sink(bytes, 1);  // touched, like a pooled staging buffer
  std::vector<double> tcp_s;
  // GetModel of the aggregated model: raw (chunks decoded straight from the received slices)
  // into storage kept from before, as a cluster aggregator fetches its parent's version, or
  // through the generated stub (protobuf parses each chunk first) into a fresh buffer.
  auto get_model = [&](Endpoint& e, bool raw) {
    grpc::ClientContext ctx;
    shoal::rpc::SetTimeout(ctx, absl::Seconds(120));
    shoal::aggregator::v1::GetModelRequest request;
    request.set_task("bench");
    if (raw && e.kept_version.size() != bytes / sizeof(float)) {
      e.kept_version.assign(bytes / sizeof(float), 0.0f);  // touched, as after a first round
    }
    auto start = Clock::now();
    absl::StatusOr<shoal::tensor::ReceivedModel> got;
    if (raw) {
      auto reader = shoal::rpc::OpenRawReader(
          *e.channel, "/shoal.aggregator.v1.AggregatorService/GetModel", ctx, request);
      got = shoal::rpc::ReadModelStreamWith(
          *reader,
          [&](const shoal::common::v1::ModelMeta& meta) {
            return shoal::tensor::FrameDecoder::ForMeta(meta, {}, /*require_finite=*/false, nullptr,
                                                        nullptr, std::move(e.kept_version));
          },
          &ctx);
    } else {
      auto reader = e.stub->GetModel(&ctx, request);
      got = shoal::rpc::ReadModelStream(*reader, {}, &ctx);
    }
    const double seconds = Seconds(start, Clock::now());
    if (!got.ok()) Die("GetModel (" + e.name + "): " + got.status().ToString());
    if (got->model.layout.total_bytes() != bytes) Die("GetModel: wrong size");
    if (raw) e.kept_version = std::move(got->model.values);
    return seconds;
  };
  // A checkpoint download from the coordinator (ControlService.GetModel, served from the mapped
  // checkpoint file) into a model file, as `shoalctl model get --out FILE` makes it.
  auto get_checkpoint = [&](Endpoint& e) {
    auto start = Clock::now();
    auto got = e.control->GetModelFile("bench", std::nullopt, e.state_dir + "/downloaded.model",
                                       absl::Seconds(120), nullptr);
    const double seconds = Seconds(start, Clock::now());
    if (!got.ok()) Die("ControlService.GetModel (" + e.name + "): " + got.status().ToString());
    if (got->model.layout.total_bytes() != bytes) Die("ControlService.GetModel: wrong size");
    return seconds;
  };
  // Each timed push gets a round of its own, closed before the next push starts, so every
  // measurement begins on an idle aggregator (as the raw TCP one does): the folds that follow
  // an acknowledged push belong to its round, not to the next transfer's time.
  uint64_t round = 0;
  shoal::aggregator::v1::AggregatorService::Stub& control = *endpoints.front()->stub;
  auto open_round = [&] {
    ++round;
    grpc::ClientContext ctx;
    shoal::rpc::SetTimeout(ctx, absl::Seconds(10));
    shoal::aggregator::v1::OpenRoundRequest request;
    request.set_task("bench");
    request.set_round(round);
    request.set_base_version(round - 1);
    request.add_expected_peers(kPeer);
    shoal::aggregator::v1::OpenRoundResponse response;
    grpc::Status s = control.OpenRound(&ctx, request, &response);
    if (!s.ok()) Die("OpenRound: " + s.error_message());
    shoal::aggregator::v1::UpdateMeta meta;
    meta.set_task("bench");
    meta.set_round(round);
    meta.set_peer_id(kPeer);
    meta.set_base_version(round - 1);
    meta.set_num_samples(1);
    return meta;
  };
  auto close_round = [&] {
    grpc::ClientContext ctx;
    shoal::rpc::SetTimeout(ctx, absl::Seconds(60));
    shoal::aggregator::v1::CloseRoundRequest request;
    request.set_task("bench");
    request.set_round(round);
    shoal::aggregator::v1::CloseRoundResponse closed;
    grpc::Status s = control.CloseRound(&ctx, request, &closed);
    if (!s.ok()) Die("CloseRound: " + s.error_message());
    if (closed.contributors_size() != 1) Die("the push was not aggregated");
  };
  // One push of the delta in its own round: zero-copy (what peers use) or through the generated
  // stub. Returns seconds; `cpu` gets the CPU seconds the process used, `faults` its page faults.
  auto push = [&](Endpoint& e, bool zero_copy, double* cpu, long* faults) {
    const auto meta = open_round();
    grpc::ClientContext ctx;
    shoal::rpc::SetTimeout(ctx, absl::Seconds(120));
    struct rusage ru0, ru1;
    ::getrusage(RUSAGE_SELF, &ru0);
    auto start = Clock::now();
    absl::Status s;
    if (zero_copy) {
      s = shoal::rpc::PushUpdateZeroCopy(*e.peer_channel, ctx, meta,
                                         shoal::tensor::EncodeRaw(delta), chunk)
              .status();
    } else {
      shoal::aggregator::v1::PushUpdateResponse response;
      auto writer = e.peer_stub->PushUpdate(&ctx, &response);
      s = shoal::rpc::WritePushUpdate(*writer, meta, *delta, chunk);
    }
    auto end = Clock::now();
    ::getrusage(RUSAGE_SELF, &ru1);
    if (!s.ok()) Die("PushUpdate (" + e.name + "): " + s.ToString());
    if (cpu != nullptr) *cpu = CpuSeconds(ru1) - CpuSeconds(ru0);
    if (faults != nullptr) *faults = ru1.ru_minflt - ru0.ru_minflt;
    close_round();
    return Seconds(start, end);
  };
  // The peer's own download (GetModelInto): the values go to a spill file as they arrive, then
  // from the file into the parameters (here: into a buffer of the model's size, kept between
  // repetitions as a peer keeps its parameters).
  std::vector<float> params(total);
  auto get_into_file = [&](Endpoint& e) {
    auto file = shoal::tensor::SpillFile::Create("");
    if (!file.ok()) Die("spill file: " + file.status().ToString());
    auto start = Clock::now();
    if (absl::Status s = file->Reset(total); !s.ok()) Die("spill file: " + s.ToString());
    auto layout = e.client->GetModelInto(
        e.server->address(), "bench", round, {}, absl::Now() + absl::Seconds(120),
        [&](size_t first, absl::Span<const float> values) { return file->WriteAt(first, values); },
        /*held=*/nullptr);
    if (!layout.ok()) Die("GetModelInto (" + e.name + "): " + layout.status().ToString());
    if (absl::Status s = file->ReadAt(0, absl::MakeSpan(params)); !s.ok()) {
      Die("spill file: " + s.ToString());
    }
    return Seconds(start, Clock::now());
  };
  // A checkpoint as the coordinator writes one (AggregatorWorkRunner::Checkpoint): streamed from
  // the aggregator into a ModelFileWriter at the layout's values offset, then the header, fsync
  // and rename; and restored as it restores one (the file mapped and checked, then PutModel from
  // its pages, here to a task of its own so that the rounds go on).
  auto write_checkpoint = [&](Endpoint& e) {
    const std::string dir = e.state_dir + "/bench-checkpoints";
    std::filesystem::create_directories(dir);
    auto start = Clock::now();
    auto file = shoal::tensor::ModelFileWriter::Create(
        dir, shoal::tensor::ModelFileValuesOffset(delta->layout));
    if (!file.ok()) Die("checkpoint file: " + file.status().ToString());
    auto layout = e.client->GetModelInto(
        e.server->address(), "bench", round, {}, absl::Now() + absl::Seconds(120),
        [&](size_t first, absl::Span<const float> values) { return (*file)->Write(first, values); },
        /*held=*/nullptr);
    if (!layout.ok()) Die("checkpoint (" + e.name + "): " + layout.status().ToString());
    if (absl::Status s = (*file)->Commit(layout->layout, dir + "/bench.model"); !s.ok()) {
      Die("checkpoint: " + s.ToString());
    }
    return Seconds(start, Clock::now());
  };
  uint64_t restored = 0;
  auto restore_checkpoint = [&](Endpoint& e) {
    auto start = Clock::now();
    auto file =
        shoal::tensor::MappedModelFile::Open(e.state_dir + "/bench-checkpoints/bench.model");
    if (!file.ok()) Die("restore: " + file.status().ToString());
    const auto meta = shoal::tensor::MakeModelMeta("restored", ++restored, (*file)->layout());
    auto put = e.client->PutModel(e.server->address(), meta, shoal::tensor::EncodeRaw(*file), {},
                                  absl::Now() + absl::Seconds(120));
    if (!put.ok()) Die("restore (" + e.name + "): " + put.status().ToString());
    return Seconds(start, Clock::now());
  };
  // PeerService.GetSnapshot as the decentralized exchange fetches a round's update (into the
  // storage of an update folded before, kept until the round's aggregate), and as a gossip fetch
  // does: the latest snapshot into the storage of the one mixed in before, then interpolated
  // into this peer's parameters.
  auto get_snapshot = [&](Endpoint& e, bool gossip) {
    shoal::peer::v1::GetSnapshotRequest request;
    request.set_task("bench");
    request.set_peer_id(kPeer);
    if (!gossip) {
      request.set_kind(shoal::peer::v1::SNAPSHOT_KIND_ROUND_UPDATE);
      request.set_round(1);
    }
    // Storage kept from a round before: touched already, as every repetition's after the first.
    if (e.kept_update.size() != delta->values.size()) {
      e.kept_update.assign(delta->values.size(), 0.0f);
    }
    auto start = Clock::now();
    auto got =
        e.peer_client->Fetch(e.peer_server->address(), request, absl::Now() + absl::Seconds(120),
                             delta->layout, nullptr, std::move(e.kept_update));
    if (!got.ok()) Die("GetSnapshot (" + e.name + "): " + got.status().ToString());
    if (gossip) {
      absl::Status s = shoal::gossip::Interpolate(0.5, got->model.values, absl::MakeSpan(params));
      if (!s.ok()) Die("interpolate: " + s.ToString());
    }
    const double seconds = Seconds(start, Clock::now());
    e.kept_update = std::move(got->model.values);
    return seconds;
  };
  // One repetition of a path: its seconds, and the process's CPU seconds meanwhile.
  auto measure = [](Endpoint& e, std::vector<double>& times, const auto& path) {
    struct rusage ru0, ru1;
    ::getrusage(RUSAGE_SELF, &ru0);
    times.push_back(path());
    ::getrusage(RUSAGE_SELF, &ru1);
    e.cpu_s[&times].push_back(CpuSeconds(ru1) - CpuSeconds(ru0));
  };
  std::vector<double> tcp_cpu_s;
  for (int rep = 1; rep <= reps; ++rep) {
    for (auto& e : endpoints) {
      long faults = 0;
      double zc_cpu = 0;  // CPU seconds the process used during the zero-copy push
      measure(*e, e->push_pb, [&] { return push(*e, /*zero_copy=*/false, nullptr, nullptr); });
      measure(*e, e->push_zc, [&] { return push(*e, /*zero_copy=*/true, &zc_cpu, &faults); });
      std::printf(
          "rep %d, %s: PushUpdate zero-copy %.2f GB/s (%.0f ms, %.0f ms CPU, %ld page "
          "faults), protobuf %.2f GB/s\n",
          rep, e->name.c_str(), bytes / 1e9 / e->push_zc.back(), e->push_zc.back() * 1e3,
          zc_cpu * 1e3, faults, bytes / 1e9 / e->push_pb.back());
    }
    struct rusage ru0, ru1;
    ::getrusage(RUSAGE_SELF, &ru0);
    tcp_s.push_back(shoal::bench::RawTcpSeconds(reinterpret_cast<const char*>(delta->values.data()),
                                                bytes, chunk, sink));
    ::getrusage(RUSAGE_SELF, &ru1);
    tcp_cpu_s.push_back(CpuSeconds(ru1) - CpuSeconds(ru0));
    // CPU time is less disturbed by other load on the machine than wall time.
    std::printf("rep %d: raw TCP %.2f GB/s (%.0f ms, %.0f ms CPU)\n", rep,
                bytes / 1e9 / tcp_s.back(), tcp_s.back() * 1e3, tcp_cpu_s.back() * 1e3);
    for (auto& e : endpoints) {
      // Alternately first: the first of the two may find fewer free huge pages.
      if (rep % 2 == 1) measure(*e, e->get_raw, [&] { return get_model(*e, /*raw=*/true); });
      measure(*e, e->get_pb, [&] { return get_model(*e, /*raw=*/false); });
      if (rep % 2 == 0) measure(*e, e->get_raw, [&] { return get_model(*e, /*raw=*/true); });
      measure(*e, e->get_file, [&] { return get_into_file(*e); });
      measure(*e, e->get_checkpoint, [&] { return get_checkpoint(*e); });
      measure(*e, e->write_checkpoint, [&] { return write_checkpoint(*e); });
      measure(*e, e->restore_checkpoint, [&] { return restore_checkpoint(*e); });
      measure(*e, e->get_snapshot, [&] { return get_snapshot(*e, /*gossip=*/false); });
      measure(*e, e->gossip_fetch, [&] { return get_snapshot(*e, /*gossip=*/true); });
      std::printf(
          "rep %d, %s: GetModel raw %.2f GB/s, protobuf %.2f GB/s; to a spill file and into "
          "the parameters (a peer's download) %.2f GB/s; a checkpoint from the coordinator "
          "%.2f GB/s; checkpoint write %.2f GB/s, restore %.2f GB/s; GetSnapshot %.2f GB/s, "
          "gossip fetch %.2f GB/s\n",
          rep, e->name.c_str(), bytes / 1e9 / e->get_raw.back(), bytes / 1e9 / e->get_pb.back(),
          bytes / 1e9 / e->get_file.back(), bytes / 1e9 / e->get_checkpoint.back(),
          bytes / 1e9 / e->write_checkpoint.back(), bytes / 1e9 / e->restore_checkpoint.back(),
          bytes / 1e9 / e->get_snapshot.back(), bytes / 1e9 / e->gossip_fetch.back());
    }
    std::fflush(stdout);
  }
  // Each rep measures gRPC and TCP back to back, so the per-rep ratio is the least disturbed by
  // other load on the machine.
  auto ratios = [&](const std::vector<double>& path_s) {
    std::vector<double> per_rep;
    for (size_t i = 0; i < path_s.size(); ++i) per_rep.push_back(tcp_s[i] / path_s[i]);
    return per_rep;
  };
  auto ratio = [&](const std::vector<double>& path_s) { return Median(ratios(path_s)); };
  const double gb = bytes / 1e9;
  const double tcp_gbps = gb / Median(tcp_s);
  std::printf(
      "\nmedians of %d reps; ratio = median of the per-rep ratios to raw TCP (%.2f GB/s, %.2f "
      "CPU-s/GB), worst = the smallest of them; CPU-s/GB: the process's CPU (both ends) per GB "
      "moved, median\n",
      reps, tcp_gbps, Median(tcp_cpu_s) / gb);
  std::printf("%-60s", "path");
  for (auto& e : endpoints) std::printf("  %-9s GB/s  ratio  worst  CPU-s/GB", e->name.c_str());
  std::printf("\n");
  auto row = [&](const char* path, std::vector<double> Endpoint::*times) {
    std::printf("%-60s", path);
    for (auto& e : endpoints) {
      const std::vector<double>& s = (*e).*times;
      const std::vector<double> r = ratios(s);
      std::printf("  %14.2f  %5.2f  %5.2f  %8.2f", gb / Median(s), Median(r),
                  *std::min_element(r.begin(), r.end()), Median(e->cpu_s[&s]) / gb);
    }
    std::printf("\n");
  };
  row("PushUpdate, zero-copy (peers)", &Endpoint::push_zc);
  row("PushUpdate, generated stub", &Endpoint::push_pb);
  row("GetModel, raw, into kept storage (cluster aggregators)", &Endpoint::get_raw);
  row("GetModel, generated stub, into a fresh buffer", &Endpoint::get_pb);
  row("a peer's download (GetModelInto a spill file, then params)", &Endpoint::get_file);
  row("ControlService.GetModel (a checkpoint, into a model file)", &Endpoint::get_checkpoint);
  row("checkpoint write (streamed to its file, fsync, rename)", &Endpoint::write_checkpoint);
  row("checkpoint restore (mapped file, PutModel)", &Endpoint::restore_checkpoint);
  row("PeerService.GetSnapshot (decentralized exchange, sync)", &Endpoint::get_snapshot);
  row("a gossip fetch (GetSnapshot, interpolated into params)", &Endpoint::gossip_fetch);
  // Encoding a version against the one the peers hold (ENCODING_XOR_SPARSE_ZLIB, what the
  // aggregator does for --download-against-held): on one thread, then split over one thread per
  // core (tensor::EncodeXorDelta's threads, as the aggregator passes them), on the same two
  // versions: the delta as a model, and the same after a step of dense SGD (every value moved by up
  // to 1e-4 of itself, so its low mantissa bits change).
  {
    auto held = std::make_shared<shoal::tensor::FlatModel>(*delta_owned);
    for (size_t i = 0; i < total; ++i) held->values[i] += 0.01f;
    auto next = std::make_shared<shoal::tensor::FlatModel>(*held);
    uint64_t x = 88172645463325252ull;
    for (float& v : next->values) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      v *= 1.0f + 1e-4f * (static_cast<float>(x >> 40) / static_cast<float>(1ull << 23) - 1.0f);
    }
    const int threads =
        std::clamp<int>(static_cast<int>(std::thread::hardware_concurrency()), 2, 8);
    auto encode = [&](int on) {
      const auto t0 = Clock::now();
      auto encoded = shoal::tensor::EncodeXorDelta(next, *held, nullptr, on);
      if (!encoded.ok()) Die(std::string(encoded.status().message()));
      return std::make_pair(Seconds(t0, Clock::now()),
                            static_cast<double>((*encoded)->payload_bytes()) / bytes);
    };
    const auto [alone_s, ratio_alone] = encode(1);
    const auto [helped_s, ratio_helped] = encode(threads);
    std::printf(
        "encoding against the held version (XOR_SPARSE_ZLIB): one thread %.2f s (%.0f MB/s), on %d "
        "threads %.2f s (%.0f MB/s): %.2fx; %.0f %% of the bytes either way%s\n",
        alone_s, bytes / 1e6 / alone_s, threads, helped_s, bytes / 1e6 / helped_s,
        alone_s / helped_s, 100 * ratio_alone,
        ratio_alone == ratio_helped ? "" : " (the sizes differ: a bug)");
  }
  Endpoint& plain = *endpoints.front();
  std::printf("RESULT grpc_gbps=%.3f tcp_gbps=%.3f ratio=%.3f get_ratio=%.3f\n",
              bytes / 1e9 / Median(plain.push_zc), tcp_gbps, ratio(plain.push_zc),
              ratio(plain.get_raw));
  for (auto& e : endpoints) e->server->Shutdown(absl::Seconds(1));
  executor.Shutdown();
  return 0;
}
