// Static rules for the container image and the compose cluster (issue: "Container and
// compose"), checked against the real Dockerfile, docker-compose.yml, the Prometheus scrape
// config and the built binaries. docker-compose's own schema check is compose_config_test and
// the Dockerfile syntax lint is dockerfile_lint_test.

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "tests/compose/compose_file.h"

namespace shoal::testing {
namespace {

// The standard output of a shell command ("" if it cannot run).
std::string CommandOutput(const std::string& command) {
  std::string out;
  if (FILE* pipe = popen(command.c_str(), "r")) {
    char buffer[4096];
    size_t n;
    while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) out.append(buffer, n);
    pclose(pipe);
  }
  return out;
}

std::string SourceDir() {
  const char* dir = std::getenv("SHOAL_SOURCE_DIR");
  return dir != nullptr ? dir : ".";
}

std::string BinDir() {
  const char* dir = std::getenv("SHOAL_BIN_DIR");
  return dir != nullptr ? dir : "build/bin";
}

bool Exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

// The port of HOST:PORT, or -1.
int PortOf(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) return -1;
  try {
    return std::stoi(address.substr(colon + 1));
  } catch (...) {
    return -1;
  }
}

class ContainerRulesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::vector<DockerStage>> stages = LoadDockerfile(SourceDir() + "/Dockerfile");
    ASSERT_TRUE(stages.ok()) << stages.status();
    stages_ = *stages;
    absl::StatusOr<ComposeFile> compose = LoadComposeFile(SourceDir() + "/docker-compose.yml");
    ASSERT_TRUE(compose.ok()) << compose.status();
    compose_ = *compose;
    ASSERT_FALSE(stages_.empty());
  }

  const DockerStage& runtime() const { return stages_.back(); }

  std::vector<const DockerInstruction*> Find(const DockerStage& stage,
                                             const std::string& keyword) const {
    std::vector<const DockerInstruction*> out;
    for (const DockerInstruction& i : stage.instructions) {
      if (i.keyword == keyword) out.push_back(&i);
    }
    return out;
  }

  // The services that run the Shoal image.
  std::vector<const ComposeService*> ShoalServices() const {
    std::vector<const ComposeService*> out;
    for (const ComposeService& s : compose_.services) {
      if (s.RunsShoalImage()) out.push_back(&s);
    }
    return out;
  }

  // Long-running Shoal services (not one-shot jobs, not tool profiles).
  std::vector<const ComposeService*> ShoalDaemons() const {
    std::vector<const ComposeService*> out;
    for (const ComposeService* s : ShoalServices()) {
      if (s->restart != "no" && s->profiles.empty()) out.push_back(s);
    }
    return out;
  }

  // The identities the `certs` service issues (NAME of its NAME or NAME=SANS arguments).
  std::set<std::string> IssuedCertificates() const {
    std::set<std::string> issued;
    const ComposeService* certs = compose_.Find("certs");
    if (certs == nullptr) return issued;
    const std::vector<std::string> argv = certs->Argv();
    for (size_t i = 2; i < argv.size(); ++i) issued.insert(argv[i].substr(0, argv[i].find('=')));
    return issued;
  }

  // The subjectAltNames the `certs` service adds to certificate `name` (after NAME=).
  std::vector<std::string> ExtraSans(const std::string& name) const {
    const ComposeService* certs = compose_.Find("certs");
    if (certs == nullptr) return {};
    for (const std::string& arg : certs->Argv()) {
      if (absl::StartsWith(arg, name + "=")) {
        return absl::StrSplit(arg.substr(name.size() + 1), ',');
      }
    }
    return {};
  }

  static bool InProfile(const ComposeService& s, const std::string& profile) {
    return std::find(s.profiles.begin(), s.profiles.end(), profile) != s.profiles.end();
  }

  // A service of the `ha` cluster: in its profile, or its tool (`ha-shoalctl`, profile tools).
  static bool IsHa(const ComposeService& s) {
    return InProfile(s, "ha") || absl::StartsWith(s.name, "ha-");
  }

  std::vector<DockerStage> stages_;
  ComposeFile compose_;
};

