// Measures shipping one large delta peer -> aggregator over 127.0.0.1 with PushUpdate (1 MiB
// chunks, validated and folded by the real AggregatorService), and downloading the aggregated
// model with GetModel (raw, through the generated stub, and as a peer does: into a spill file,
// then into its parameters), against a raw TCP socket that moves the same bytes, in the same
// run. Prints GB/s for each and the ratios.
//
//   transfer_bench [--mb 400] [--reps 3] [--chunk-kib 1024]

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
#include <string>
#include <thread>
#include <vector>

#include "libs/common/clock.h"
#include "libs/common/executor.h"
#include "libs/rpc/channel.h"
#include "libs/rpc/model_stream.h"
#include "libs/rpc/server.h"
#include "libs/rpc/status.h"
#include "libs/tensor/spill_file.h"
#include "services/aggregator/aggregator_core.h"
#include "services/aggregator/aggregator_metrics.h"
#include "services/aggregator/aggregator_service.h"
#include "services/aggregator/grpc_aggregator_client.h"
#include "shoal/aggregator/v1/aggregator.grpc.pb.h"

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "transfer_bench: %s\n", what.c_str());
  std::exit(1);
}

// Sends `size` bytes from `data` to a receiver thread over one loopback TCP connection, the
// receiver writing into a preallocated (already touched) buffer. Returns seconds.
double RawTcp(const char* data, size_t size, size_t chunk, std::vector<char>& sink) {
  int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  if (::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) Die("bind");
  socklen_t len = sizeof(addr);
  ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len);
  ::listen(listener, 1);
  size_t received = 0;
  std::thread receiver([&] {
    int fd = ::accept(listener, nullptr, nullptr);
    while (received < size) {
      ssize_t n = ::recv(fd, sink.data() + received, std::min(chunk, size - received), 0);
      if (n <= 0) break;
      received += static_cast<size_t>(n);
    }
    ::close(fd);
  });
  auto start = Clock::now();
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) Die("connect");
  size_t sent = 0;
  while (sent < size) {
    ssize_t n = ::send(fd, data + sent, std::min(chunk, size - sent), 0);
    if (n <= 0) Die("send");
    sent += static_cast<size_t>(n);
  }
  receiver.join();
  auto end = Clock::now();
  ::close(fd);
  ::close(listener);
  if (received != size) Die("raw TCP receiver got too few bytes");
  return Seconds(start, end);
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

}  // namespace

