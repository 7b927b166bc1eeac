#include "services/coordinator/task_store.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "services/coordinator/store/sqlite_task_store.h"
#ifdef SHOAL_HAVE_ETCD
#include "services/coordinator/store/etcd_task_store.h"
#endif

namespace shoal::coordinator {
namespace {

constexpr absl::string_view kEtcdScheme = "etcd://";

#ifdef SHOAL_HAVE_ETCD
// About when this process started (static initialisation), for IsEarlierSelf.
const absl::Time kProcessStarted = absl::Now();

// Whether `holder` (an owner key's value, as the identity below makes it) is an earlier process
// of this coordinator: it begins with `place` ("shoal-coordinator [at ADDR ]on HOST, pid "),
// and its process is gone, or had this process's pid before this process started (a
// container's restart gives the new process the old one's pid).
bool IsEarlierSelf(const std::string& holder, const std::string& place) {
  if (!absl::StartsWith(holder, place)) return false;
  std::vector<std::string> rest =
      absl::StrSplit(holder.substr(place.size()), absl::MaxSplits(", started ", 1));
  int pid = 0;
  if (rest.size() != 2 || !absl::SimpleAtoi(rest[0], &pid) || pid <= 0) return false;
  if (pid != getpid()) return kill(pid, 0) == -1 && errno == ESRCH;
  absl::Time started;
  std::string error;
  return absl::ParseTime(absl::RFC3339_full, rest[1], &started, &error) &&
         started < kProcessStarted;
}
#endif

absl::Status StoreError(absl::string_view store, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("--store ", store, ": ", what));
}

bool IsPrefixChar(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.' ||
         c == '/';
}

// "HOST:PORT[,HOST:PORT...][/PREFIX]" into the members and "/PREFIX" (by default "/shoal").
absl::Status ParseEtcd(absl::string_view store, std::vector<std::string>& endpoints,
                       std::string& prefix) {
  absl::string_view rest = store.substr(kEtcdScheme.size());
  prefix = "/shoal";
  if (const size_t slash = rest.find('/'); slash != absl::string_view::npos) {
    absl::string_view path = rest.substr(slash + 1);
    rest = rest.substr(0, slash);
    if (path.empty() || path.back() == '/' || path.front() == '/' ||
        !std::all_of(path.begin(), path.end(), IsPrefixChar)) {
      return StoreError(store,
                        "the key prefix after the members must be letters, digits and - _ . / "
                        "without a leading or trailing slash (e.g. etcd://127.0.0.1:2379/shoal)");
    }
    prefix = absl::StrCat("/", path);
  }
  for (absl::string_view member : absl::StrSplit(rest, ',')) {
    const size_t colon = member.rfind(':');
    if (member.empty() || colon == absl::string_view::npos || colon == 0 ||
        colon + 1 == member.size()) {
      return StoreError(
          store, absl::StrCat("expected HOST:PORT for each etcd member, got \"", member, "\""));
    }
    endpoints.emplace_back(member);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> MakeCheckpointDir(const std::string& state_dir) {
  std::error_code ec;
  std::string checkpoint_dir = state_dir + "/checkpoints";
  std::filesystem::create_directories(checkpoint_dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("--state-dir: cannot create ", checkpoint_dir, ": ", ec.message()));
  }
  return checkpoint_dir;
}

bool IsEtcdStore(const std::string& store) { return absl::StartsWith(store, kEtcdScheme); }

absl::StatusOr<std::unique_ptr<TaskStore>> OpenTaskStore(const StoreOptions& options) {
  const std::string& store = options.store;
  const std::string& state_dir = options.state_dir;
  if (store.empty() || store == "sqlite") {
    absl::StatusOr<std::unique_ptr<SqliteTaskStore>> sqlite = SqliteTaskStore::Open(state_dir);
    if (!sqlite.ok()) return sqlite.status();
    return std::unique_ptr<TaskStore>(*std::move(sqlite));
  }
  if (!absl::StartsWith(store, kEtcdScheme)) {
    return StoreError(store, "expected sqlite or etcd://HOST:PORT[,HOST:PORT...][/PREFIX]");
  }
  std::vector<std::string> endpoints;
  std::string prefix;
  if (absl::Status s = ParseEtcd(store, endpoints, prefix); !s.ok()) return s;
#ifdef SHOAL_HAVE_ETCD
  absl::StatusOr<std::string> checkpoint_dir = MakeCheckpointDir(state_dir);
  if (!checkpoint_dir.ok()) return checkpoint_dir.status();
  absl::StatusOr<std::unique_ptr<etcd::EtcdKv>> kv = etcd::EtcdKv::Connect(
      std::move(endpoints), absl::Seconds(10), absl::Seconds(5), options.etcd_credentials);
  if (!kv.ok()) {
    return absl::Status(kv.status().code(),
                        absl::StrCat("--store ", store, ": ", kv.status().message()));
  }
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  StoreLeaseOptions lease;
  lease.ttl = options.lease_ttl;
  const std::string place =
      absl::StrCat("shoal-coordinator ",
                   options.advertise.empty() ? "" : absl::StrCat("at ", options.advertise, " "),
                   "on ", host, ", pid ");
  lease.identity = absl::StrCat(place, getpid(), ", started ", absl::FormatTime(absl::Now()));
  lease.earlier_self = [place](const std::string& holder) { return IsEarlierSelf(holder, place); };
  lease.on_lost = options.on_lost;
  if (options.standby && !options.share_tasks) lease.wait = absl::InfiniteDuration();
  lease.on_held = options.on_held;
  lease.stop = options.stop;
  absl::StatusOr<std::unique_ptr<EtcdTaskStore>> opened =
      EtcdTaskStore::Open(*std::move(kv), std::move(prefix), *std::move(checkpoint_dir),
                          std::move(lease), options.share_tasks ? options.advertise : "");
  if (!opened.ok()) {
    return absl::Status(opened.status().code(),
                        absl::StrCat("--store ", store, ": ", opened.status().message()));
  }
  return std::unique_ptr<TaskStore>(*std::move(opened));
#else
  return absl::FailedPreconditionError(
      absl::StrCat("--store ", store,
                   ": this shoal-coordinator was built without etcd support (etcd's protos, "
                   "Debian's golang-etcd-server-dev, were not installed: scripts/bootstrap test, "
                   "then rebuild)"));
#endif
}

}  // namespace shoal::coordinator