TEST_F(ContainerRulesTest, MultiStageOnBookwormWithNonRootRuntime) {
  ASSERT_GE(stages_.size(), 2u) << "the Dockerfile must be multi-stage (build + runtime)";
  for (const DockerStage& stage : stages_) {
    EXPECT_EQ(stage.base, "debian:bookworm-slim") << "stage " << stage.name;
  }
  // The runtime stage installs bootstrap's `runtime` profile: no -dev package, no compiler.
  bool installs_runtime = false;
  for (const DockerInstruction* run : Find(runtime(), "RUN")) {
    installs_runtime |= absl::StrContains(run->args, "bootstrap runtime");
    EXPECT_EQ(run->args.find("-dev "), std::string::npos) << "line " << run->line;
    EXPECT_EQ(run->args.find("cmake"), std::string::npos) << "line " << run->line;
  }
  EXPECT_TRUE(installs_runtime) << "the runtime stage must run `bootstrap runtime`";
  const std::string listed = CommandOutput(SourceDir() + "/scripts/bootstrap --print runtime");
  EXPECT_THAT(listed, ::testing::HasSubstr("libtorch1.13\n"));
  for (absl::string_view package : absl::StrSplit(listed, '\n', absl::SkipEmpty())) {
    EXPECT_FALSE(absl::EndsWith(package, "-dev")) << package;
    EXPECT_NE(package, "g++");
    EXPECT_NE(package, "cmake");
  }
  // The last USER of the runtime stage is not root.
  std::vector<const DockerInstruction*> users = Find(runtime(), "USER");
  ASSERT_FALSE(users.empty()) << "the runtime stage must switch to a non-root USER";
  const std::string user = Words(users.back()->args).at(0);
  EXPECT_NE(user, "root");
  EXPECT_NE(user.substr(0, user.find(':')), "0");
  // The runtime stage copies the binaries out of the build stage.
  bool copies_binaries = false;
  for (const DockerInstruction* copy : Find(runtime(), "COPY")) {
    if (absl::StrContains(copy->args, "--from=" + stages_.front().name) &&
        absl::StrContains(copy->args, "/build/bin/ /usr/local/bin/")) {
      copies_binaries = true;
    }
  }
  EXPECT_TRUE(copies_binaries) << "expected COPY --from=" << stages_.front().name
                               << " /build/bin/ /usr/local/bin/ in the runtime stage";
  EXPECT_FALSE(Find(runtime(), "CMD").empty() && Find(runtime(), "ENTRYPOINT").empty());
}

TEST_F(ContainerRulesTest, HealthcheckUsesTheGrpcHealthService) {
  std::vector<const DockerInstruction*> checks = Find(runtime(), "HEALTHCHECK");
  ASSERT_EQ(checks.size(), 1u) << "the runtime stage needs one HEALTHCHECK";
  const std::string& args = checks[0]->args;
  const size_t cmd = args.find("CMD ");
  ASSERT_NE(cmd, std::string::npos) << args;
  absl::StatusOr<std::vector<std::string>> argv = ParseExecForm(args.substr(cmd + 4));
  ASSERT_TRUE(argv.ok()) << argv.status();
  ASSERT_GE(argv->size(), 4u);
  EXPECT_EQ((*argv)[0], "shoalctl");
  EXPECT_EQ((*argv)[1], "health");
  // It probes the default command's gRPC port, with the default command's certificate.
  std::vector<std::string> cmd_argv;
  for (const DockerInstruction* c : Find(runtime(), "CMD")) {
    absl::StatusOr<std::vector<std::string>> parsed = ParseExecForm(c->args);
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    cmd_argv = *parsed;
  }
  auto flag = [](const std::vector<std::string>& v, const std::string& f) -> std::string {
    for (size_t i = 0; i + 1 < v.size(); ++i) {
      if (v[i] == f) return v[i + 1];
    }
    return "";
  };
  EXPECT_EQ(PortOf(flag(*argv, "--target")), PortOf(flag(cmd_argv, "--listen")));
  EXPECT_EQ(flag(*argv, "--tls-dir"), flag(cmd_argv, "--tls-dir"));
  // The probed port is exposed.
  bool exposed = false;
  for (const DockerInstruction* e : Find(runtime(), "EXPOSE")) {
    for (const std::string& port : Words(e->args)) {
      if (port == std::to_string(PortOf(flag(*argv, "--target")))) exposed = true;
    }
  }
  EXPECT_TRUE(exposed);
}

