// A coordinator's hold on its etcd key prefix (StoreLease) against a real etcd member: what the
// lease under a key just taken has left.

#include "services/coordinator/store/store_lease.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"
#include "libs/etcd/etcd_kv.h"
#include "tests/testing/etcd_member.h"
#include "tests/testing/temp_dir.h"

namespace shoal::coordinator {
namespace {

// The whole seconds etcd still gives `lease` (its LeaseTimeToLive), read without renewing it.
int64_t SecondsLeft(const std::string& endpoint, int64_t lease) {
  std::unique_ptr<etcdserverpb::Lease::Stub> stub = etcdserverpb::Lease::NewStub(
      grpc::CreateChannel(endpoint, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  etcdserverpb::LeaseTimeToLiveRequest request;
  request.set_id(lease);
  etcdserverpb::LeaseTimeToLiveResponse response;
  const grpc::Status status = stub->LeaseTimeToLive(&context, request, &response);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return response.ttl();
}

// A key taken after a wait starts its hold with a whole TTL: its lease is renewed as the key is
// taken, whenever its last renewal was. Here the key goes just before the waiting lease's
// renewal is due (a third of the TTL after its grant), so that without that renewal it would
// have two thirds left. (Soak: a coordinator took its key under a lease with 2.8 s of 10 left,
// renewals having failed while etcd elected a leader; the lease lapsed before the renewing
// thread's first renewal, a third of a TTL later, and the coordinator stepped down.)
TEST(StoreLeaseTest, AKeyTakenAfterAWaitStartsWithAWholeTtl) {
  absl::StatusOr<std::string> dir = testing::MakeTestTempDir("shoal-store-lease-");
  ASSERT_TRUE(dir.ok()) << dir.status();
  absl::StatusOr<std::unique_ptr<testing::EtcdMember>> member = testing::EtcdMember::Start(*dir);
  ASSERT_TRUE(member.ok()) << member.status();
  absl::StatusOr<std::unique_ptr<etcd::EtcdKv>> kv =
      etcd::EtcdKv::Connect({(*member)->endpoint()}, absl::Seconds(10), absl::Seconds(5));
  ASSERT_TRUE(kv.ok()) << kv.status();
  absl::StatusOr<int64_t> other = (*kv)->GrantLease(absl::Seconds(60));
  ASSERT_TRUE(other.ok()) << other.status();
  ASSERT_EQ((*kv)->CreateIfAbsent("/s/owner", "another coordinator", *other).value_or(""),
            "another coordinator");

  StoreLeaseOptions options;
  options.ttl = absl::Seconds(9);
  options.wait = absl::InfiniteDuration();
  options.identity = "this coordinator";
  absl::Notification seen;  // Acquire has its lease and has found the key held
  options.on_held = [&](const std::string&) { seen.Notify(); };
  absl::StatusOr<std::unique_ptr<StoreLease>> held;
  std::thread acquirer([&] { held = StoreLease::Acquire(**kv, "/s/owner", options); });
  const bool waiting = seen.WaitForNotificationWithTimeout(absl::Seconds(10));
  if (waiting) {
    absl::SleepFor(absl::Milliseconds(2400));  // the renewal is due at 3 s
    EXPECT_TRUE((*kv)->RevokeLease(*other).ok());
  }
  acquirer.join();
  ASSERT_TRUE(waiting) << "Acquire never saw the key held";
  ASSERT_TRUE(held.ok()) << held.status();
  // Without the renewal: 9 s less the ~2.6 s since the grant, 6 s.
  EXPECT_GE(SecondsLeft((*member)->endpoint(), (*held)->fence().lease), 8);
}

}  // namespace
}  // namespace shoal::coordinator
