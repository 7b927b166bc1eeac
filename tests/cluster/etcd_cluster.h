#pragma once

// Coordinators on etcd for cluster tests: three etcd members over mutual TLS and three
// coordinators on them (EtcdCluster); what the coordinators keep in etcd, read by the test's
// own client, and the checks the fail-over tests make of it (EtcdRecords): a task's closed
// rounds are stored before a kill, and a completed task has every round once, in its history
// and in its records.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <regex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "libs/etcd/etcd_kv.h"
#include "libs/rpc/tls.h"
#include "tests/cluster/cluster.h"
#include "tests/testing/etcd_member.h"
#include "tests/testing/wait.h"

namespace shoal::testing {

// A small task of `rounds` short rounds (an epoch of each peer's 1,000 samples, about half a
// second) for `peers` peers.
inline common::v1::TaskSpec ShortTask(const std::string& name, common::v1::Mode mode, int rounds,
                                      int peers) {
  common::v1::TaskSpec spec = SmallTask(name);
  spec.set_mode(mode);
  spec.set_rounds(rounds);
  spec.set_round_batches(30);
  spec.mutable_dataset()->set_train_limit(2000);
  spec.mutable_dataset()->set_test_limit(200);
  spec.set_min_participants(peers);
  return spec;
}

// Whether round `round` or a later one is under way and the one before it closed.
inline bool Training(const coordinator::v1::TaskStatus& s, uint64_t round) {
  return s.state() == coordinator::v1::TASK_STATE_RUNNING && s.round() >= round &&
         s.history_size() > 0 && s.history(s.history_size() - 1).round() + 1 == s.round();
}

// The rounds of `task` that a coordinator logged in `dir` (coordinator*.log) as adopted from a
// peer after a restart: completed at the peers while the coordinator before it could no longer
// store the round (killed, or stepping down), so that only the round's model is known
// (DecentralizedTask::AdoptRoundCompletedBeforeRestart).
inline std::set<uint64_t> AdoptedRounds(const std::string& dir, const std::string& task) {
  const std::regex adopted(absl::StrCat("task ", task,
                                        ": peer \\S+ holds round ([0-9]+), completed before the "
                                        "coordinator restarted"));
  std::set<uint64_t> rounds;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (!absl::StartsWith(name, "coordinator") || !absl::EndsWith(name, ".log")) continue;
    std::ifstream in(entry.path());
    std::smatch match;
    for (std::string line; std::getline(in, line);) {
      if (std::regex_search(line, match, adopted)) rounds.insert(std::stoull(match[1].str()));
    }
  }
  return rounds;
}

class EtcdRecords {
 public:
  EtcdRecords(etcd::EtcdKv& kv, std::string prefix) : kv_(kv), prefix_(std::move(prefix)) {}

  // `task`'s records of `kind` ("rounds", "checkpoints"), by key.
  std::vector<etcd::KeyValue> Of(const std::string& kind, const std::string& task) {
    const std::string prefix = absl::StrCat(prefix_, "/", kind, "/", task, "/");
    absl::StatusOr<std::vector<etcd::KeyValue>> records =
        kv_.Range({prefix, etcd::EtcdKv::PrefixEnd(prefix)});
    return records.ok() ? *std::move(records) : std::vector<etcd::KeyValue>();
  }

  // The task's own record (its status without history), if it parses.
  std::optional<coordinator::v1::TaskStatus> Task(const std::string& task) {
    const std::string key = absl::StrCat(prefix_, "/tasks/", task);
    absl::StatusOr<std::vector<etcd::KeyValue>> record = kv_.Range({key, key + '\0'});
    coordinator::v1::TaskStatus status;
    if (!record.ok() || record->size() != 1 || !status.ParseFromString((*record)[0].value)) {
      return std::nullopt;
    }
    return status;
  }

  // Whether every round closed in `s` is stored, and (federated-sync) a checkpoint record of
  // its newest model. A round is stored before any peer hears of it, but a status read from the
  // coordinator may show it a moment before; the checkpoint comes after the round.
  bool Stored(const coordinator::v1::TaskStatus& s) {
    if (s.history_size() == 0) return true;
    const coordinator::v1::RoundSummary& last = s.history(s.history_size() - 1);
    if (Of("rounds", s.spec().name()).size() < last.round()) return false;
    if (s.spec().mode() != common::v1::MODE_FEDERATED_SYNC) return true;
    const std::vector<etcd::KeyValue> checkpoints = Of("checkpoints", s.spec().name());
    if (checkpoints.empty()) return false;
    const std::string& key = checkpoints.back().key;  // ends in the version, zero-padded
    uint64_t version = 0;
    return absl::SimpleAtoi(key.substr(key.rfind('/') + 1), &version) &&
           version >= last.model_version();
  }