// Every program a compose service runs from the Shoal image is one the image ships: a target
// the build stage builds into /build/bin (or a file CMake places there), and it really lands in
// the build tree's bin directory.
TEST_F(ContainerRulesTest, ComposeRunsOnlyBinariesTheImageShips) {
  std::set<std::string> shipped;
  for (const DockerInstruction& i : stages_.front().instructions) {
    if (i.keyword != "RUN" || !absl::StrContains(i.args, "--target")) continue;
    std::vector<std::string> words = Words(i.args);
    auto it = std::find(words.begin(), words.end(), "--target");
    for (++it; it != words.end() && !absl::StartsWith(*it, "-") && *it != "&&"; ++it) {
      shipped.insert(*it);
    }
  }
  ASSERT_FALSE(shipped.empty()) << "no `cmake --build ... --target ...` in the build stage";
  // Scripts configure_file'd into ${PROJECT_BINARY_DIR}/bin/ ship too.
  const std::regex configured(R"(\$\{PROJECT_BINARY_DIR\}/bin/([A-Za-z0-9_.-]+))");
  for (const auto& dir : std::filesystem::directory_iterator(SourceDir() + "/services")) {
    const std::string text = ReadText(dir.path().string() + "/CMakeLists.txt");
    for (std::sregex_iterator m(text.begin(), text.end(), configured), end; m != end; ++m) {
      shipped.insert((*m)[1]);
    }
  }
  std::vector<const ComposeService*> services = ShoalServices();
  ASSERT_GE(services.size(), 8u);
  for (const ComposeService* s : services) {
    std::vector<std::string> programs;
    if (!s->Argv().empty()) programs.push_back(s->Argv()[0]);
    if (!s->healthcheck.empty()) programs.push_back(s->healthcheck[0]);
    ASSERT_FALSE(programs.empty()) << s->name << " runs nothing";
    for (const std::string& program : programs) {
      EXPECT_EQ(shipped.count(program), 1u)
          << s->name << " runs " << program
          << ", which the image does not ship (ships: " << absl::StrJoin(shipped, ", ") << ")";
      EXPECT_TRUE(Exists(BinDir() + "/" + program)) << program << " is not in " << BinDir();
    }
  }
}

TEST_F(ContainerRulesTest, EveryServiceHasAHealthcheckOnItsOwnPortAndCertificate) {
  std::vector<const ComposeService*> daemons = ShoalDaemons();
  ASSERT_EQ(daemons.size(), 7u) << "coordinator, two aggregators, four peers";
  for (const ComposeService* s : daemons) {
    SCOPED_TRACE(s->name);
    ASSERT_FALSE(s->healthcheck_disabled);
    ASSERT_GE(s->healthcheck.size(), 2u);
    EXPECT_EQ(s->healthcheck[0], "shoalctl");
    EXPECT_EQ(s->healthcheck[1], "health");
    ComposeService probe;
    probe.command = s->healthcheck;
    EXPECT_EQ(probe.Flag("target"), absl::StrCat("127.0.0.1:", PortOf(s->Flag("listen"))));
    EXPECT_EQ(s->Flag("tls-dir"), "/certs/" + s->name);
    EXPECT_EQ(probe.Flag("tls-dir"), s->Flag("tls-dir"));
  }
}

