#include "services/shoalctl/local_cluster.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "libs/common/status_macros.h"

namespace shoal::process {
namespace {

constexpr char kCoordinator[] = "shoal-coordinator";
constexpr char kAggregator[] = "shoal-aggregator";
constexpr char kPeer[] = "shoal-peer";
constexpr char kGenCerts[] = "shoal-gen-certs";

bool IsDir(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

}  // namespace

absl::Status LocalClusterOptions::Validate() const {
  if (aggregators < 0) return absl::InvalidArgumentError("--aggregators: must be >= 0");
  if (peers < 0) return absl::InvalidArgumentError("--peers: must be >= 0");
  if (!IsDir(state_dir)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--state-dir: ", state_dir, " is not a directory"));
  }
  for (int i = 0; !peer_data_dir.empty() && i < peers; ++i) {
    const std::string dir = absl::StrCat(peer_data_dir, "/peer-", i);
    if (!IsDir(dir)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--peer-data: ", dir, " is not a directory (peer I's data goes in DIR/peer-I)"));
    }
  }
  if (peers > 0 && peer_data_dir.empty() && !IsDir(data_dir)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--data-dir: ", data_dir,
                     " is not a directory (install Debian's dataset-fashion-mnist package or "
                     "pass --data-dir)"));
  }
  std::vector<const char*> binaries = {kCoordinator, kAggregator, kPeer};
  if (!insecure) binaries.push_back(kGenCerts);
  for (const char* binary : binaries) {
    const std::string path = absl::StrCat(bin_dir, "/", binary);
    if (access(path.c_str(), X_OK) != 0) {
      return absl::NotFoundError(
          absl::StrCat("cannot find ", binary, " in ", bin_dir, " (build it, or pass --bin-dir)"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<LocalCluster>> LocalCluster::Start(LocalClusterOptions options,
                                                                  std::ostream* progress,
                                                                  const std::atomic<bool>* abort) {
  SHOAL_RETURN_IF_ERROR(options.Validate());
  std::unique_ptr<LocalCluster> cluster(new LocalCluster(std::move(options)));
  const LocalClusterOptions& o = cluster->options_;
  const std::string bin = o.bin_dir + "/";
  for (const std::string& dir : {o.state_dir + "/logs", o.state_dir + "/run"}) {
    if (mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
      return absl::InternalError(absl::StrCat("cannot create ", dir));
    }
  }
  SHOAL_RETURN_IF_ERROR(cluster->MakeCertificates({"shoalctl"}));

  std::vector<std::string> args = {"--listen",    "127.0.0.1:0", "--metrics-listen",
                                   "127.0.0.1:0", "--state-dir", o.state_dir + "/coordinator"};
  if (mkdir((o.state_dir + "/coordinator").c_str(), 0755) != 0 && errno != EEXIST) {
    return absl::InternalError(absl::StrCat("cannot create ", o.state_dir, "/coordinator"));
  }
  if (!o.console_listen.empty()) {
    SHOAL_RETURN_IF_ERROR(cluster->MakeConsoleTokens());
    args.insert(args.end(), {"--console-listen", o.console_listen, "--console-tokens",
                             cluster->ConsoleTokensPath()});
  }
  args.insert(args.end(), o.coordinator_args.begin(), o.coordinator_args.end());
  SHOAL_RETURN_IF_ERROR(cluster->StartService("coordinator", "coordinator", bin + kCoordinator,
                                              args, progress, abort));

  for (int i = 0; i < o.aggregators; ++i) {
    std::vector<std::string> a = {"--listen",    "127.0.0.1:0",   "--metrics-listen",
                                  "127.0.0.1:0", "--coordinator", cluster->coordinator_address()};
    a.insert(a.end(), o.aggregator_args.begin(), o.aggregator_args.end());
    SHOAL_RETURN_IF_ERROR(cluster->StartService(absl::StrCat("aggregator-", i), "aggregator",
                                                bin + kAggregator, a, progress, abort));
  }
  // The peers start side by side (each spends about a second loading LibTorch); their
  // certificates first, in one shoal-gen-certs run.
  std::vector<std::string> peer_names;
  for (int i = 0; i < o.peers; ++i) peer_names.push_back(absl::StrCat("peer-", i));
  SHOAL_RETURN_IF_ERROR(cluster->MakeCertificates(peer_names));
  std::vector<Service> launched;  // stopped by their destructors if a later one fails
  for (int i = 0; i < o.peers; ++i) {
    SHOAL_ASSIGN_OR_RETURN(Service peer, cluster->LaunchPeer(i, o.peers, {}));
    launched.push_back(std::move(peer));
  }
  for (Service& peer : launched) {
    SHOAL_RETURN_IF_ERROR(cluster->AwaitService(std::move(peer), progress, abort));
  }
  return cluster;
}

LocalCluster::~LocalCluster() { Stop(absl::Seconds(5)); }

std::string LocalCluster::ConsoleTokensPath() const {
  return options_.console_listen.empty() ? "" : options_.state_dir + "/console-tokens";
}

std::string LocalCluster::ConsoleUrl() const {
  if (services_.empty() || services_[0].console_address.empty()) return "";
  return absl::StrCat(options_.insecure ? "http://" : "https://", services_[0].console_address,
                      "/");
}

absl::Status LocalCluster::MakeConsoleTokens() {
  const std::string path = ConsoleTokensPath();
  unsigned char bytes[24];
  FILE* random = std::fopen("/dev/urandom", "rb");
  const bool read =
      random != nullptr && std::fread(bytes, 1, sizeof(bytes), random) == sizeof(bytes);
  if (random != nullptr) std::fclose(random);
  if (!read) return absl::InternalError("cannot read /dev/urandom for the console's token");
  std::string token;
  for (unsigned char b : bytes) absl::StrAppend(&token, absl::Hex(b, absl::kZeroPad2));
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) return absl::InternalError(absl::StrCat("cannot create ", path));
  const std::string text =
      absl::StrCat("# the web console's logins (ROLE TOKEN)\nadmin ", token, "\n");
  const bool written = write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  if (close(fd) != 0 || !written) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

std::string LocalCluster::ClientTlsDir() const {
  return options_.insecure ? "" : absl::StrCat(options_.state_dir, "/certs/shoalctl");
}

absl::Status LocalCluster::MakeCertificates(const std::vector<std::string>& names) {
  if (options_.insecure || names.empty()) return absl::OkStatus();
  ProcessOptions p;
  p.name = "shoal-gen-certs";
  p.binary = absl::StrCat(options_.bin_dir, "/", kGenCerts);
  p.args = {absl::StrCat(options_.state_dir, "/certs")};
  p.args.insert(p.args.end(), names.begin(), names.end());
  p.log_path = LogPath("gen-certs");
  SHOAL_ASSIGN_OR_RETURN(std::unique_ptr<Process> process, Process::Start(std::move(p)));
  absl::StatusOr<ExitStatus> exit = process->Wait(absl::Seconds(30));
  if (!exit.ok()) return exit.status();
  if (!exit->success()) {
    return absl::InternalError(absl::StrCat("shoal-gen-certs failed for ",
                                            absl::StrJoin(names, ", "), " (", exit->ToString(),
                                            "): ", process->LogTail(5)));
  }
  return absl::OkStatus();
}

std::string LocalCluster::LogPath(const std::string& name) const {
  return absl::StrCat(options_.state_dir, "/logs/", name, ".log");
}

std::string LocalCluster::AddressFilePath(const std::string& name) const {
  return absl::StrCat(options_.state_dir, "/run/", name, ".addr");
}

Service* LocalCluster::Find(const std::string& name) {
  for (Service& s : services_) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

absl::Status LocalCluster::StartService(const std::string& name, const std::string& kind,
                                        const std::string& binary, std::vector<std::string> args,
                                        std::ostream* progress, const std::atomic<bool>* abort) {
  SHOAL_RETURN_IF_ERROR(MakeCertificates({name}));
  SHOAL_ASSIGN_OR_RETURN(Service service, LaunchService(name, kind, binary, std::move(args)));
  return AwaitService(std::move(service), progress, abort);
}

absl::StatusOr<Service> LocalCluster::LaunchService(const std::string& name,
                                                    const std::string& kind,
                                                    const std::string& binary,
                                                    std::vector<std::string> args) {
  if (options_.insecure) {
    args.push_back("--insecure");
  } else {
    args.push_back("--tls-dir");
    args.push_back(absl::StrCat(options_.state_dir, "/certs/", name));
  }
  const std::string address_file = AddressFilePath(name);
  unlink(address_file.c_str());  // a stale file from an earlier run would look like success
  args.push_back("--address-file");
  args.push_back(address_file);
  ProcessOptions p;
  p.name = name;
  p.binary = binary;
  p.args = std::move(args);
  p.log_path = LogPath(name);
  SHOAL_ASSIGN_OR_RETURN(std::unique_ptr<Process> process, Process::Start(std::move(p)));
  return Service{name, kind, "", "", "", std::move(process)};
}

absl::Status LocalCluster::AwaitService(Service service, std::ostream* progress,
                                        const std::atomic<bool>* abort) {
  absl::StatusOr<std::map<std::string, std::string>> addresses = WaitForAddressFile(
      AddressFilePath(service.name), service.process.get(), options_.startup_timeout, abort);
  if (!addresses.ok()) {
    // The caller's cluster (if Start() fails, its destructor) stops the others.
    service.process->Stop(absl::Seconds(5));
    return addresses.status();
  }
  service.address = (*addresses)["grpc"];
  service.metrics_address = (*addresses)["metrics"];
  service.console_address = (*addresses)["console"];
  if (progress != nullptr) {
    *progress << "started " << service.name << " at " << service.address << " (log "
              << LogPath(service.name) << ")\n";
  }
  services_.push_back(std::move(service));
  return absl::OkStatus();
}

absl::Status LocalCluster::StartPeer(int index, int count,
                                     const std::vector<std::string>& extra_args) {
  SHOAL_RETURN_IF_ERROR(MakeCertificates({absl::StrCat("peer-", index)}));
  SHOAL_ASSIGN_OR_RETURN(Service peer, LaunchPeer(index, count, extra_args));
  return AwaitService(std::move(peer), nullptr, nullptr);
}

absl::StatusOr<Service> LocalCluster::LaunchPeer(int index, int count,
                                                 const std::vector<std::string>& extra_args) {
  if (services_.empty()) return absl::FailedPreconditionError("the coordinator is not running");
  const std::string name = absl::StrCat("peer-", index);
  std::vector<std::string> args = {
      "--coordinator",    coordinator_address(),
      "--listen",         "127.0.0.1:0",
      "--metrics-listen", "127.0.0.1:0",
      "--name",           name,
      "--state-dir",      absl::StrCat(options_.state_dir, "/peers/", name)};
  if (options_.peer_data_dir.empty()) {
    args.insert(args.end(),
                {"--data-dir", options_.data_dir, "--shard", absl::StrCat(index, "/", count)});
  } else {
    args.insert(args.end(), {"--data-dir", absl::StrCat(options_.peer_data_dir, "/peer-", index)});
  }
  args.insert(args.end(), options_.peer_args.begin(), options_.peer_args.end());
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  return LaunchService(name, "peer", options_.bin_dir + "/" + kPeer, std::move(args));
}

std::optional<std::string> LocalCluster::FirstUnexpectedExit(
    const std::vector<std::string>& ignore) {
  for (Service& s : services_) {
    if (std::find(ignore.begin(), ignore.end(), s.name) != ignore.end()) continue;
    std::optional<ExitStatus> exit = s.process->Poll();
    if (!exit.has_value()) continue;
    std::string message = absl::StrCat(s.name, " exited unexpectedly (", exit->ToString(), ")");
    const std::string tail = s.process->LogTail(20);
    absl::StrAppend(&message, "; last lines of ", s.process->log_path(), ":\n",
                    tail.empty() ? "(empty)" : tail);
    return message;
  }
  return std::nullopt;
}

void LocalCluster::Stop(absl::Duration grace) {
  std::vector<Process*> peers, aggregators, coordinator;
  for (Service& s : services_) {
    if (s.kind == "peer") {
      peers.push_back(s.process.get());
    } else if (s.kind == "aggregator") {
      aggregators.push_back(s.process.get());
    } else {
      coordinator.push_back(s.process.get());
    }
  }
  StopInOrder({peers, aggregators, coordinator}, grace);
}

}  // namespace shoal::process
