// What only the etcd store has: members that are down, hang or lose the quorum, key prefixes,
// records that do not parse, fenced writes, holds on a prefix, mutual TLS (real etcd members
// started by the tests).

#include <gmock/gmock.h>
#include <grpcpp/security/credentials.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "libs/etcd/etcd_kv.h"
#include "libs/rpc/tls.h"
#include "services/coordinator/store/sqlite_task_store.h"
#include "services/coordinator/task_store.h"
#include "services/shoalctl/process.h"
#include "tests/service/store_test_records.h"
#include "tests/testing/etcd_member.h"
#include "tests/testing/etcd_suite.h"
#include "tests/testing/reserved_port.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/wait.h"

namespace shoal::coordinator {
namespace {

using store_testing::Options;
using store_testing::Task;
using ::testing::HasSubstr;

class EtcdTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::string> dir = testing::MakeTestTempDir("shoal-etcd-");
    ASSERT_TRUE(dir.ok()) << dir.status();
    dir_ = *dir;
    absl::StatusOr<std::unique_ptr<testing::EtcdMember>> member = testing::EtcdMember::Start(dir_);
    ASSERT_TRUE(member.ok()) << member.status();
    member_ = *std::move(member);
  }
  std::string dir_;
  std::unique_ptr<testing::EtcdMember> member_;
};

TEST_F(EtcdTest, AMemberThatIsDownIsSkippedAndOneThatStopsIsNamed) {
  absl::StatusOr<testing::ReservedPort> dead = testing::ReservedPort::Reserve();
  ASSERT_TRUE(dead.ok());
  // The first member refuses connections: the calls go to the second.
  absl::StatusOr<std::unique_ptr<etcd::EtcdKv>> kv = etcd::EtcdKv::Connect(
      {dead->address(), member_->endpoint()}, absl::Seconds(10), absl::Seconds(5));
  ASSERT_TRUE(kv.ok()) << kv.status();
  ASSERT_TRUE((*kv)->Put("/k", "v").ok());
  absl::StatusOr<std::vector<etcd::KeyValue>> got = (*kv)->Range({"/k", ""});
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 1u);
  EXPECT_EQ((*got)[0].value, "v");
  member_->Kill();
  absl::Status put = (*kv)->Put("/k", "w");
  EXPECT_EQ(put.code(), absl::StatusCode::kUnavailable) << put;
  EXPECT_THAT(put.message(), HasSubstr(member_->endpoint()));
  EXPECT_THAT(put.message(), HasSubstr(dead->address()));
  absl::StatusOr<std::unique_ptr<etcd::EtcdKv>> none =
      etcd::EtcdKv::Connect({dead->address()}, absl::Milliseconds(300), absl::Seconds(1));
  EXPECT_EQ(none.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(none.status().message(), HasSubstr("no member answered"));
}

// A member that was down is used again as soon as it serves, not after gRPC's reconnect backoff
// (which had grown to seconds over the failed calls). Most of the second or two measured is
// etcd's own start: it accepts connections before it answers them.
TEST_F(EtcdTest, AMemberThatComesBackIsUsedAgainWithinASecondOrTwo) {
  absl::StatusOr<std::unique_ptr<etcd::EtcdKv>> kv =
      etcd::EtcdKv::Connect({member_->endpoint()}, absl::Seconds(10), absl::Seconds(1));
  ASSERT_TRUE(kv.ok()) << kv.status();
  ASSERT_TRUE((*kv)->Put("/back", "1").ok());
  member_->Kill();
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ((*kv)->Put("/back", "2").code(), absl::StatusCode::kUnavailable);
    absl::SleepFor(absl::Milliseconds(200));  // the calls of a store left without etcd
  }
  ASSERT_TRUE(member_->Restart().ok());
  const absl::Time back = absl::Now();
  EXPECT_TRUE(testing::WaitUntil([&] { return (*kv)->Put("/back", "3").ok(); },
                                 testing::Scaled(absl::Seconds(3))))
      << "no put within 3 s of etcd listening again";
  std::printf("etcd member used again %s after it listened\n",
              absl::FormatDuration(absl::Now() - back).c_str());
}