int main(int argc, char** argv) {
  shoal::rpc::TuneAllocatorForModelStreams();
  size_t mb = 400;
  int reps = 3;
  size_t chunk_kib = 1024;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i];
    if (flag == "--mb")
      mb = std::strtoul(argv[i + 1], nullptr, 10);
    else if (flag == "--reps")
      reps = std::atoi(argv[i + 1]);
    else if (flag == "--chunk-kib")
      chunk_kib = std::strtoul(argv[i + 1], nullptr, 10);
    else
      Die("unknown flag " + flag + " (use --mb N --reps N --chunk-kib N)");
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

  // The real aggregator service, in process, over real gRPC on 127.0.0.1.
  prometheus::Registry registry;
  shoal::aggregator::AggregatorMetrics metrics(registry);
  shoal::aggregator::AggregatorCoreOptions core_options;
  core_options.max_concurrent_pushes = 2;  // pooled staging buffers are reused
  auto core =
      shoal::aggregator::AggregatorCore::Create(core_options, shoal::RealClock::Get(), metrics);
  if (!core.ok()) Die(std::string(core.status().message()));
  shoal::ThreadPool executor(2, 16);
  shoal::aggregator::AggregatorServiceImpl service({core_options.limits}, **core, executor,
                                                   metrics);
  shoal::rpc::ServerOptions server_options;
  server_options.listen = "127.0.0.1:0";
  server_options.service_name = "transfer-bench";
  auto server = shoal::rpc::Server::Start(server_options, {&service});
  if (!server.ok()) Die(std::string(server.status().message()));
  auto channel = shoal::rpc::MakeChannel((*server)->address());
  auto stub = shoal::aggregator::v1::AggregatorService::NewStub(channel);

  {
    grpc::ClientContext ctx;
    shoal::rpc::SetTimeout(ctx, absl::Seconds(120));
    shoal::aggregator::v1::PutModelResponse response;
    auto writer = stub->PutModel(&ctx, &response);
    auto start = Clock::now();
    absl::Status s = shoal::rpc::WritePutModel(
        *writer, shoal::tensor::MakeModelMeta("bench", 0, base), base, chunk);
    if (!s.ok()) Die("PutModel: " + s.ToString());
    std::printf("PutModel (base model, fresh buffers): %.2f GB/s\n",
                bytes / 1e9 / Seconds(start, Clock::now()));
  }

  std::vector<char> sink(bytes, 1);  // touched, like a pooled staging buffer
  std::vector<double> grpc_s, pb_s, tcp_s, get_s, get_pb_s, get_file_s;
  // GetModel of the aggregated model: raw (chunks decoded straight from the received slices,
  // what peers use) or through the generated stub (protobuf parses each chunk first).
  auto get_model = [&](bool raw) {
    grpc::ClientContext ctx;
    shoal::rpc::SetTimeout(ctx, absl::Seconds(120));
    shoal::aggregator::v1::GetModelRequest request;
    request.set_task("bench");
    auto start = Clock::now();
    absl::StatusOr<shoal::tensor::ReceivedModel> got;
    if (raw) {
      auto reader = shoal::rpc::OpenRawReader(
          *channel, "/shoal.aggregator.v1.AggregatorService/GetModel", ctx, request);
      got = shoal::rpc::ReadModelStream(*reader, {}, &ctx);
    } else {
      auto reader = stub->GetModel(&ctx, request);
      got = shoal::rpc::ReadModelStream(*reader, {}, &ctx);
    }
    const double seconds = Seconds(start, Clock::now());
    if (!got.ok()) Die("GetModel: " + got.status().ToString());
    if (got->model.layout.total_bytes() != bytes) Die("GetModel: wrong size");
    return seconds;
  };
  // Each timed push gets a round of its own, closed before the next push starts, so every
  // measurement begins on an idle aggregator (as the raw TCP one does): the folds that follow
  // an acknowledged push belong to its round, not to the next transfer's time.
  uint64_t round = 0;
  auto open_round = [&](const char* peer) {
    ++round;
    grpc::ClientContext ctx;
    shoal::rpc::SetTimeout(ctx, absl::Seconds(10));
    shoal::aggregator::v1::OpenRoundRequest request;
    request.set_task("bench");
    request.set_round(round);
    request.set_base_version(round - 1);
    request.add_expected_peers(peer);
    shoal::aggregator::v1::OpenRoundResponse response;
    grpc::Status s = stub->OpenRound(&ctx, request, &response);
    if (!s.ok()) Die("OpenRound: " + s.error_message());
    shoal::aggregator::v1::UpdateMeta meta;
    meta.set_task("bench");
    meta.set_round(round);
    meta.set_peer_id(peer);
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
    grpc::Status s = stub->CloseRound(&ctx, request, &closed);
    if (!s.ok()) Die("CloseRound: " + s.error_message());
    if (closed.contributors_size() != 1) Die("the push was not aggregated");
  };
  // The peer's own download (GetModelInto): the values go to a spill file as they arrive, then
  // from the file into the parameters (here: into a buffer of the model's size, kept between
  // repetitions as a peer keeps its parameters).
  shoal::aggregator::GrpcAggregatorClient client;
  std::vector<float> params(total);
  auto get_into_file = [&] {
    auto file = shoal::tensor::SpillFile::Create("");
    if (!file.ok()) Die("spill file: " + file.status().ToString());
    auto start = Clock::now();
    if (absl::Status s = file->Reset(total); !s.ok()) Die("spill file: " + s.ToString());
    auto layout = client.GetModelInto(
        (*server)->address(), "bench", round, {}, absl::Now() + absl::Seconds(120),
        [&](size_t first, absl::Span<const float> values) { return file->WriteAt(first, values); });
    if (!layout.ok()) Die("GetModelInto: " + layout.status().ToString());
    if (absl::Status s = file->ReadAt(0, absl::MakeSpan(params)); !s.ok()) {
      Die("spill file: " + s.ToString());
    }
    return Seconds(start, Clock::now());
  };
  for (int rep = 1; rep <= reps; ++rep) {
    long faults = 0;
    double zc_cpu = 0;  // CPU seconds the process used during the zero-copy push
    {
      const auto meta = open_round("pb");
      grpc::ClientContext ctx;
      shoal::rpc::SetTimeout(ctx, absl::Seconds(120));
      shoal::aggregator::v1::PushUpdateResponse response;
      auto start = Clock::now();
      auto writer = stub->PushUpdate(&ctx, &response);
      absl::Status s = shoal::rpc::WritePushUpdate(*writer, meta, *delta, chunk);
      auto end = Clock::now();
      if (!s.ok()) Die("PushUpdate (protobuf): " + s.ToString());
      pb_s.push_back(Seconds(start, end));
      close_round();
    }
    {
      const auto meta = open_round("zc");
      grpc::ClientContext ctx;
      shoal::rpc::SetTimeout(ctx, absl::Seconds(120));
      struct rusage ru0, ru1;
      ::getrusage(RUSAGE_SELF, &ru0);
      auto start = Clock::now();
      auto pushed = shoal::rpc::PushUpdateZeroCopy(*channel, ctx, meta, delta, chunk);
      auto end = Clock::now();
      ::getrusage(RUSAGE_SELF, &ru1);
      faults = ru1.ru_minflt - ru0.ru_minflt;
      zc_cpu = CpuSeconds(ru1) - CpuSeconds(ru0);
      if (!pushed.ok()) Die("PushUpdate (zero-copy): " + pushed.status().ToString());
      grpc_s.push_back(Seconds(start, end));
      close_round();
    }
    struct rusage ru0, ru1;
    ::getrusage(RUSAGE_SELF, &ru0);
    tcp_s.push_back(
        RawTcp(reinterpret_cast<const char*>(delta->values.data()), bytes, chunk, sink));
    ::getrusage(RUSAGE_SELF, &ru1);
    const double tcp_cpu = CpuSeconds(ru1) - CpuSeconds(ru0);
    // CPU time is less disturbed by other load on the machine than wall time.
    std::printf(
        "rep %d: PushUpdate zero-copy %.2f GB/s (%.0f ms, %.0f ms CPU, %ld page faults), "
        "protobuf %.2f GB/s (%.0f ms); raw TCP %.2f GB/s (%.0f ms, %.0f ms CPU)\n",
        rep, bytes / 1e9 / grpc_s.back(), grpc_s.back() * 1e3, zc_cpu * 1e3, faults,
        bytes / 1e9 / pb_s.back(), pb_s.back() * 1e3, bytes / 1e9 / tcp_s.back(),
        tcp_s.back() * 1e3, tcp_cpu * 1e3);
    // Alternately first: the first of the two may find fewer free huge pages.
    if (rep % 2 == 1) get_s.push_back(get_model(/*raw=*/true));
    get_pb_s.push_back(get_model(/*raw=*/false));
    if (rep % 2 == 0) get_s.push_back(get_model(/*raw=*/true));
    get_file_s.push_back(get_into_file());
    std::printf(
        "rep %d: GetModel raw %.2f GB/s, protobuf %.2f GB/s; to a spill file and into the "
        "parameters (a peer's download) %.2f GB/s\n",
        rep, bytes / 1e9 / get_s.back(), bytes / 1e9 / get_pb_s.back(),
        bytes / 1e9 / get_file_s.back());
    std::fflush(stdout);
  }
  const double grpc_best = *std::min_element(grpc_s.begin(), grpc_s.end());
  const double tcp_best = *std::min_element(tcp_s.begin(), tcp_s.end());
  const double grpc_gbps = bytes / 1e9 / Median(grpc_s);
  const double tcp_gbps = bytes / 1e9 / Median(tcp_s);
  const double pb_gbps = bytes / 1e9 / Median(pb_s);
  // Each rep measures gRPC and TCP back to back, so the per-rep ratio is the least disturbed by
  // other load on the machine.
  std::vector<double> ratios, pb_ratios, get_ratios, get_pb_ratios, get_file_ratios;
  for (size_t i = 0; i < grpc_s.size(); ++i) {
    get_file_ratios.push_back(tcp_s[i] / get_file_s[i]);
    ratios.push_back(tcp_s[i] / grpc_s[i]);
    pb_ratios.push_back(tcp_s[i] / pb_s[i]);
    get_ratios.push_back(tcp_s[i] / get_s[i]);
    get_pb_ratios.push_back(tcp_s[i] / get_pb_s[i]);
  }
  std::printf(
      "\nmedian of %d: raw TCP %.2f GB/s; gRPC PushUpdate zero-copy %.2f GB/s (ratio %.2f), "
      "protobuf %.2f GB/s (ratio %.2f)\n",
      reps, tcp_gbps, grpc_gbps, grpc_gbps / tcp_gbps, pb_gbps, pb_gbps / tcp_gbps);
  std::printf("best: raw TCP %.2f GB/s; gRPC PushUpdate zero-copy %.2f GB/s (ratio %.2f)\n",
              bytes / 1e9 / tcp_best, bytes / 1e9 / grpc_best, tcp_best / grpc_best);
  std::printf("median of per-rep ratios: zero-copy %.2f, protobuf %.2f\n", Median(ratios),
              Median(pb_ratios));
  std::printf(
      "GetModel, median of %d: raw %.2f GB/s, protobuf %.2f GB/s; median of per-rep "
      "ratios to raw TCP: raw %.2f, protobuf %.2f\n",
      reps, bytes / 1e9 / Median(get_s), bytes / 1e9 / Median(get_pb_s), Median(get_ratios),
      Median(get_pb_ratios));
  std::printf(
      "a peer's download (GetModelInto a spill file, then into the parameters), median of %d: "
      "%.2f GB/s; median of per-rep ratios to raw TCP: %.2f\n",
      reps, bytes / 1e9 / Median(get_file_s), Median(get_file_ratios));
  std::printf("RESULT grpc_gbps=%.3f tcp_gbps=%.3f ratio=%.3f get_ratio=%.3f\n", grpc_gbps,
              tcp_gbps, Median(ratios), Median(get_ratios));
  (*server)->Shutdown(absl::Seconds(1));
  executor.Shutdown();
  return 0;
}