TEST_F(ContainerRulesTest, DependenciesWaitForCertificatesAndAHealthyCoordinator) {
  const ComposeService* certs = compose_.Find("certs");
  ASSERT_NE(certs, nullptr);
  ASSERT_NE(compose_.Find("coordinator"), nullptr);
  const std::set<std::string> issued = IssuedCertificates();
  for (const ComposeService* s : ShoalServices()) {
    if (s == certs) continue;
    SCOPED_TRACE(s->name);
    EXPECT_EQ(s->depends_on.count("certs") > 0 ? s->depends_on.at("certs") : "",
              "service_completed_successfully");
    // The `ha` profile's services wait for no healthy coordinator (HaProfile... below).
    if (s->name != "coordinator" && !IsHa(*s)) {
      EXPECT_EQ(s->depends_on.count("coordinator") > 0 ? s->depends_on.at("coordinator") : "",
                "service_healthy");
    }
    // Its certificate is one the certs service issues.
    const std::string tls_dir = s->Flag("tls-dir");
    ASSERT_TRUE(absl::StartsWith(tls_dir, "/certs/")) << tls_dir;
    EXPECT_EQ(issued.count(tls_dir.substr(7)), 1u) << tls_dir << " is not issued by `certs`";
    bool mounts_certs = false;
    for (const std::string& v : s->volumes) {
      if (absl::StartsWith(v, "certs:/certs")) mounts_certs = true;
    }
    EXPECT_TRUE(mounts_certs);
  }
  // Every aggregator and peer talks to the compose coordinator; peers have distinct shards.
  std::set<std::string> shards;
  int peers = 0;
  for (const ComposeService* s : ShoalDaemons()) {
    if (s->Argv()[0] == "shoal-peer") {
      ++peers;
      shards.insert(s->Flag("shard"));
      EXPECT_TRUE(absl::EndsWith(s->Flag("shard"), "/4")) << s->name;
    }
    if (s->name != "coordinator") {
      EXPECT_EQ(s->Flag("coordinator"), "coordinator:7000") << s->name;
    }
  }
  EXPECT_EQ(peers, 4);
  EXPECT_EQ(shards.size(), 4u);
}

TEST_F(ContainerRulesTest, CoordinatorStateIsANamedVolume) {
  const ComposeService* coordinator = compose_.Find("coordinator");
  ASSERT_NE(coordinator, nullptr);
  const std::string state_dir = coordinator->Flag("state-dir");
  ASSERT_FALSE(state_dir.empty());
  bool found = false;
  for (const std::string& v : coordinator->volumes) {
    std::vector<std::string> parts = absl::StrSplit(v, ':');
    if (parts.size() >= 2 && parts[1] == state_dir) {
      found = true;
      EXPECT_NE(std::find(compose_.volumes.begin(), compose_.volumes.end(), parts[0]),
                compose_.volumes.end())
          << parts[0] << " is not a declared named volume";
    }
  }
  EXPECT_TRUE(found) << "no volume at --state-dir " << state_dir;
}

// The named volume service `s` mounts at container path `target`, or "".
std::string VolumeAt(const ComposeService& s, const std::string& target) {
  for (const std::string& v : s.volumes) {
    std::vector<std::string> parts = absl::StrSplit(v, ':');
    if (parts.size() >= 2 && (target == parts[1] || absl::StartsWith(target, parts[1] + "/"))) {
      return parts[0];
    }
  }
  return "";
}