// A member that hangs (SIGSTOP: its connections open, no answers) costs the store's hold on its
// prefix nothing: each renewal gives a member a third of the TTL (at least 2 s) before it asks the
// next, where the whole call timeout (5 s) outlasted a 5-s TTL.
TEST(EtcdClusterTest, AMemberThatHangsCostsTheHoldNothing) {
  absl::StatusOr<std::string> dir = testing::MakeTestTempDir("shoal-etcd-hang-");
  ASSERT_TRUE(dir.ok()) << dir.status();
  absl::StatusOr<std::vector<std::unique_ptr<testing::EtcdMember>>> members =
      testing::EtcdMember::StartCluster(*dir, 3);
  ASSERT_TRUE(members.ok()) << members.status();
  // The store asks a follower first (a paused leader would stop the cluster for an election).
  const size_t hung = testing::FirstMember(*members, /*leader=*/false);
  ASSERT_LT(hung, members->size());
  const std::vector<std::string> endpoints = testing::EndpointsFrom(*members, hung);
  StoreOptions options =
      Options(absl::StrCat("etcd://", absl::StrJoin(endpoints, ","), "/p"), *dir);
  options.lease_ttl = absl::Seconds(5);  // the Kubernetes overlays' and the compose profile's
  absl::Mutex mu;
  std::string lost;
  options.on_lost = [&](const absl::Status& why) {
    absl::MutexLock lock(&mu);
    lost = std::string(why.message());
  };
  absl::StatusOr<std::unique_ptr<TaskStore>> store = OpenTaskStore(options);
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_TRUE((*store)->PutTask(Task("t", v1::TASK_STATE_RUNNING)).ok());

  (*members)[hung]->Signal(SIGSTOP);
  // Two TTLs of writes: each lands (the first after the call timeout on the hung member), and
  // the hold stays.
  const absl::Time until = absl::Now() + 2 * options.lease_ttl;
  int writes = 0;
  while (absl::Now() < until) {
    absl::Status put = (*store)->PutTask(Task("t", v1::TASK_STATE_RUNNING));
    EXPECT_TRUE(put.ok()) << put;
    ++writes;
    absl::SleepFor(absl::Milliseconds(200));  // the pace of a store's writes
  }
  (*members)[hung]->Signal(SIGCONT);
  EXPECT_GE(writes, 2);
  absl::MutexLock lock(&mu);
  EXPECT_EQ(lost, "") << "the hold was lost while one member of three hung";
}

// A renewal counts only where a quorum stands behind the member that answers it: a leader cut
// off from both followers (here: they hang) renews leases in its own memory until it notices,
// which the real cluster never sees (soak: a leader paused past an election, then resumed, took
// a coordinator's renewals for seconds while the new leader let its lease lapse).
TEST(EtcdClusterTest, ARenewalThatNoQuorumConfirmsIsNone) {
  absl::StatusOr<std::string> dir = testing::MakeTestTempDir("shoal-etcd-quorum-");
  ASSERT_TRUE(dir.ok()) << dir.status();
  absl::StatusOr<std::vector<std::unique_ptr<testing::EtcdMember>>> members =
      testing::EtcdMember::StartCluster(*dir, 3);
  ASSERT_TRUE(members.ok()) << members.status();
  const size_t leader = testing::FirstMember(*members, /*leader=*/true);
  ASSERT_LT(leader, members->size());
  absl::StatusOr<std::unique_ptr<etcd::EtcdKv>> kv = etcd::EtcdKv::Connect(
      testing::EndpointsFrom(*members, leader), absl::Seconds(10), absl::Seconds(5));
  ASSERT_TRUE(kv.ok()) << kv.status();
  absl::StatusOr<int64_t> lease = (*kv)->GrantLease(absl::Seconds(10));
  ASSERT_TRUE(lease.ok()) << lease.status();
  ASSERT_TRUE((*kv)->KeepAlive(*lease, "/q", absl::Seconds(1)).ok());

  for (size_t i = 0; i < members->size(); ++i) {
    if (i != leader) (*members)[i]->Signal(SIGSTOP);
  }
  absl::StatusOr<absl::Duration> alone = (*kv)->KeepAlive(*lease, "/q", absl::Seconds(1));
  for (size_t i = 0; i < members->size(); ++i) {
    if (i != leader) (*members)[i]->Signal(SIGCONT);
  }
  EXPECT_EQ(alone.status().code(), absl::StatusCode::kUnavailable) << alone.status();
  // With the quorum back, renewals are real again.
  EXPECT_TRUE(testing::WaitUntil(
      [&] { return (*kv)->KeepAlive(*lease, "/q", absl::Seconds(1)).ok(); }, absl::Seconds(20)));
}

