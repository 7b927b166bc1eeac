// A minimal program that calls the coordinator's ControlService from another service: the
// worked example of docs/reference/grpc-api.md ("Calling the coordinator from another
// service"). It lists the tasks and prints the per-round history of one of them, over mutual TLS.
//
//   shoal-control-example COORDINATOR_HOST:PORT TLS_DIR [TASK]
//
// TLS_DIR holds ca.crt, tls.crt and tls.key (scripts/gen-certs). Exit code 0 on success, 1 when
// a call fails (the gRPC status is printed), 2 on bad arguments.

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>

#include "libs/common/build_info.h"
#include "shoal/coordinator/v1/control.grpc.pb.h"

namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream content;
  content << in.rdbuf();
  return content.str();
}

// Every call carries a deadline.
void SetDeadline(grpc::ClientContext& context) {
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
}

}  // namespace

constexpr char kUsage[] = "usage: shoal-control-example COORDINATOR_HOST:PORT TLS_DIR [TASK]\n";

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::printf("%sLists the coordinator's tasks and prints the round history of TASK.\n",
                  kUsage);
      return 0;
    }
    if (arg == "--version") {
      std::printf("%s\n", shoal::VersionLine("shoal-control-example").c_str());
      return 0;
    }
    if (arg.size() > 1 && arg[0] == '-') {
      std::fprintf(stderr, "shoal-control-example: unknown flag %s\n%s", argv[i], kUsage);
      return 2;
    }
  }
  if (argc < 3 || argc > 4) {
    std::fprintf(stderr, "%s", kUsage);
    return 2;
  }
  const std::string tls_dir = argv[2];
  grpc::SslCredentialsOptions tls;
  tls.pem_root_certs = ReadFile(tls_dir + "/ca.crt");
  tls.pem_cert_chain = ReadFile(tls_dir + "/tls.crt");
  tls.pem_private_key = ReadFile(tls_dir + "/tls.key");
  if (tls.pem_root_certs.empty() || tls.pem_cert_chain.empty() || tls.pem_private_key.empty()) {
    std::fprintf(stderr, "%s: cannot read ca.crt, tls.crt and tls.key\n", tls_dir.c_str());
    return 2;
  }
  auto channel = grpc::CreateChannel(argv[1], grpc::SslCredentials(tls));
  auto control = shoal::coordinator::v1::ControlService::NewStub(channel);

  grpc::ClientContext list_context;
  SetDeadline(list_context);
  shoal::coordinator::v1::ListTasksResponse tasks;
  grpc::Status status = control->ListTasks(&list_context, {}, &tasks);
  if (!status.ok()) {
    std::fprintf(stderr, "ListTasks: %s\n", status.error_message().c_str());
    return 1;
  }
  for (const auto& task : tasks.tasks()) {
    std::printf("task %s: %s, round %llu of %u, model version %llu\n", task.spec().name().c_str(),
                shoal::coordinator::v1::TaskState_Name(task.state()).c_str(),
                static_cast<unsigned long long>(task.round()), task.spec().rounds(),
                static_cast<unsigned long long>(task.model_version()));
  }
  if (argc < 4) return 0;

  grpc::ClientContext status_context;
  SetDeadline(status_context);
  shoal::coordinator::v1::GetTaskStatusRequest request;
  request.set_name(argv[3]);
  shoal::coordinator::v1::GetTaskStatusResponse response;
  status = control->GetTaskStatus(&status_context, request, &response);
  if (!status.ok()) {
    std::fprintf(stderr, "GetTaskStatus: %s (code %d)\n", status.error_message().c_str(),
                 static_cast<int>(status.error_code()));
    return 1;
  }
  for (const auto& round : response.status().history()) {
    std::printf("round %llu: %d peers, train loss %.4f, test accuracy %.4f\n",
                static_cast<unsigned long long>(round.round()), round.participant_count(),
                round.mean_train_loss(), round.test_accuracy());
  }
  return 0;
}