// Profile `ha`: three etcd members from deploy/etcd/Dockerfile that form one cluster over mutual
// TLS, each with its data on a named volume of its own.
TEST_F(ContainerRulesTest, HaProfileRunsThreeEtcdMembersAsOneCluster) {
  std::vector<const ComposeService*> members;
  for (const ComposeService& s : compose_.services) {
    if (!s.Argv().empty() && s.Argv()[0] == "etcd") members.push_back(&s);
  }
  ASSERT_EQ(members.size(), 3u);
  std::set<std::string> cluster, volumes;
  for (const ComposeService* m : members) {
    SCOPED_TRACE(m->name);
    EXPECT_EQ(m->profiles, std::vector<std::string>{"ha"});
    EXPECT_FALSE(m->RunsShoalImage());
    EXPECT_TRUE(Exists(SourceDir() + "/" + m->dockerfile)) << m->dockerfile;
    EXPECT_EQ(m->Flag("name"), m->name);
    const int client = PortOf(m->Flag("listen-client-urls"));
    const int peer = PortOf(m->Flag("listen-peer-urls"));
    EXPECT_EQ(m->Flag("listen-client-urls"), absl::StrCat("https://0.0.0.0:", client));
    EXPECT_EQ(m->Flag("advertise-client-urls"), absl::StrCat("https://", m->name, ":", client));
    EXPECT_EQ(m->Flag("listen-peer-urls"), absl::StrCat("https://0.0.0.0:", peer));
    const std::string peer_url = absl::StrCat("https://", m->name, ":", peer);
    EXPECT_EQ(m->Flag("initial-advertise-peer-urls"), peer_url);
    EXPECT_EQ(m->Flag("initial-cluster-state"), "new");
    const std::vector<std::string> listed = absl::StrSplit(m->Flag("initial-cluster"), ',');
    EXPECT_THAT(listed, ::testing::Contains(absl::StrCat(m->name, "=", peer_url)));
    if (cluster.empty()) cluster.insert(listed.begin(), listed.end());
    EXPECT_EQ(std::set<std::string>(listed.begin(), listed.end()), cluster)
        << "every member lists the same --initial-cluster";
    const std::string volume = VolumeAt(*m, m->Flag("data-dir"));
    EXPECT_THAT(compose_.volumes, ::testing::Contains(volume)) << "--data-dir on a named volume";
    volumes.insert(volume);
    // Mutual TLS on both ports with the certificate `etcd`, which names the member's host;
    // only members (CN etcd) on the peer port.
    const std::vector<std::string> argv = m->Argv();
    for (const char* flag : {"--client-cert-auth", "--peer-client-cert-auth"}) {
      EXPECT_NE(std::find(argv.begin(), argv.end(), flag), argv.end()) << flag;
    }
    for (const char* flag : {"cert-file", "peer-cert-file"})
      EXPECT_EQ(m->Flag(flag), "/certs/etcd/tls.crt");
    for (const char* flag : {"key-file", "peer-key-file"})
      EXPECT_EQ(m->Flag(flag), "/certs/etcd/tls.key");
    for (const char* flag : {"trusted-ca-file", "peer-trusted-ca-file"}) {
      EXPECT_EQ(m->Flag(flag), "/certs/etcd/ca.crt");
    }
    EXPECT_EQ(m->Flag("peer-cert-allowed-cn"), "etcd");
    EXPECT_EQ(VolumeAt(*m, "/certs/etcd"), "certs");
    EXPECT_EQ(m->depends_on.count("certs"), 1u) << "starts after the certificates";
    EXPECT_THAT(ExtraSans("etcd"), ::testing::Contains("DNS:" + m->name))
        << "the certificate etcd does not name " << m->name;
  }
  EXPECT_EQ(cluster.size(), 3u);
  EXPECT_EQ(volumes.size(), 3u) << "each member has a volume of its own";
}