  // Checks the final status `after` of `spec`'s task: completed with rounds 1..N once each, by
  // `peers` peers (the rounds in `adopted`, AdoptedRounds, by none that the coordinator knows);
  // the closed rounds of each status in `seen` kept as they were; and one record per round in
  // etcd.
  void ExpectCompletedEveryRoundOnce(const common::v1::TaskSpec& spec,
                                     const coordinator::v1::TaskStatus& after,
                                     const std::vector<coordinator::v1::TaskStatus>& seen,
                                     int peers, const std::set<uint64_t>& adopted) {
    EXPECT_EQ(after.state(), coordinator::v1::TASK_STATE_COMPLETED) << after.ShortDebugString();
    ASSERT_EQ(after.history_size(), static_cast<int>(spec.rounds())) << after.ShortDebugString();
    for (int i = 0; i < after.history_size(); ++i) {
      const coordinator::v1::RoundSummary& round = after.history(i);
      EXPECT_EQ(round.round(), static_cast<uint64_t>(i + 1));
      EXPECT_EQ(round.participants_size(), adopted.count(round.round()) > 0 ? 0 : peers)
          << round.ShortDebugString();
      if (i > 0) {
        EXPECT_GT(round.model_version(), after.history(i - 1).model_version());
      }
    }
    for (const coordinator::v1::TaskStatus& status : seen) {
      for (const coordinator::v1::RoundSummary& kept : status.history()) {
        const coordinator::v1::RoundSummary& now =
            after.history(static_cast<int>(kept.round()) - 1);
        EXPECT_EQ(now.model_version(), kept.model_version()) << "round " << kept.round();
        EXPECT_EQ(now.model_digest(), kept.model_digest()) << "round " << kept.round();
        EXPECT_EQ(now.completed_unix_ms(), kept.completed_unix_ms()) << "round " << kept.round();
      }
    }
    // The coordinator writes its records behind the status it serves: they are all there soon.
    std::vector<etcd::KeyValue> records;
    WaitUntil(
        [&] {
          records = Of("rounds", spec.name());
          return records.size() >= spec.rounds();
        },
        absl::Seconds(10), absl::Milliseconds(100));
    std::string keys;
    for (const etcd::KeyValue& record : records) absl::StrAppend(&keys, record.key, " ");
    EXPECT_EQ(records.size(), spec.rounds()) << keys;
  }

 private:
  etcd::EtcdKv& kv_;
  const std::string prefix_;
};

// Three etcd members over mutual TLS with the cluster's CA, the test's own client of them, and
// three coordinators on them (the first serving before the other two start), each with
// `coordinator_args` after --store, --store-lease and --store-tls. Destroy the cluster first.
struct EtcdCluster {
  std::vector<std::unique_ptr<EtcdMember>> members;
  std::unique_ptr<etcd::EtcdKv> kv;
  std::unique_ptr<EtcdRecords> records;

  void Start(Cluster& cluster, const std::string& prefix, absl::Duration lease,
             std::vector<std::string> coordinator_args = {}) {
    ASSERT_TRUE(cluster.MakeCertificate("etcd").ok());
    absl::StatusOr<std::vector<std::unique_ptr<EtcdMember>>> started =
        EtcdMember::StartCluster(cluster.dir(), 3, cluster.dir() + "/certs/etcd");
    ASSERT_TRUE(started.ok()) << started.status();
    members = *std::move(started);
    std::vector<std::string> endpoints;
    for (const auto& member : members) endpoints.push_back(member->endpoint());
    absl::StatusOr<rpc::Credentials> client =
        rpc::Credentials::Create({.dir = cluster.ClientTlsDir()});
    ASSERT_TRUE(client.ok()) << client.status();
    absl::StatusOr<std::unique_ptr<etcd::EtcdKv>> connected =
        etcd::EtcdKv::Connect(endpoints, absl::Seconds(10), absl::Seconds(2), client->channel());
    ASSERT_TRUE(connected.ok()) << connected.status();
    kv = *std::move(connected);
    records = std::make_unique<EtcdRecords>(*kv, prefix);
    std::vector<std::string> args = {absl::StrCat("--store=etcd://", Endpoints(members), prefix),
                                     absl::StrCat("--store-lease=", absl::FormatDuration(lease)),
                                     "--store-tls"};
    args.insert(args.end(), coordinator_args.begin(), coordinator_args.end());
    ASSERT_TRUE(cluster.StartCoordinator(std::move(args)).ok()) << cluster.LogTails();
    ASSERT_TRUE(cluster.WaitForCoordinatorServing(absl::Seconds(20)).ok()) << cluster.LogTails();
    for (int i = 0; i < 2; ++i) {
      ASSERT_TRUE(cluster.StartStandbyCoordinator().ok()) << cluster.LogTails();
    }
  }
};

}  // namespace shoal::testing
