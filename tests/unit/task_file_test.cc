#include "libs/task/task_file.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "shoal/coordinator/v1/control.pb.h"
#include "tests/unit/task_test_util.h"

namespace shoal::task {
namespace {

using common::v1::TaskSpec;
using ::testing::AllOf;
using ::testing::HasSubstr;

TaskSpec ValidSpec() {
  TaskSpec spec = DefaultTaskSpec();
  spec.set_name("ok");
  return spec;
}

TEST(TaskFileTest, LoadsCompleteYaml) {
  absl::StatusOr<TaskSpec> spec = LoadTaskFile(DataPath("good.yaml"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name(), "fmnist-skew");
  EXPECT_EQ(spec->mode(), common::v1::MODE_FEDERATED_SYNC);
  EXPECT_EQ(spec->model(), "mlp");
  EXPECT_EQ(spec->dataset().name(), "fashion-mnist");
  EXPECT_EQ(spec->dataset().partition(), common::v1::PARTITION_LABEL_SKEW);
  EXPECT_EQ(spec->dataset().classes_per_shard(), 3u);
  EXPECT_EQ(spec->dataset().train_limit(), 6000u);
  EXPECT_EQ(spec->dataset().test_limit(), 1000u);
  EXPECT_EQ(spec->batch_size(), 64u);
  EXPECT_EQ(spec->optimizer().kind(), common::v1::OPTIMIZER_ADAM);
  EXPECT_DOUBLE_EQ(spec->optimizer().learning_rate(), 0.001);
  // An explicit zero is kept, not replaced by the default 0.9.
  EXPECT_DOUBLE_EQ(spec->optimizer().momentum(), 0.0);
  EXPECT_EQ(spec->round_batches(), 20u);
  EXPECT_EQ(spec->rounds(), 5u);
  EXPECT_EQ(spec->min_participants(), 2u);
  EXPECT_EQ(spec->max_participants(), 4u);
  EXPECT_EQ(spec->round_deadline_seconds(), 30u);
  EXPECT_EQ(spec->aggregation(), common::v1::AGGREGATION_MEAN);
  EXPECT_EQ(spec->seed(), 42u);
  EXPECT_DOUBLE_EQ(spec->max_update_norm(), 100.5);
}

TEST(TaskFileTest, LoadsJsonWithFullEnumNamesAndDefaults) {
  absl::StatusOr<TaskSpec> spec = LoadTaskFile(DataPath("good.json"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name(), "fmnist-json");
  EXPECT_EQ(spec->mode(), common::v1::MODE_FEDERATED_SYNC);
  EXPECT_EQ(spec->model(), "cnn");
  EXPECT_EQ(spec->dataset().partition(), common::v1::PARTITION_IID);
  EXPECT_EQ(spec->dataset().name(), "fashion-mnist");  // default inside a given message
  EXPECT_EQ(spec->batch_size(), 16u);
  EXPECT_DOUBLE_EQ(spec->optimizer().learning_rate(), 0.1);
  EXPECT_DOUBLE_EQ(spec->optimizer().momentum(), 0.9);
  EXPECT_EQ(spec->rounds(), 3u);
  EXPECT_EQ(spec->round_batches(), 50u);
}

TEST(TaskFileTest, MinimalFileGetsEveryDefault) {
  absl::StatusOr<TaskSpec> spec = LoadTaskFile(DataPath("minimal.yaml"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  TaskSpec expected = DefaultTaskSpec();
  expected.set_name("tiny");
  EXPECT_EQ(spec->SerializeAsString(), expected.SerializeAsString()) << spec->DebugString();
  EXPECT_EQ(spec->mode(), common::v1::MODE_FEDERATED_SYNC);
  EXPECT_EQ(spec->aggregation(), common::v1::AGGREGATION_MEAN);
  EXPECT_EQ(spec->dataset().partition(), common::v1::PARTITION_IID);
  EXPECT_EQ(spec->optimizer().kind(), common::v1::OPTIMIZER_SGD);
  EXPECT_DOUBLE_EQ(spec->optimizer().learning_rate(), 0.05);
  EXPECT_DOUBLE_EQ(spec->optimizer().momentum(), 0.9);
  EXPECT_EQ(spec->batch_size(), 32u);
  EXPECT_EQ(spec->round_batches(), 50u);
  EXPECT_EQ(spec->rounds(), 10u);
  EXPECT_EQ(spec->min_participants(), 1u);
  EXPECT_EQ(spec->max_participants(), 0u);
  EXPECT_EQ(spec->round_deadline_seconds(), 120u);
  EXPECT_EQ(spec->seed(), 1u);
}

struct BadFile {
  std::string file;
  absl::StatusCode code;
  std::string message;  // must appear in the error
};

class BadTaskFileTest : public ::testing::TestWithParam<BadFile> {};

TEST_P(BadTaskFileTest, IsRejectedNamingFileAndField) {
  const BadFile& bad = GetParam();
  const std::string path = DataPath(bad.file);
  absl::StatusOr<TaskSpec> spec = LoadTaskFile(path);
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), bad.code) << spec.status();
  EXPECT_THAT(std::string(spec.status().message()),
              AllOf(HasSubstr(path + ":"), HasSubstr(bad.message)));
}

INSTANTIATE_TEST_SUITE_P(
    Files, BadTaskFileTest,
    ::testing::Values(
        BadFile{"bad_partition.yaml", absl::StatusCode::kInvalidArgument,
                "dataset.partition: unknown value \"foo\" (expected iid, label-skew, dirichlet)"},
        BadFile{"bad_unknown_key.yaml", absl::StatusCode::kInvalidArgument,
                "optimizer.lr: unknown field (expected one of kind, learning_rate, momentum)"},
        BadFile{"bad_type.json", absl::StatusCode::kInvalidArgument,
                "batch_size: expected a non-negative integer, got \"32\""},
        BadFile{"bad_negative.yaml", absl::StatusCode::kInvalidArgument,
                "rounds: must not be negative, got -3"},
        BadFile{"bad_out_of_range.yaml", absl::StatusCode::kInvalidArgument,
                "round_batches: out of range: 99999999999"},
        BadFile{"bad_batch_size.yaml", absl::StatusCode::kInvalidArgument,
                "batch_size: must be in 1..4096, got 5000"},
        BadFile{"bad_syntax.yaml", absl::StatusCode::kInvalidArgument, "bad_syntax.yaml:"},
        BadFile{"bad_name.yaml", absl::StatusCode::kInvalidArgument,
                "name: must match [a-z0-9][a-z0-9-]{0,62}, got \"Bad_Name\""},
        BadFile{"bad_model.yaml", absl::StatusCode::kInvalidArgument,
                "model: unknown model \"resnet\" (expected cnn, dp-cnn, mlp, scatter-cnn, "
                "scatter-linear, wide-mlp, or {torchscript: FILE})"},
        BadFile{"bad_nested_type.yaml", absl::StatusCode::kInvalidArgument,
                "optimizer: expected a mapping"},
        BadFile{"does_not_exist.yaml", absl::StatusCode::kNotFound, "cannot open"}),
    [](const ::testing::TestParamInfo<BadFile>& info) {
      std::string name = info.param.file;
      for (char& c : name) {
        if (!isalnum(static_cast<unsigned char>(c))) c = '_';
      }
      return name;
    });

TEST(ParseTaskSpecTest, RejectsInlineMistakes) {
  struct Case {
    std::string text;
    std::string message;
  };
  const Case cases[] = {
      {"name: x\nmode: async\n",
       "mode: unknown value \"async\" (expected federated-sync, decentralized, gossip, "
       "federated-async)"},
      {"name: x\naggregation: bulyan\n",
       "aggregation: unknown value \"bulyan\" (expected mean, median, trimmed-mean, krum, "
       "multi-krum, centered-clipping)"},
      {"name: x\naggregation_options: {trim: 0.1}\n",
       "aggregation_options.trim: unknown field (expected one of trim_ratio, byzantine_peers, "
       "multi_krum_selected, clip_radius, clip_iterations, exact_sum)"},
      {"name: x\nasync: {staleness: linear}\n",
       "async.staleness: unknown value \"linear\" (expected constant, polynomial, hinge)"},
      {"name: x\noptimizer: {kind: rmsprop}\n",
       "optimizer.kind: unknown value \"rmsprop\" (expected sgd, adam)"},
      {"name: x\nmode: unspecified\n", "mode: unknown value \"unspecified\""},
      {"name: x\nseed: 1.5\n", "seed: expected a non-negative integer, got \"1.5\""},
      {"name: x\noptimizer: {learning_rate: fast}\n",
       "optimizer.learning_rate: expected a number, got \"fast\""},
      {"name: x\noptimizer: {learning_rate: inf}\n", "optimizer.learning_rate: must be finite"},
      {"name: x\nrounds: [1, 2]\n", "rounds: expected a single value"},
      {"name: x\nrounds: 1\nrounds: 2\n", "rounds: duplicate key"},
      {"- name: x\n", "expected a mapping of task fields at the top level"},
      {"", "the task file is empty"},
      {"name: x\nmin_participants: 4294967296\n", "min_participants: out of range"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<TaskSpec> spec = ParseTaskSpec(c.text, "inline.yaml");
    ASSERT_FALSE(spec.ok()) << c.text;
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(spec.status().message()),
                AllOf(HasSubstr("inline.yaml: "), HasSubstr(c.message)))
        << c.text;
  }
}

TEST(ParseTaskSpecTest, AcceptsEnumSpellings) {
  for (const char* text : {"label-skew", "label_skew", "LABEL-SKEW", "PARTITION_LABEL_SKEW"}) {
    absl::StatusOr<TaskSpec> spec =
        ParseTaskSpec(std::string("name: x\ndataset: {partition: ") + text + "}\n", "t.yaml");
    ASSERT_TRUE(spec.ok()) << text << ": " << spec.status();
    EXPECT_EQ(spec->dataset().partition(), common::v1::PARTITION_LABEL_SKEW);
    EXPECT_EQ(spec->dataset().classes_per_shard(), 2u) << "label-skew default";
  }
}

TEST(ParseTaskSpecTest, DirichletTakesAlphaAndASeedOfItsOwn) {
  absl::StatusOr<TaskSpec> spec =
      ParseTaskSpec("name: x\ndataset: {partition: dirichlet}\n", "t.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->dataset().partition(), common::v1::PARTITION_DIRICHLET);
  EXPECT_DOUBLE_EQ(spec->dataset().alpha(), 0.5) << "dirichlet default";
  EXPECT_FALSE(spec->dataset().has_seed());
  spec = ParseTaskSpec("name: x\ndataset: {partition: dirichlet, alpha: 0.1, seed: 0}\n", "t.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_DOUBLE_EQ(spec->dataset().alpha(), 0.1);
  EXPECT_TRUE(spec->dataset().has_seed());  // 0 is a seed like any other
  EXPECT_TRUE(ValidateTaskSpec(*spec).ok());
}

TEST(ParseTaskSpecTest, NullKeepsDefault) {
  absl::StatusOr<TaskSpec> spec = ParseTaskSpec("name: x\nrounds:\nbatch_size: null\n", "t.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->rounds(), 10u);
  EXPECT_EQ(spec->batch_size(), 32u);
}

TEST(ParseTaskSpecTest, ValidationErrorsFromLoadNameTheFile) {
  absl::StatusOr<TaskSpec> spec = ParseTaskSpec("name: x\nbatch_size: 0\n", "t.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  // Explicit zeros are kept for validation to report, not silently defaulted.
  EXPECT_EQ(spec->batch_size(), 0u);
  EXPECT_THAT(std::string(ValidateTaskSpec(*spec).message()), HasSubstr("batch_size: must be in"));
}

TEST(ValidateTaskSpecTest, DefaultsWithANameAreValid) {
  EXPECT_TRUE(ValidateTaskSpec(ValidSpec()).ok()) << ValidateTaskSpec(ValidSpec());
}

TEST(ValidateTaskSpecTest, EachRuleNamesItsField) {
  struct Case {
    std::function<void(TaskSpec&)> mutate;
    std::string message;
  };
  const std::vector<Case> cases = {
      {[](TaskSpec& s) { s.set_name(""); }, "name: required"},
      {[](TaskSpec& s) { s.set_name("-lead"); }, "name: must match"},
      {[](TaskSpec& s) { s.set_name(std::string(64, 'a')); }, "name: must match"},
      {[](TaskSpec& s) { s.set_mode(common::v1::MODE_UNSPECIFIED); }, "mode: unsupported value"},
      {[](TaskSpec& s) { s.set_model("transformer"); }, "model: unknown model \"transformer\""},
      {[](TaskSpec& s) { s.mutable_dataset()->set_name("mnist"); },
       "dataset.name: unknown dataset \"mnist\" (expected fashion-mnist, or a format: idx, "
       "csv, image-folder)"},
      {[](TaskSpec& s) { s.mutable_dataset()->set_partition(common::v1::PARTITION_UNSPECIFIED); },
       "dataset.partition: unsupported value"},
      {[](TaskSpec& s) {
         s.mutable_dataset()->set_partition(common::v1::PARTITION_LABEL_SKEW);
         s.mutable_dataset()->set_classes_per_shard(11);
       },
       "dataset.classes_per_shard: must be in 1..10 for label-skew, got 11"},
      {[](TaskSpec& s) {
         s.mutable_dataset()->set_partition(common::v1::PARTITION_LABEL_SKEW);
         s.mutable_dataset()->set_classes_per_shard(0);
       },
       "dataset.classes_per_shard: must be in 1..10"},
      {[](TaskSpec& s) { s.set_model_width(1000); }, "model_width: used only by model wide-mlp"},
      {[](TaskSpec& s) {
         s.set_model("wide-mlp");
         s.set_model_width(20000);
       },
       "model_width: must be in 16..16384, got 20000"},
      {[](TaskSpec& s) { s.mutable_dataset()->set_alpha(0.3); },
       "dataset.alpha: used only by partition dirichlet"},
      {[](TaskSpec& s) {
         s.mutable_dataset()->set_partition(common::v1::PARTITION_DIRICHLET);
         s.mutable_dataset()->set_alpha(-1);
       },
       "dataset.alpha: must be > 0 and finite for dirichlet, got -1"},
      {[](TaskSpec& s) { s.set_batch_size(0); }, "batch_size: must be in 1..4096, got 0"},
      {[](TaskSpec& s) { s.set_batch_size(4097); }, "batch_size: must be in 1..4096, got 4097"},
      {[](TaskSpec& s) { s.mutable_optimizer()->set_kind(common::v1::OPTIMIZER_UNSPECIFIED); },
       "optimizer.kind: unsupported value"},
      {[](TaskSpec& s) { s.mutable_optimizer()->set_learning_rate(0); },
       "optimizer.learning_rate: must be > 0, got 0"},
      {[](TaskSpec& s) { s.mutable_optimizer()->set_learning_rate(-0.1); },
       "optimizer.learning_rate: must be > 0, got -0.1"},
      {[](TaskSpec& s) { s.mutable_optimizer()->set_momentum(1.0); },
       "optimizer.momentum: must be in [0, 1), got 1"},
      {[](TaskSpec& s) { s.mutable_optimizer()->set_momentum(-0.5); },
       "optimizer.momentum: must be in [0, 1)"},
      {[](TaskSpec& s) { s.set_round_batches(0); }, "round_batches: must be >= 1, got 0"},
      {[](TaskSpec& s) { s.set_rounds(0); }, "rounds: must be >= 1, got 0"},
      {[](TaskSpec& s) { s.mutable_gossip()->set_fetch_probability(0.5); },
       "gossip: settings for mode gossip, but this task's mode is federated-sync"},
      {[](TaskSpec& s) { s.mutable_async()->set_buffer_size(2); },
       "async: settings for mode federated-async, but this task's mode is federated-sync (remove "
       "the section or set mode: federated-async)"},
      {[](TaskSpec& s) {
         s.set_mode(common::v1::MODE_DECENTRALIZED);
         s.mutable_async();
       },
       "async: settings for mode federated-async, but this task's mode is decentralized"},
      {[](TaskSpec& s) { s.set_min_participants(0); }, "min_participants: must be >= 1, got 0"},
      {[](TaskSpec& s) {
         s.set_min_participants(3);
         s.set_max_participants(2);
       },
       "max_participants: must be 0 (no limit) or >= min_participants (3), got 2"},
      {[](TaskSpec& s) { s.set_round_deadline_seconds(0); },
       "round_deadline_seconds: must be >= 1, got 0"},
      {[](TaskSpec& s) { s.set_aggregation(common::v1::AGGREGATION_UNSPECIFIED); },
       "aggregation: unsupported value"},
      {[](TaskSpec& s) { s.set_max_update_norm(-1); }, "max_update_norm: must be >= 0"},
      {[](TaskSpec& s) { s.set_max_update_norm(std::nan("")); }, "max_update_norm: must be >= 0"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    TaskSpec spec = ValidSpec();
    cases[i].mutate(spec);
    absl::Status status = ValidateTaskSpec(spec);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << "case " << i;
    EXPECT_THAT(std::string(status.message()), HasSubstr(cases[i].message)) << "case " << i;
  }
}

TEST(ValidateTaskSpecTest, AcceptsBoundaryValues) {
  TaskSpec spec = ValidSpec();
  spec.set_name(std::string(63, 'a'));
  spec.set_batch_size(4096);
  spec.mutable_optimizer()->set_momentum(0);
  spec.set_min_participants(2);
  spec.set_max_participants(2);
  spec.mutable_dataset()->set_partition(common::v1::PARTITION_LABEL_SKEW);
  spec.mutable_dataset()->set_classes_per_shard(10);
  EXPECT_TRUE(ValidateTaskSpec(spec).ok()) << ValidateTaskSpec(spec);
}

TEST(ApplyTaskDefaultsTest, FillsOnlyInvalidZeros) {
  TaskSpec spec;
  spec.set_name("x");
  spec.mutable_optimizer()->set_momentum(0);
  ApplyTaskDefaults(spec);
  EXPECT_TRUE(ValidateTaskSpec(spec).ok()) << ValidateTaskSpec(spec);
  EXPECT_EQ(spec.batch_size(), 32u);
  EXPECT_EQ(spec.mode(), common::v1::MODE_FEDERATED_SYNC);
  EXPECT_DOUBLE_EQ(spec.optimizer().momentum(), 0.0);
  EXPECT_EQ(spec.max_participants(), 0u);
}

TEST(FriendlyJsonTest, RoundTripsThroughTheParser) {
  absl::StatusOr<TaskSpec> spec = LoadTaskFile(DataPath("good.yaml"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  const std::string json = MessageToFriendlyJson(*spec, 2);
  EXPECT_THAT(json, HasSubstr("\"partition\": \"label-skew\""));
  EXPECT_THAT(json, HasSubstr("\"mode\": \"federated-sync\""));
  absl::StatusOr<TaskSpec> back = ParseTaskSpec(json, "back.json");
  ASSERT_TRUE(back.ok()) << back.status() << "\n" << json;
  EXPECT_EQ(back->SerializeAsString(), spec->SerializeAsString());
}

TEST(ModeDefaultsTest, DecentralizedGetsConnectionRetriesUnlessSet) {
  absl::StatusOr<TaskSpec> spec = ParseTaskSpec("name: d\nmode: decentralized\n", "d.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->mode(), common::v1::MODE_DECENTRALIZED);
  ASSERT_TRUE(spec->has_max_connection_retry());
  EXPECT_EQ(spec->max_connection_retry(), 3u);
  EXPECT_TRUE(ValidateTaskSpec(*spec).ok());

  spec = ParseTaskSpec("name: d\nmode: decentralized\nmax_connection_retry: 0\n", "d.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->max_connection_retry(), 0u);  // an explicit 0: fail on the first failure

  spec = ParseTaskSpec("name: d\nmode: decentralized\nmax_connection_retry: 101\n", "d.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_THAT(std::string(ValidateTaskSpec(*spec).message()),
              HasSubstr("max_connection_retry: must be in 0..100, got 101"));

  // Federated tasks do not carry the decentralized setting, and JSON shows it as null.
  spec = ParseTaskSpec("name: f\n", "f.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_FALSE(spec->has_max_connection_retry());
  const std::string json = MessageToFriendlyJson(*spec, 0);
  EXPECT_THAT(json, HasSubstr("\"max_connection_retry\":null"));
  absl::StatusOr<TaskSpec> back = ParseTaskSpec(json, "back.json");
  ASSERT_TRUE(back.ok()) << back.status() << "\n" << json;
  EXPECT_EQ(back->SerializeAsString(), spec->SerializeAsString());
}

// Parses and validates `text`; the status of whichever fails first.
TEST(AsyncTaskTest, LoadsAFederatedAsyncTask) {
  absl::StatusOr<TaskSpec> spec = LoadTaskFile(DataPath("federated-async.yaml"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->mode(), common::v1::MODE_FEDERATED_ASYNC);
  EXPECT_EQ(spec->rounds(), 40u);
  EXPECT_EQ(spec->aggregation(), common::v1::AGGREGATION_TRIMMED_MEAN);
  EXPECT_DOUBLE_EQ(spec->aggregation_options().trim_ratio(), 0.2);
  EXPECT_EQ(spec->async().buffer_size(), 3u);
  EXPECT_EQ(spec->async().max_staleness(), 6u);
  EXPECT_EQ(spec->async().staleness(), common::v1::STALENESS_WEIGHTING_HINGE);
  EXPECT_DOUBLE_EQ(spec->async().staleness_a(), 5);
  EXPECT_EQ(spec->async().staleness_b(), 2u);
  const std::string json = MessageToFriendlyJson(*spec, 2);
  EXPECT_THAT(json, HasSubstr("\"mode\": \"federated-async\""));
  EXPECT_THAT(json, HasSubstr("\"staleness\": \"hinge\""));
  EXPECT_THAT(json, HasSubstr("\"gossip\": null"));
  ExpectJsonRoundTrip(*spec);
}

TEST(AsyncTaskTest, DefaultsForTheModeOnly) {
  absl::StatusOr<TaskSpec> spec =
      ParseAndValidate("name: a\nmode: federated-async\nmin_participants: 3\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_TRUE(spec->has_async());
  EXPECT_EQ(spec->async().buffer_size(), 3u);  // min_participants
  EXPECT_EQ(spec->async().max_staleness(), 4u);
  EXPECT_EQ(spec->async().staleness(), common::v1::STALENESS_WEIGHTING_POLYNOMIAL);
  EXPECT_DOUBLE_EQ(spec->async().staleness_a(), 1);
  EXPECT_FALSE(spec->async().has_staleness_b());
  ExpectJsonRoundTrip(*spec);

  // An explicit 0 staleness bound is kept (only fresh pushes count).
  spec = ParseAndValidate("name: a\nmode: federated-async\nasync: {max_staleness: 0}\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->async().max_staleness(), 0u);

  // Other modes carry no async section, and JSON shows it as null.
  spec = ParseAndValidate("name: f\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_FALSE(spec->has_async());
  EXPECT_THAT(MessageToFriendlyJson(*spec, 0), HasSubstr("\"async\":null"));

  TaskSpec bare;
  bare.set_name("x");
  bare.set_mode(common::v1::MODE_FEDERATED_ASYNC);
  bare.set_min_participants(2);
  ApplyTaskDefaults(bare);
  EXPECT_EQ(bare.async().buffer_size(), 2u);
  EXPECT_TRUE(ValidateTaskSpec(bare).ok()) << ValidateTaskSpec(bare);
}

TEST(AsyncTaskTest, RulesNameTheField) {
  const std::pair<std::string, std::string> cases[] = {
      {"async: {buffer_size: 0}\n", "async.buffer_size: must be >= 1, got 0"},
      {"max_participants: 2\nasync: {buffer_size: 3}\n",
       "async.buffer_size: must be at most max_participants (2)"},
      {"async: {staleness: constant, staleness_a: 1}\n",
       "async.staleness_a: used only by staleness polynomial or hinge"},
      {"async: {staleness_b: 1}\n", "async.staleness_b: used only by staleness hinge"},
      {"async: {staleness: hinge, staleness_a: -2}\n", "async.staleness_a: must be >= 0"},
      {"async: {max_staleness: -1}\n", "async.max_staleness: must not be negative, got -1"},
  };
  for (const auto& [text, message] : cases) {
    absl::StatusOr<TaskSpec> spec = ParseAndValidate("name: x\nmode: federated-async\n" + text);
    ASSERT_FALSE(spec.ok()) << text;
    EXPECT_THAT(std::string(spec.status().message()), HasSubstr(message)) << text;
  }
}

TEST(FriendlyJsonTest, EdgeCasesOfTheNewSectionsRoundTrip) {
  // Specs that parse but fail validation must still render and parse back (fuzz contract).
  for (const char* text : {
           "name: x\naggregation_options: {}\n",
           "name: x\nasync: {}\n",
           "name: x\nmode: gossip\nasync: {buffer_size: 2}\n",
           "name: x\nmode: federated-async\nasync: {staleness: constant}\n",
           "name: x\nmode: federated-async\naggregation: median\nasync: {staleness: hinge}\n",
           "name: x\naggregation: krum\naggregation_options: {trim_ratio: 0.3}\n",
       }) {
    absl::StatusOr<TaskSpec> spec = ParseTaskSpec(text, "t.yaml");
    ASSERT_TRUE(spec.ok()) << text << ": " << spec.status();
    ExpectJsonRoundTrip(*spec);
  }
}

TEST(FriendlyEnumNameTest, StripsThePrefix) {
  EXPECT_EQ(FriendlyEnumName(*coordinator::v1::TaskState_descriptor(),
                             coordinator::v1::TASK_STATE_RUNNING),
            "running");
  EXPECT_EQ(FriendlyEnumName(*coordinator::v1::RoundPhase_descriptor(),
                             coordinator::v1::ROUND_PHASE_TRAINING),
            "training");
  EXPECT_EQ(FriendlyEnumName(*common::v1::Mode_descriptor(), common::v1::MODE_FEDERATED_SYNC),
            "federated-sync");
  EXPECT_EQ(FriendlyEnumName(*common::v1::Mode_descriptor(), 77), "unknown(77)");
}

TEST(JsonTest, QuotesAndNumbers) {
  EXPECT_EQ(JsonQuote("a\"b\\c\n\x01"), "\"a\\\"b\\\\c\\n\\u0001\"");
  EXPECT_EQ(JsonNumber(0.1), "0.1");
  EXPECT_EQ(JsonNumber(3), "3");
  EXPECT_EQ(JsonNumber(std::nan("")), "null");
}

}  // namespace
}  // namespace shoal::task