// Profile `ha`: three coordinators on those etcd members (one prefix) that share the tasks, each
// advertising its own compose name, with one checkpoint volume and the certificate
// `coordinator`, which names their hosts. The default coordinator keeps its SQLite store.
TEST_F(ContainerRulesTest, HaProfileCoordinatorsShareTheEtcdStoreAndTheCheckpoints) {
  std::set<std::string> etcd_clients;
  std::vector<std::string> etcd_members;
  std::vector<const ComposeService*> coordinators;
  for (const ComposeService& s : compose_.services) {
    if (s.Argv().empty()) continue;
    if (s.Argv()[0] == "etcd") {
      etcd_members.push_back(s.name);
      etcd_clients.insert(absl::StrCat(s.name, ":", PortOf(s.Flag("listen-client-urls"))));
    }
    if (s.Argv()[0] == "shoal-coordinator" && InProfile(s, "ha")) coordinators.push_back(&s);
  }
  ASSERT_EQ(coordinators.size(), 3u);
  ASSERT_NE(compose_.Find("coordinator"), nullptr);
  EXPECT_EQ(compose_.Find("coordinator")->Flag("store"), "");
  std::set<std::string> prefixes, state_volumes;
  for (const ComposeService* c : coordinators) {
    SCOPED_TRACE(c->name);
    const std::string store = c->Flag("store");
    ASSERT_TRUE(absl::StartsWith(store, "etcd://")) << "--store " << store;
    const size_t slash = store.find('/', 7);
    const std::vector<std::string> endpoints =
        absl::StrSplit(store.substr(7, slash == std::string::npos ? slash : slash - 7), ',');
    EXPECT_EQ(std::set<std::string>(endpoints.begin(), endpoints.end()), etcd_clients);
    prefixes.insert(slash == std::string::npos ? "" : store.substr(slash));
    const std::vector<std::string> argv = c->Argv();
    EXPECT_NE(std::find(argv.begin(), argv.end(), "--share-tasks"), argv.end());
    EXPECT_NE(std::find(argv.begin(), argv.end(), "--store-tls"), argv.end())
        << "the etcd members take only clients with a certificate of the CA";
    EXPECT_EQ(c->Flag("advertise"), absl::StrCat(c->name, ":", PortOf(c->Flag("listen"))))
        << "each coordinator is named by the address the others' clients reach it at";
    EXPECT_FALSE(c->Flag("store-lease").empty());
    for (const std::string& member : etcd_members) {
      EXPECT_EQ(c->depends_on.count(member), 1u) << "starts after " << member;
    }
    const std::string volume = VolumeAt(*c, c->Flag("state-dir"));
    EXPECT_THAT(compose_.volumes, ::testing::Contains(volume)) << "--state-dir on a named volume";
    state_volumes.insert(volume);
    EXPECT_EQ(c->Flag("tls-dir"), "/certs/coordinator");
    EXPECT_THAT(ExtraSans("coordinator"), ::testing::Contains("DNS:" + c->name))
        << "the coordinator's certificate does not name " << c->name;
    ComposeService probe;
    probe.command = c->healthcheck;
    EXPECT_EQ(probe.Flag("target"), absl::StrCat("127.0.0.1:", PortOf(c->Flag("listen"))));
  }
  EXPECT_EQ(prefixes.size(), 1u) << "one etcd prefix";
  EXPECT_EQ(state_volumes.size(), 1u) << "one shared checkpoint volume";
  EXPECT_EQ(state_volumes.count(VolumeAt(*compose_.Find("coordinator"), "/var/lib/shoal/state")),
            0u)
      << "not the default coordinator's volume";
}