TEST_F(EtcdTest, PrefixesKeepStoresApartAndABadRecordIsDataLoss) {
  const std::string members = absl::StrCat("etcd://", member_->endpoint());
  absl::StatusOr<std::unique_ptr<TaskStore>> one = OpenTaskStore(Options(members + "/one", dir_));
  absl::StatusOr<std::unique_ptr<TaskStore>> two =
      OpenTaskStore(Options(members + "/one/two", dir_));
  ASSERT_TRUE(one.ok() && two.ok());
  ASSERT_TRUE((*one)->PutTask(Task("t", v1::TASK_STATE_RUNNING)).ok());
  absl::StatusOr<std::vector<StoredTask>> seen = (*two)->LoadTasks(1);
  ASSERT_TRUE(seen.ok()) << seen.status();
  EXPECT_TRUE(seen->empty());

  absl::StatusOr<std::unique_ptr<etcd::EtcdKv>> kv =
      etcd::EtcdKv::Connect({member_->endpoint()}, absl::Seconds(10), absl::Seconds(5));
  ASSERT_TRUE(kv.ok());
  ASSERT_TRUE((*kv)->Put("/one/tasks/broken", "\xff\xff not a TaskStatus").ok());
  absl::StatusOr<std::vector<StoredTask>> broken = (*one)->LoadTasks(1);
  EXPECT_EQ(broken.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(broken.status().message(), HasSubstr("/one/tasks/broken"));
}

TEST_F(EtcdTest, AFencedWriteOfAHolderWhoseLeaseLapsedWritesNothing) {
  absl::StatusOr<std::unique_ptr<etcd::EtcdKv>> kv =
      etcd::EtcdKv::Connect({member_->endpoint()}, absl::Seconds(10), absl::Seconds(5));
  ASSERT_TRUE(kv.ok()) << kv.status();
  absl::StatusOr<int64_t> first = (*kv)->GrantLease(absl::Seconds(2));
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<std::string> holder = (*kv)->CreateIfAbsent("/f/owner", "a", *first);
  ASSERT_TRUE(holder.ok()) << holder.status();
  EXPECT_EQ(*holder, "a");
  const etcd::Fence fence{"/f/owner", *first};
  ASSERT_TRUE((*kv)->Put("/f/x", "1", &fence).ok());
  // Not renewed: etcd lets the lease go within its TTL, and the key with it.
  ASSERT_TRUE(testing::WaitUntil(
      [&] {
        absl::StatusOr<std::vector<etcd::KeyValue>> owner = (*kv)->Range({"/f/owner", ""});
        return owner.ok() && owner->empty();
      },
      absl::Seconds(10)));
  EXPECT_EQ((*kv)->KeepAlive(*first, "/f/owner").status().code(), absl::StatusCode::kNotFound);
  absl::StatusOr<int64_t> second = (*kv)->GrantLease(absl::Seconds(2));
  ASSERT_TRUE(second.ok());
  holder = (*kv)->CreateIfAbsent("/f/owner", "b", *second);
  ASSERT_TRUE(holder.ok()) << holder.status();
  EXPECT_EQ(*holder, "b");
  EXPECT_EQ((*kv)->CreateIfAbsent("/f/owner", "c", *second).value_or(""), "b");
  absl::Status late = (*kv)->Put("/f/x", "2", &fence);
  EXPECT_EQ(late.code(), absl::StatusCode::kFailedPrecondition) << late;
  EXPECT_THAT(late.message(), HasSubstr("nothing written"));
  EXPECT_EQ((*kv)->DeleteRange("/f/", "/f0", &fence).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*kv)->DeleteRanges({{"/f/x", "/f/y"}, {"/f/", "/f0"}}, fence).code(),
            absl::StatusCode::kFailedPrecondition);
  absl::StatusOr<std::vector<etcd::KeyValue>> x = (*kv)->Range({"/f/x", ""});
  ASSERT_TRUE(x.ok() && x->size() == 1u);
  EXPECT_EQ((*x)[0].value, "1");
  // The holder's deletes go through, every range in one transaction.
  ASSERT_TRUE((*kv)->Put("/f/y", "3").ok());
  EXPECT_TRUE(
      (*kv)->DeleteRanges({{"/f/x", "/f/x0"}, {"/f/y", "/f/y0"}}, {"/f/owner", *second}).ok());
  absl::StatusOr<std::vector<etcd::KeyValue>> left = (*kv)->Range({"/f/", "/f0"});
  ASSERT_TRUE(left.ok());
  ASSERT_EQ(left->size(), 1u);
  EXPECT_EQ((*left)[0].key, "/f/owner");
}

