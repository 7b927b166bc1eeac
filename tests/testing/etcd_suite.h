#pragma once

// One real etcd member for a whole test suite: a fixture base (over `Base`, ::testing::Test by
// default) that starts it before the suite's first test and stops it after its last. Tests
// keep apart by key prefix.

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "tests/testing/etcd_member.h"
#include "tests/testing/temp_dir.h"

namespace shoal::testing {

template <typename Base = ::testing::Test>
class WithEtcdMember : public Base {
 protected:
  static void SetUpTestSuite() {
    absl::StatusOr<std::string> dir = MakeTestTempDir("shoal-etcd-");
    ASSERT_TRUE(dir.ok()) << dir.status();
    absl::StatusOr<std::unique_ptr<EtcdMember>> member = EtcdMember::Start(*dir);
    ASSERT_TRUE(member.ok()) << member.status();
    etcd_ = member->release();
  }
  static void TearDownTestSuite() {
    delete etcd_;
    etcd_ = nullptr;
  }
  // The member; null when it did not start (SetUpTestSuite failed the suite).
  static EtcdMember* etcd() { return etcd_; }
  // A key prefix of its own for each call: "/NAME/1", "/NAME/2", ...
  static std::string NewPrefix(const std::string& name) {
    return "/" + name + "/" + std::to_string(++prefixes_);
  }

 private:
  static inline EtcdMember* etcd_ = nullptr;
  static inline int prefixes_ = 0;
};

}  // namespace shoal::testing