// Profile `ha`: its aggregators, peers, task creation and the `ha-shoalctl` tool are given all
// three coordinators, and those of the profile start with them (they retry until one answers).
TEST_F(ContainerRulesTest, HaProfileServicesAreGivenEveryCoordinator) {
  std::vector<std::string> addresses, names;
  for (const ComposeService& s : compose_.services) {
    if (!s.Argv().empty() && s.Argv()[0] == "shoal-coordinator" && InProfile(s, "ha")) {
      addresses.push_back(absl::StrCat(s.name, ":", PortOf(s.Flag("listen"))));
      names.push_back(s.name);
    }
  }
  ASSERT_EQ(addresses.size(), 3u);
  const std::string all = absl::StrJoin(addresses, ",");
  std::set<std::string> shards;
  int aggregators = 0;
  bool creates_task = false, tool = false;
  for (const ComposeService* s : ShoalServices()) {
    if (!IsHa(*s) || s->Argv()[0] == "shoal-coordinator") continue;
    SCOPED_TRACE(s->name);
    EXPECT_EQ(s->Flag("coordinator"), all);
    const std::vector<std::string> argv = s->Argv();
    if (argv[0] == "shoal-peer") shards.insert(s->Flag("shard"));
    if (argv[0] == "shoal-aggregator") ++aggregators;
    if (argv[0] == "shoalctl") {
      creates_task |= std::find(argv.begin(), argv.end(), "create") != argv.end();
      tool |= s->restart == "no";
    }
    if (!InProfile(*s, "ha")) continue;
    for (const std::string& c : names) {
      EXPECT_EQ(s->depends_on.count(c) > 0 ? s->depends_on.at(c) : "", "service_started") << c;
    }
  }
  EXPECT_EQ(shards, std::set<std::string>({"0/4", "1/4", "2/4", "3/4"}));
  EXPECT_GE(aggregators, 1);
  EXPECT_TRUE(creates_task);
  EXPECT_TRUE(tool);
}

// Files the compose file mounts from the source tree, and task files it runs, exist.
TEST_F(ContainerRulesTest, MountedAndReferencedFilesExist) {
  for (const ComposeService& s : compose_.services) {
    for (const std::string& v : s.volumes) {
      if (!absl::StartsWith(v, "./")) continue;
      const std::string host = v.substr(2, v.find(':') - 2);
      EXPECT_TRUE(Exists(SourceDir() + "/" + host)) << s.name << " mounts missing ./" << host;
    }
    for (const std::string& arg : s.Argv()) {
      if (absl::StartsWith(arg, "/etc/shoal/tasks/")) {
        EXPECT_TRUE(Exists(SourceDir() + "/deploy/tasks/" + arg.substr(17))) << arg;
      }
    }
  }
  bool copies_tasks = false;
  for (const DockerInstruction* copy : Find(runtime(), "COPY")) {
    if (copy->args == "deploy/tasks/ /etc/shoal/tasks/") copies_tasks = true;
  }
  EXPECT_TRUE(copies_tasks);
  // `docker compose up` trains: some one-shot service creates a task.
  bool creates_task = false;
  for (const ComposeService& s : compose_.services) {
    const std::vector<std::string> argv = s.Argv();
    for (size_t i = 0; s.profiles.empty() && i + 1 < argv.size(); ++i) {
      if (argv[i] == "task" && argv[i + 1] == "create") creates_task = true;
    }
  }
  EXPECT_TRUE(creates_task);
}

// Prometheus scrapes exactly the services' --metrics-listen ports.
TEST_F(ContainerRulesTest, PrometheusScrapesEveryService) {
  YAML::Node config = YAML::LoadFile(SourceDir() + "/deploy/prometheus/prometheus.yml");
  std::set<std::string> targets;
  for (const YAML::Node& job : config["scrape_configs"]) {
    for (const YAML::Node& sc : job["static_configs"]) {
      for (const YAML::Node& t : sc["targets"]) targets.insert(t.as<std::string>());
    }
  }
  std::set<std::string> expected;
  for (const ComposeService* s : ShoalDaemons()) {
    expected.insert(absl::StrCat(s->name, ":", PortOf(s->Flag("metrics-listen"))));
  }
  for (const std::string& e : expected) EXPECT_EQ(targets.count(e), 1u) << e << " is not scraped";
  ASSERT_NE(compose_.Find("prometheus"), nullptr);
  ASSERT_NE(compose_.Find("grafana"), nullptr);
}

}  // namespace
}  // namespace shoal::testing