TEST_F(EtcdTest, ASecondStoreOnAPrefixWaitsAndAStoreThatLostItsHoldStepsDown) {
  const std::string url = absl::StrCat("etcd://", member_->endpoint(), "/p");
  StoreOptions options = Options(url, dir_);
  absl::Mutex mu;
  std::string lost;
  options.on_lost = [&](const absl::Status& why) {
    absl::MutexLock lock(&mu);
    lost = std::string(why.message());
  };
  absl::StatusOr<std::unique_ptr<TaskStore>> first = OpenTaskStore(options);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE((*first)->PutTask(Task("t", v1::TASK_STATE_RUNNING)).ok());

  // The prefix is held: a second store waits a TTL and a half, then names the holder.
  const absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<TaskStore>> refused = OpenTaskStore(Options(url, dir_));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(), HasSubstr("/p/owner is held by another coordinator"));
  EXPECT_THAT(refused.status().message(), HasSubstr("shoal-coordinator on "));
  EXPECT_GE(absl::Now() - start, absl::Seconds(3));

  // The first store's hold goes behind its back (as when it was paused past its TTL): it
  // reports the loss, writes nothing more, and a second store takes the prefix over.
  absl::StatusOr<std::unique_ptr<etcd::EtcdKv>> kv =
      etcd::EtcdKv::Connect({member_->endpoint()}, absl::Seconds(10), absl::Seconds(5));
  ASSERT_TRUE(kv.ok());
  absl::StatusOr<std::vector<etcd::KeyValue>> owner = (*kv)->Range({"/p/owner", ""});
  ASSERT_TRUE(owner.ok() && owner->size() == 1u);
  ASSERT_TRUE((*kv)->RevokeLease((*owner)[0].lease).ok());
  ASSERT_TRUE(testing::WaitUntil(
      [&] {
        absl::MutexLock lock(&mu);
        return !lost.empty();
      },
      absl::Seconds(10)));
  {
    absl::MutexLock lock(&mu);
    EXPECT_THAT(lost, HasSubstr("lost the hold on /p/owner"));
  }
  absl::StatusOr<std::unique_ptr<TaskStore>> second = OpenTaskStore(Options(url, dir_));
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ((*first)->PutTask(Task("t", v1::TASK_STATE_FAILED)).code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE((*second)->PutTask(Task("t", v1::TASK_STATE_COMPLETED)).ok());
  absl::StatusOr<std::vector<StoredTask>> tasks = (*second)->LoadTasks(1);
  ASSERT_TRUE(tasks.ok() && tasks->size() == 1u);
  EXPECT_EQ((*tasks)[0].status.state(), v1::TASK_STATE_COMPLETED);
}

// A coordinator started again after a crash finds its key still held by its earlier process,
// whose lease an etcd leader election may have renewed past the wait: it waits for that lease
// without the wait's deadline (here the holder's lease outlasts the 3-s wait, then goes), where
// another coordinator's hold is refused after the wait (above).
TEST_F(EtcdTest, ACoordinatorStartedAgainWaitsForItsEarlierProcessPastTheWait) {
  // An earlier process of this coordinator: the same address on this host, a pid that is gone.
  const pid_t gone = fork();
  ASSERT_GE(gone, 0);
  if (gone == 0) _exit(0);
  ASSERT_EQ(waitpid(gone, nullptr, 0), gone);
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  absl::StatusOr<std::unique_ptr<etcd::EtcdKv>> kv =
      etcd::EtcdKv::Connect({member_->endpoint()}, absl::Seconds(10), absl::Seconds(5));
  ASSERT_TRUE(kv.ok()) << kv.status();
  absl::StatusOr<int64_t> lease = (*kv)->GrantLease(absl::Seconds(60));
  ASSERT_TRUE(lease.ok()) << lease.status();
  const std::string earlier = absl::StrCat("shoal-coordinator at 127.0.0.1:7 on ", host, ", pid ",
                                           gone, ", started 2026-01-01T00:00:00+00:00");
  ASSERT_EQ((*kv)->CreateIfAbsent("/r/owner", earlier, *lease).value_or(""), earlier);

  StoreOptions options = Options(absl::StrCat("etcd://", member_->endpoint(), "/r"), dir_);
  options.advertise = "127.0.0.1:7";  // TTL 2 s: a wait of 3 s
  absl::StatusOr<std::unique_ptr<TaskStore>> opened;
  const absl::Time start = absl::Now();
  absl::Time done;
  std::thread opener([&] {
    opened = OpenTaskStore(options);
    done = absl::Now();
  });
  // Past the wait on purpose: a holder that is not this coordinator's would be refused by now.
  absl::SleepFor(absl::Seconds(5));
  EXPECT_TRUE((*kv)->RevokeLease(*lease).ok());
  opener.join();
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_GE(done - start, absl::Seconds(5));
  EXPECT_TRUE((*opened)->PutTask(Task("t", v1::TASK_STATE_RUNNING)).ok());
}

// Makes a CA and the certificates NAMES with scripts/gen-certs under DIR (DIR/NAME/{ca.crt,
// tls.crt,tls.key}).
void GenCerts(const std::string& dir, std::vector<std::string> names) {
  const char* source = std::getenv("SHOAL_SOURCE_DIR");
  process::ProcessOptions gen;
  gen.name = "gen-certs";
  gen.binary = absl::StrCat(source != nullptr ? source : ".", "/scripts/gen-certs");
  gen.args = {dir};
  gen.args.insert(gen.args.end(), names.begin(), names.end());
  gen.log_path = dir + ".log";
  absl::StatusOr<std::unique_ptr<process::Process>> proc = process::Process::Start(gen);
  ASSERT_TRUE(proc.ok()) << proc.status();
  absl::StatusOr<process::ExitStatus> exit = (*proc)->Wait(absl::Seconds(60));
  ASSERT_TRUE(exit.ok() && exit->success()) << (*proc)->LogTail(10);
}

std::shared_ptr<grpc::ChannelCredentials> ClientCredentials(const std::string& dir) {
  absl::StatusOr<rpc::Credentials> credentials = rpc::Credentials::Create({.dir = dir});
  EXPECT_TRUE(credentials.ok()) << credentials.status();
  return credentials.ok() ? credentials->channel() : nullptr;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// TLS that trusts `ca_file` and presents the certificate of `cert_dir` (tls.crt, tls.key), or
// none.
std::shared_ptr<grpc::ChannelCredentials> Tls(const std::string& ca_file,
                                              const std::string& cert_dir = "") {
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = ReadAll(ca_file);
  if (!cert_dir.empty()) {
    options.pem_cert_chain = ReadAll(cert_dir + "/tls.crt");
    options.pem_private_key = ReadAll(cert_dir + "/tls.key");
  }
  return grpc::SslCredentials(options);
}

// --store-tls: the store speaks mutual TLS to etcd with the coordinator's certificate; a
// plaintext client, one without a certificate and one whose certificate another CA signed (each
// trusting etcd's) get nothing.
TEST(EtcdTlsTest, TheStoreSpeaksMutualTlsAndOnlyToTheDeploymentsCa) {
  absl::StatusOr<std::string> dir = testing::MakeTestTempDir("shoal-etcd-tls-");
  ASSERT_TRUE(dir.ok()) << dir.status();
  GenCerts(*dir + "/certs", {"etcd", "coordinator"});
  GenCerts(*dir + "/other", {"coordinator"});
  absl::StatusOr<std::unique_ptr<testing::EtcdMember>> member =
      testing::EtcdMember::Start(*dir, *dir + "/certs/etcd");
  ASSERT_TRUE(member.ok()) << member.status();

  StoreOptions options = Options(absl::StrCat("etcd://", (*member)->endpoint(), "/tls"), *dir);
  options.etcd_credentials = ClientCredentials(*dir + "/certs/coordinator");
  absl::StatusOr<std::unique_ptr<TaskStore>> store = OpenTaskStore(options);
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_TRUE((*store)->PutTask(Task("t", v1::TASK_STATE_RUNNING)).ok());
  absl::StatusOr<std::vector<StoredTask>> tasks = (*store)->LoadTasks(1);
  ASSERT_TRUE(tasks.ok()) << tasks.status();
  ASSERT_EQ(tasks->size(), 1u);

  for (const auto& [what, credentials] :
       std::vector<std::pair<std::string, std::shared_ptr<grpc::ChannelCredentials>>>{
           {"plaintext", nullptr},
           {"no client certificate", Tls(*dir + "/certs/coordinator/ca.crt")},
           {"a client certificate of another CA",
            Tls(*dir + "/certs/coordinator/ca.crt", *dir + "/other/coordinator")}}) {
    absl::StatusOr<std::unique_ptr<etcd::EtcdKv>> kv = etcd::EtcdKv::Connect(
        {(*member)->endpoint()}, absl::Milliseconds(500), absl::Seconds(1), credentials);
    EXPECT_EQ(kv.status().code(), absl::StatusCode::kUnavailable) << what << ": " << kv.status();
    EXPECT_THAT(kv.status().message(), HasSubstr((*member)->endpoint())) << what;
  }
}

TEST(EtcdKvTest, PrefixEnd) {
  EXPECT_EQ(etcd::EtcdKv::PrefixEnd("/a/"), "/a0");
  EXPECT_EQ(etcd::EtcdKv::PrefixEnd("a\xff"), "b");
  EXPECT_EQ(etcd::EtcdKv::PrefixEnd("\xff"), std::string(1, '\0'));
}

}  // namespace
}  // namespace shoal::coordinator
