// Task files: the model section (built-in models, TorchScript files and their digests, the
// loss), the dataset section (Fashion-MNIST or each peer's own files), the aggregation section,
// and the shipped examples.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "libs/common/file_digest.h"
#include "libs/task/task_dataset.h"
#include "libs/task/task_file.h"
#include "tests/unit/task_test_util.h"

namespace shoal::task {
namespace {

using common::v1::TaskSpec;
using ::testing::AllOf;
using ::testing::HasSubstr;

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Parses and validates `yaml` (a task named t plus the given lines).
absl::StatusOr<TaskSpec> Parse(const std::string& yaml) {
  return ParseAndValidate(absl::StrCat("name: t\n", yaml));
}

class TempDir : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           absl::StrCat("shoal-task-", ::getpid(), "-",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path) << text;
    return path;
  }
  std::filesystem::path dir_;
};

// Every example task the repository ships (deploy/tasks, the Kubernetes tasks) is valid.
TEST(TaskFileTest, ShippedExamplesAreValid) {
  const char* root = std::getenv("SHOAL_SOURCE_DIR");
  const std::string source = root != nullptr ? root : ".";
  int files = 0;
  int torchscript = 0;
  for (const char* dir : {"/deploy/tasks", "/deploy/k8s/tasks"}) {
    for (const auto& entry : std::filesystem::directory_iterator(source + dir)) {
      if (entry.path().extension() != ".yaml") continue;
      absl::StatusOr<TaskSpec> spec = LoadTaskFile(entry.path().string());
      if (!spec.ok() && spec.status().code() == absl::StatusCode::kNotFound &&
          absl::StrContains(spec.status().message(), "model.torchscript")) {
        // A TorchScript example names a file deploy/models/export.py writes: check the rest.
        spec = ParseTaskSpec(ReadAll(entry.path().string()), entry.path().string());
        ASSERT_TRUE(spec.ok()) << spec.status();
        spec->mutable_torchscript()->set_sha256(std::string(64, '0'));
        EXPECT_TRUE(ValidateTaskSpec(*spec).ok())
            << entry.path() << ": " << ValidateTaskSpec(*spec);
        ++torchscript;
        ++files;
        continue;
      }
      EXPECT_TRUE(spec.ok()) << entry.path() << ": " << spec.status();
      if (spec.ok() && spec->model() == "torchscript") ++torchscript;
      ++files;
    }
  }
  EXPECT_GE(files, 9);
  EXPECT_GE(torchscript, 1);
}

// A ```yaml block of the documentation, where it is and what it says.
struct DocBlock {
  std::string where;  // docs/reference/task-file.md:36
  std::string text;
  bool parse_only;  // marked <!-- parse-only -->: a listing of fields, not one valid task
};

// Every ```yaml block of README.md and docs/**/*.md but those marked <!-- not-a-task --> (the
// marker on the line before the fence; docs/how-to/testing.md).
std::vector<DocBlock> DocumentedYamlBlocks(const std::string& source) {
  std::vector<std::string> pages = {source + "/README.md"};
  for (const auto& entry : std::filesystem::recursive_directory_iterator(source + "/docs")) {
    if (entry.path().extension() == ".md") pages.push_back(entry.path().string());
  }
  std::sort(pages.begin(), pages.end());
  std::vector<DocBlock> blocks;
  for (const std::string& page : pages) {
    std::istringstream in(ReadAll(page));
    const std::string shown = page.substr(source.size() + 1);
    std::string line;
    std::string previous;
    int number = 0;
    while (std::getline(in, line)) {
      ++number;
      const std::string trimmed(absl::StripLeadingAsciiWhitespace(line));
      if (!absl::StartsWith(trimmed, "```")) {
        previous = trimmed;
        continue;
      }
      const std::string info(absl::StripAsciiWhitespace(trimmed.substr(3)));
      DocBlock block{absl::StrCat(shown, ":", number), "", previous == "<!-- parse-only -->"};
      const bool skip = previous == "<!-- not-a-task -->";
      while (std::getline(in, line)) {  // the block, up to its closing fence
        ++number;
        if (absl::StartsWith(absl::StripLeadingAsciiWhitespace(line), "```")) break;
        absl::StrAppend(&block.text, line, "\n");
      }
      previous.clear();
      if (info == "yaml" && !skip) blocks.push_back(block);
    }
  }
  return blocks;
}

// Every task file and task-file fragment the documentation shows parses, and validates as a
// task (a fragment with a name added), so that no page shows a key, value or combination that
// the parser refuses (deploy/tasks are checked by ShippedExamplesAreValid).
TEST(TaskFileTest, DocumentedExamplesAreValid) {
  const char* root = std::getenv("SHOAL_SOURCE_DIR");
  const std::string source = root != nullptr ? root : ".";
  const std::vector<DocBlock> blocks = DocumentedYamlBlocks(source);
  EXPECT_GE(blocks.size(), 10u) << "found too few ```yaml blocks under " << source << "/docs";
  for (const DocBlock& block : blocks) {
    std::string text = block.text;
    if (!absl::StartsWith(text, "name:") && !absl::StrContains(text, "\nname:")) {
      text = "name: doc-example\n" + text;
    }
    absl::StatusOr<TaskSpec> spec = ParseTaskSpec(text, block.where);
    if (!spec.ok()) {
      ADD_FAILURE() << spec.status() << "\n" << block.text;
      continue;
    }
    if (block.parse_only) continue;
    // A TorchScript model names the reader's file: give it a digest, as LoadTaskFile would.
    if (spec->model() == "torchscript" && spec->torchscript().sha256().empty()) {
      spec->mutable_torchscript()->set_sha256(std::string(64, '0'));
    }
    const absl::Status valid = ValidateTaskSpec(*spec);
    EXPECT_TRUE(valid.ok()) << block.where << ": " << valid << "\n" << block.text;
  }
}

using TorchScriptTaskTest = TempDir;

TEST_F(TorchScriptTaskTest, TheFileIsFoundBesideTheTaskFileAndIdentifiedByItsDigest) {
  Write("model.pt", "pretend TorchScript bytes");
  const std::string task =
      Write("task.yaml", "name: ts\nmodel: {torchscript: model.pt}\nloss: mse\n");
  absl::StatusOr<TaskSpec> spec = LoadTaskFile(task);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->model(), "torchscript");
  EXPECT_EQ(spec->torchscript().file(), "model.pt");
  EXPECT_EQ(spec->torchscript().sha256(), *Sha256File((dir_ / "model.pt").string()));
  EXPECT_EQ(spec->loss(), common::v1::LOSS_MSE);
  // What the coordinator shows parses back to the same task.
  ExpectJsonRoundTrip(*spec);
}

TEST_F(TorchScriptTaskTest, MissingFileOrAnotherDigestIsRefusedNamingThem) {
  const std::string missing = Write("a.yaml", "name: ts\nmodel: {torchscript: gone.pt}\n");
  absl::StatusOr<TaskSpec> spec = LoadTaskFile(missing);
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(spec.status().message(), AllOf(HasSubstr("a.yaml"), HasSubstr("gone.pt")));

  // With the digest written in the task, a machine without the file may still create it.
  const std::string digest(64, 'a');
  const std::string named = Write(
      "b.yaml", absl::StrCat("name: ts\nmodel: torchscript\ntorchscript: {file: gone.pt, sha256: ",
                             digest, "}\n"));
  spec = LoadTaskFile(named);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->torchscript().sha256(), digest);

  Write("gone.pt", "other bytes");
  spec = LoadTaskFile(named);
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(spec.status().message(),
              AllOf(HasSubstr(digest), HasSubstr(*Sha256File((dir_ / "gone.pt").string()))));
}

TEST(TorchScriptTaskRulesTest, EachRuleNamesItsField) {
  const std::string sha = std::string(64, '0');
  struct Case {
    std::string yaml;
    std::string want;
  };
  const Case cases[] = {
      {"model: {onnx: m.onnx}", "model: expected a model name"},
      {"model: {torchscript: a.pt, extra: 1}", "model: expected a model name"},
      {"model: resnet", "model: unknown model \"resnet\""},
      {"model: torchscript", "torchscript.file: required"},
      {"model: torchscript\ntorchscript: {file: a.pt}", "torchscript.sha256: required"},
      {"model: torchscript\ntorchscript: {file: a.pt, sha256: ABC}", "64 lower-case hex"},
      {"model: cnn\ntorchscript: {file: a.pt, sha256: " + sha + "}", "torchscript: used only"},
      {"model: {torchscript: a.pt}\ntorchscript: {file: b.pt}", "given twice"},
      {"loss: hinge", "loss: unknown value \"hinge\""},
  };
  for (const Case& c : cases) {
    absl::StatusOr<TaskSpec> spec = Parse(c.yaml);
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << c.yaml;
    EXPECT_THAT(spec.status().message(), HasSubstr(c.want)) << c.yaml;
  }
  absl::StatusOr<TaskSpec> ok =
      Parse("model: torchscript\ntorchscript: {file: a.pt, sha256: " + sha + "}\nloss: bce");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->loss(), common::v1::LOSS_BCE);
  EXPECT_EQ(Parse("model: mlp")->loss(), common::v1::LOSS_CROSS_ENTROPY);  // the default
}

TEST(DatasetTaskTest, OwnFilesGetTheirDefaults) {
  absl::StatusOr<TaskSpec> csv = Parse(
      "dataset: {format: csv, train: train.csv, label_column: condition, classes: [a, b, c]}");
  ASSERT_TRUE(csv.ok()) << csv.status();
  EXPECT_EQ(csv->dataset().format(), common::v1::DATA_FORMAT_CSV);
  EXPECT_EQ(csv->dataset().name(), "");  // not the Fashion-MNIST default
  EXPECT_EQ(csv->dataset().normalization(), common::v1::NORMALIZATION_STANDARDIZE);
  EXPECT_TRUE(UsesFederationStatistics(csv->dataset()));  // the federation's statistics
  EXPECT_DOUBLE_EQ(csv->dataset().test_fraction(), 0.2);
  const std::string table = "dataset: {format: csv, train: t.csv, label_column: y, num_classes: 2";
  absl::StatusOr<TaskSpec> local = Parse(table + ", normalization: standardize-local}");
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_EQ(local->dataset().normalization(), common::v1::NORMALIZATION_STANDARDIZE_LOCAL);
  EXPECT_FALSE(UsesFederationStatistics(local->dataset()));
  EXPECT_FALSE(UsesFederationStatistics(Parse(table + ", mean: [0], std: [1]}")->dataset()));
  EXPECT_FALSE(UsesFederationStatistics(Parse("model: mlp")->dataset()));  // Fashion-MNIST

  absl::StatusOr<TaskSpec> images = Parse(
      "dataset: {format: image-folder, name: leaves, train: train, test: test, classes: [x, y],"
      " image_size: [32], channels: 3, mean: [0.5, 0.5, 0.5], std: [0.25, 0.25, 0.25]}");
  ASSERT_TRUE(images.ok()) << images.status();
  EXPECT_DOUBLE_EQ(images->dataset().test_fraction(), 0);  // a test directory is given
  // Image folders keep no normalization by default (pixels in [0, 1], or the task's mean/std);
  // the federation's statistics are opt-in.
  EXPECT_EQ(images->dataset().normalization(), common::v1::NORMALIZATION_UNSPECIFIED);
  EXPECT_FALSE(UsesFederationStatistics(images->dataset()));
  const std::string folder =
      "dataset: {format: image-folder, train: t, classes: [x, y], "
      "image_size: 8, channels: 1, normalization: ";
  EXPECT_TRUE(UsesFederationStatistics(Parse(folder + "standardize}")->dataset()));
  EXPECT_FALSE(UsesFederationStatistics(Parse(folder + "standardize-local}")->dataset()));

  absl::StatusOr<TaskSpec> idx = Parse(
      "dataset: {format: idx, train: a.gz, train_labels: b.gz, num_classes: 10,"
      " partition: label-skew, classes_per_shard: 10}");
  ASSERT_TRUE(idx.ok()) << idx.status();
  EXPECT_EQ(Parse("dataset: {name: fashion-mnist}")->dataset().format(),
            common::v1::DATA_FORMAT_FASHION_MNIST);
}

// `image_size` is [height, width], or one value for a square: `[8]`, or a bare `8`, which
// reads as [8, 8].
TEST(DatasetTaskTest, OneImageSizeIsASquare) {
  const std::string folder =
      "dataset: {format: image-folder, train: d, classes: [a, b], channels: 1, image_size: ";
  absl::StatusOr<TaskSpec> bare = Parse(folder + "8}");
  ASSERT_TRUE(bare.ok()) << bare.status();
  EXPECT_THAT(bare->dataset().image_size(), ::testing::ElementsAre(8u, 8u));
  ExpectJsonRoundTrip(*bare);

  absl::StatusOr<TaskSpec> block = Parse(
      "dataset:\n  format: image-folder\n  train: d\n  classes: [a, b]\n  channels: 3\n"
      "  image_size: 32\n");
  ASSERT_TRUE(block.ok()) << block.status();
  EXPECT_THAT(block->dataset().image_size(), ::testing::ElementsAre(32u, 32u));

  EXPECT_THAT(Parse(folder + "[8]}")->dataset().image_size(), ::testing::ElementsAre(8u));
  EXPECT_THAT(Parse(folder + "[8, 6]}")->dataset().image_size(), ::testing::ElementsAre(8u, 6u));

  // A bare value obeys the rules of each side, and names the field as written.
  EXPECT_THAT(Parse(folder + "0}").status().message(),
              HasSubstr("dataset.image_size: each side must be in 1..4096, got 0"));
  EXPECT_THAT(Parse(folder + "5000}").status().message(), HasSubstr("got 5000"));
  EXPECT_THAT(Parse(folder + "-8}").status().message(),
              HasSubstr("dataset.image_size: must not be negative"));
  EXPECT_THAT(Parse(folder + "big}").status().message(),
              HasSubstr("dataset.image_size: expected a non-negative integer, got \"big\""));
  EXPECT_THAT(Parse(folder + "{h: 8}}").status().message(),
              HasSubstr("dataset.image_size: expected a list"));
  // Other lists take no bare value: one class or one mean is not a shorthand for anything.
  EXPECT_THAT(
      Parse("dataset: {format: csv, train: t.csv, label_column: y, classes: a}").status().message(),
      HasSubstr("dataset.classes: expected a list"));
}

TEST(DatasetTaskTest, EachRuleNamesItsField) {
  struct Case {
    std::string dataset;
    std::string want;
  };
  const Case cases[] = {
      {"{train: x.csv}", "dataset.train: used only by formats"},
      {"{label_column: y}", "dataset.label_column: used only by format csv"},
      {"{name: cifar}", "dataset.name: unknown dataset"},
      {"{format: parquet}", "dataset.format: unknown value"},
      {"{format: csv, label_column: y, num_classes: 2}", "dataset.train: required"},
      {"{format: csv, train: t.csv, num_classes: 2}", "dataset.label_column: required"},
      {"{format: csv, train: t.csv, label_column: y}", "dataset.num_classes: required"},
      {"{format: csv, train: t.csv, label_column: y, classes: [a, a]}", "names \"a\" twice"},
      {"{format: csv, train: t.csv, label_column: y, classes: [a, b], num_classes: 3}",
       "dataset.num_classes: is 3"},
      {"{format: csv, train: t.csv, test: s.csv, test_fraction: 0.5, label_column: y, "
       "num_classes: 2}",
       "dataset.test_fraction: used only without"},
      {"{format: csv, train: t.csv, test_fraction: 0.95, label_column: y, num_classes: 2}",
       "dataset.test_fraction: must be in (0, 0.9]"},
      {"{format: csv, train: t.csv, label_column: y, num_classes: 2, mean: [1]}",
       "dataset.std: gives 0 values"},
      {"{format: csv, train: t.csv, label_column: y, num_classes: 2, normalization: none, "
       "mean: [1], std: [1]}",
       "used only with normalization standardize"},
      {"{format: csv, train: t.csv, label_column: y, num_classes: 2, "
       "normalization: standardize-local, mean: [1], std: [1]}",
       "standardize-local scales with each peer's own statistics"},
      {"{format: csv, train: t.csv, label_column: y, num_classes: 2, mean: [0], std: [0]}",
       "dataset.std[0]"},
      {"{format: csv, train: t.csv, label_column: y, num_classes: 2, channels: 1}",
       "dataset.channels: used only by format image-folder"},
      {"{format: idx, train: a, num_classes: 2}", "dataset.train_labels: required"},
      {"{format: idx, train: a, train_labels: b, test: c, num_classes: 2}",
       "dataset.test_labels: give both"},
      {"{format: image-folder, train: d, image_size: [28], channels: 1}",
       "dataset.classes: required"},
      {"{format: image-folder, train: d, classes: [a, b], channels: 1}",
       "dataset.image_size: required"},
      {"{format: image-folder, train: d, classes: [a, b], image_size: [0, 5], channels: 1}",
       "each side must be in 1..4096"},
      {"{format: image-folder, train: d, classes: [a, b], image_size: [8], channels: 4}",
       "dataset.channels: must be 1"},
      {"{format: image-folder, train: d, classes: [a, b], image_size: [8], channels: 3, "
       "mean: [0.5], std: [0.2]}",
       "one value per channel (3)"},
      {"{format: image-folder, train: d, classes: [a, b], image_size: 8, channels: 1, "
       "normalization: none, mean: [0.5], std: [0.2]}",
       "dataset.mean: used only with normalization standardize or without normalization"},
      {"{format: image-folder, train: d, classes: [a, b], image_size: 8, channels: 1, "
       "normalization: standardize-local, mean: [0.5], std: [0.2]}",
       "dataset.mean: used only with normalization standardize (standardize-local"},
      {"{format: idx, train: a, train_labels: b, num_classes: 2, normalization: standardize}",
       "dataset.normalization: used only by formats csv and image-folder"},
      {"{format: csv, train: t.csv, label_column: y, classes: [a, b, c], partition: label-skew, "
       "classes_per_shard: 4}",
       "dataset.classes_per_shard: must be in 1..3"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<TaskSpec> spec = Parse("dataset: " + c.dataset);
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << c.dataset;
    EXPECT_THAT(spec.status().message(), HasSubstr(c.want)) << c.dataset;
  }
}

TEST(AggregationTaskTest, LoadsARobustStrategyWithItsOptions) {
  absl::StatusOr<TaskSpec> spec = LoadTaskFile(DataPath("robust.yaml"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->aggregation(), common::v1::AGGREGATION_MULTI_KRUM);
  EXPECT_EQ(spec->aggregation_options().byzantine_peers(), 1u);
  EXPECT_EQ(spec->aggregation_options().multi_krum_selected(), 3u);
  EXPECT_FALSE(spec->aggregation_options().has_trim_ratio());
  const std::string json = MessageToFriendlyJson(*spec, 0);
  EXPECT_THAT(json, HasSubstr("\"aggregation\":\"multi-krum\""));
  EXPECT_THAT(json, HasSubstr("\"byzantine_peers\":1"));
  EXPECT_THAT(json, HasSubstr("\"trim_ratio\":null"));
  ExpectJsonRoundTrip(*spec);
}

TEST(AggregationTaskTest, EveryStrategyHasItsFriendlyName) {
  const std::pair<const char*, common::v1::Aggregation> names[] = {
      {"mean", common::v1::AGGREGATION_MEAN},
      {"median", common::v1::AGGREGATION_MEDIAN},
      {"trimmed-mean", common::v1::AGGREGATION_TRIMMED_MEAN},
      {"trimmed_mean", common::v1::AGGREGATION_TRIMMED_MEAN},
      {"krum", common::v1::AGGREGATION_KRUM},
      {"multi-krum", common::v1::AGGREGATION_MULTI_KRUM},
      {"AGGREGATION_MULTI_KRUM", common::v1::AGGREGATION_MULTI_KRUM},
      {"centered-clipping", common::v1::AGGREGATION_CENTERED_CLIPPING},
  };
  for (const auto& [text, kind] : names) {
    absl::StatusOr<TaskSpec> spec =
        ParseTaskSpec(absl::StrCat("name: x\naggregation: ", text, "\n"), "t.yaml");
    ASSERT_TRUE(spec.ok()) << text << ": " << spec.status();
    EXPECT_EQ(spec->aggregation(), kind) << text;
  }
  EXPECT_EQ(FriendlyEnumName(*common::v1::Aggregation_descriptor(),
                             common::v1::AGGREGATION_CENTERED_CLIPPING),
            "centered-clipping");
}

TEST(AggregationTaskTest, DefaultsOfTheChosenStrategyOnly) {
  // mean has no parameters: no section appears.
  absl::StatusOr<TaskSpec> mean = ParseAndValidate("name: x\naggregation: mean\n");
  ASSERT_TRUE(mean.ok()) << mean.status();
  EXPECT_FALSE(mean->has_aggregation_options());
  EXPECT_THAT(MessageToFriendlyJson(*mean, 0), HasSubstr("\"aggregation_options\":null"));

  absl::StatusOr<TaskSpec> trimmed = ParseAndValidate("name: x\naggregation: trimmed-mean\n");
  ASSERT_TRUE(trimmed.ok()) << trimmed.status();
  EXPECT_DOUBLE_EQ(trimmed->aggregation_options().trim_ratio(), 0.1);
  ExpectJsonRoundTrip(*trimmed);

  absl::StatusOr<TaskSpec> clipped = ParseAndValidate(
      "name: x\naggregation: centered-clipping\naggregation_options: {clip_radius: 2.5}\n");
  ASSERT_TRUE(clipped.ok()) << clipped.status();
  EXPECT_DOUBLE_EQ(clipped->aggregation_options().clip_radius(), 2.5);
  EXPECT_EQ(clipped->aggregation_options().clip_iterations(), 3u);
  ExpectJsonRoundTrip(*clipped);

  // multi_krum_selected stays unset: K - f of each round.
  absl::StatusOr<TaskSpec> krum = ParseAndValidate(
      "name: x\nmin_participants: 7\naggregation: multi-krum\n"
      "aggregation_options: {byzantine_peers: 2}\n");
  ASSERT_TRUE(krum.ok()) << krum.status();
  EXPECT_FALSE(krum->aggregation_options().has_multi_krum_selected());
  ExpectJsonRoundTrip(*krum);

  // Over gRPC, without a file.
  TaskSpec bare;
  bare.set_name("x");
  bare.set_aggregation(common::v1::AGGREGATION_TRIMMED_MEAN);
  ApplyTaskDefaults(bare);
  EXPECT_DOUBLE_EQ(bare.aggregation_options().trim_ratio(), 0.1);
  EXPECT_TRUE(ValidateTaskSpec(bare).ok()) << ValidateTaskSpec(bare);
}

TEST(AggregationTaskTest, RulesNameTheFieldAndTheNumbers) {
  const std::pair<std::string, std::string> cases[] = {
      {"aggregation: median\naggregation_options: {trim_ratio: 0.2}\n",
       "aggregation_options.trim_ratio: used only by aggregation trimmed-mean, but aggregation is "
       "median (remove it or change aggregation)"},
      {"aggregation_options: {clip_radius: 1}\n",
       "aggregation_options.clip_radius: used only by aggregation centered-clipping, but "
       "aggregation is mean"},
      {"aggregation: trimmed-mean\naggregation_options: {trim_ratio: 0.5}\n",
       "aggregation_options.trim_ratio: must be in [0, 0.5), got 0.5"},
      {"aggregation: krum\nmin_participants: 9\n", "aggregation_options.byzantine_peers: required"},
      {"aggregation: krum\nmin_participants: 4\naggregation_options: {byzantine_peers: 1}\n",
       "min_participants: krum needs at least 5 updates per round (2f+3 with byzantine_peers f = "
       "1), got 4"},
      {"aggregation: multi-krum\nmin_participants: 6\n"
       "aggregation_options: {byzantine_peers: 1, multi_krum_selected: 6}\n",
       "min_participants: multi-krum needs at least 7 updates per round (m+f with "
       "multi_krum_selected m = 6 and byzantine_peers f = 1), got 6"},
      {"aggregation: centered-clipping\n", "aggregation_options.clip_radius: required"},
      {"aggregation: centered-clipping\naggregation_options: {clip_radius: -1}\n",
       "aggregation_options.clip_radius: must be > 0, got -1"},
      {"mode: gossip\naggregation: median\n",
       "aggregation: gossip aggregates no rounds, so only mean (the default) applies, got median"},
      {"mode: federated-async\nmin_participants: 5\naggregation: krum\n"
       "aggregation_options: {byzantine_peers: 1}\nasync: {buffer_size: 4}\n",
       "async.buffer_size: krum needs at least 5 updates per round (2f+3 with byzantine_peers f "
       "= 1), got 4"},
  };
  for (const auto& [text, message] : cases) {
    absl::StatusOr<TaskSpec> spec = ParseAndValidate("name: x\n" + text);
    ASSERT_FALSE(spec.ok()) << text;
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(spec.status().message()), HasSubstr(message)) << text;
  }
  // Exactly enough participants is fine.
  EXPECT_TRUE(ParseAndValidate("name: x\naggregation: krum\nmin_participants: 5\n"
                               "aggregation_options: {byzantine_peers: 1}\n")
                  .ok());
}

TEST(CompressionTaskTest, TopKGetsItsDefaultsAndRoundTrips) {
  absl::StatusOr<TaskSpec> spec = ParseAndValidate("name: x\ncompression: topk\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->compression(), common::v1::COMPRESSION_TOPK);
  EXPECT_EQ(spec->topk_ratio(), 0.01);
  EXPECT_EQ(spec->topk_values(), common::v1::COMPRESSION_NONE);
  EXPECT_TRUE(spec->has_topk_warmup_rounds());
  EXPECT_EQ(spec->topk_warmup_rounds(), 0u);
  EXPECT_TRUE(spec->has_topk_min_elements());
  EXPECT_EQ(spec->topk_min_elements(), 4096u);
  EXPECT_EQ(spec->topk_split(), common::v1::TOPK_SPLIT_PER_TENSOR);
  ExpectJsonRoundTrip(*spec);
  spec = ParseAndValidate(
      "name: x\nmode: federated-async\ncompression: topk\ntopk_ratio: 0.05\n"
      "topk_values: int8\ntopk_warmup_rounds: 3\ntopk_min_elements: 0\ntopk_split: equal\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->topk_ratio(), 0.05);
  EXPECT_EQ(spec->topk_values(), common::v1::COMPRESSION_INT8);
  EXPECT_EQ(spec->topk_warmup_rounds(), 3u);
  EXPECT_TRUE(spec->has_topk_min_elements());  // 0 (every tensor sparsified) is kept
  EXPECT_EQ(spec->topk_min_elements(), 0u);
  EXPECT_EQ(spec->topk_split(), common::v1::TOPK_SPLIT_EQUAL);
  ExpectJsonRoundTrip(*spec);
  spec = ParseAndValidate("name: x\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->compression(), common::v1::COMPRESSION_NONE);
  EXPECT_FALSE(spec->has_topk_ratio());
  ExpectJsonRoundTrip(*spec);
}

TEST(CompressionTaskTest, DecentralizedTasksMayCompressTheirRoundUpdates) {
  absl::StatusOr<TaskSpec> spec =
      ParseAndValidate("name: x\nmode: decentralized\ncompression: topk\ntopk_values: int8\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->compression(), common::v1::COMPRESSION_TOPK);
  EXPECT_EQ(spec->topk_ratio(), 0.01);
  spec = ParseAndValidate("name: x\nmode: decentralized\ncompression: fp16\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
}

TEST(CompressionTaskTest, RulesNameTheField) {
  const std::pair<std::string, std::string> cases[] = {
      {"compression: zip\n", "compression: unknown value"},
      {"compression: topk\ntopk_ratio: 0\n", "topk_ratio: must be in (0, 1], got 0"},
      {"compression: topk\ntopk_ratio: 1.5\n", "topk_ratio: must be in (0, 1], got 1.5"},
      {"compression: topk\ntopk_values: topk\n",
       "topk_values: unsupported value \"topk\" (expected none, fp16, int8)"},
      {"compression: int8\ntopk_ratio: 0.1\n", "topk_ratio: only with compression: topk"},
      {"topk_values: fp16\n", "topk_values: only with compression: topk"},
      {"compression: fp16\ntopk_warmup_rounds: 2\n",
       "topk_warmup_rounds: only with compression: topk"},
      {"compression: none\ntopk_min_elements: 100\n",
       "topk_min_elements: only with compression: topk"},
      {"compression: topk\ntopk_min_elements: -1\n",
       "topk_min_elements: must not be negative, got -1"},
      {"compression: topk\ntopk_warmup_rounds: 11\n",
       "topk_warmup_rounds: must be at most 10, got 11"},
      {"compression: int8\ntopk_split: equal\n", "topk_split: only with compression: topk"},
      {"compression: topk\ntopk_split: halves\n",
       "topk_split: unknown value \"halves\" (expected per-tensor, equal)"},
      {"mode: gossip\ncompression: topk\n",
       "this task's mode is gossip, whose peers send no updates (set compression: none)"},
  };
  for (const auto& [text, message] : cases) {
    absl::StatusOr<TaskSpec> spec = ParseAndValidate("name: x\n" + text);
    ASSERT_FALSE(spec.ok()) << text;
    EXPECT_THAT(std::string(spec.status().message()), HasSubstr(message)) << text;
  }
}

TEST(StragglerTaskTest, DefaultsAndRules) {
  absl::StatusOr<TaskSpec> spec = ParseAndValidate("name: x\nstraggler_factor: 3\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->straggler_factor(), 3);
  EXPECT_TRUE(spec->has_straggler_rounds());
  EXPECT_EQ(spec->straggler_rounds(), 2u);
  ExpectJsonRoundTrip(*spec);
  spec = ParseAndValidate("name: x\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->straggler_factor(), 0);  // off
  EXPECT_FALSE(spec->has_straggler_rounds());

  const std::pair<std::string, std::string> cases[] = {
      {"straggler_factor: 1\n", "straggler_factor: must be 0 (off) or in (1, 100], got 1"},
      {"straggler_factor: -2\n", "straggler_factor: must be 0 (off) or in (1, 100], got -2"},
      {"straggler_factor: 101\n", "got 101"},
      {"straggler_rounds: 3\n", "straggler_rounds: only with straggler_factor"},
      {"straggler_factor: 2\nstraggler_rounds: 0\n", "straggler_rounds: must be in 1..100, got 0"},
      {"mode: federated-async\nstraggler_factor: 2\n",
       "this task's mode is federated-async (remove straggler_factor)"},
  };
  for (const auto& [text, message] : cases) {
    absl::StatusOr<TaskSpec> bad = ParseAndValidate("name: x\n" + text);
    ASSERT_FALSE(bad.ok()) << text;
    EXPECT_THAT(std::string(bad.status().message()), HasSubstr(message)) << text;
  }
}

TEST(TopologyTaskTest, DefaultsAndRules) {
  absl::StatusOr<TaskSpec> spec = ParseAndValidate("name: x\ntopology: hierarchical\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->topology(), common::v1::TOPOLOGY_HIERARCHICAL);
  EXPECT_EQ(spec->cluster_size(), 32u);
  EXPECT_EQ(spec->fanout(), 32u);
  EXPECT_EQ(spec->replicas(), 1u);
  ExpectJsonRoundTrip(*spec);
  spec = ParseAndValidate("name: x\ntopology: hierarchical\nreplicas: 2\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->replicas(), 2u);
  spec = ParseAndValidate("name: x\ntopology: hierarchical\ncluster_size: 2\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->cluster_size(), 2u);
  // A robust strategy runs within each cluster; stragglers contribute late at theirs.
  spec = ParseAndValidate("name: x\ntopology: hierarchical\naggregation: median\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  spec = ParseAndValidate("name: x\ntopology: hierarchical\nstraggler_factor: 2\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  // Federated-async runs on a tree too, with one aggregator per cluster.
  spec = ParseAndValidate("name: x\ntopology: hierarchical\nmode: federated-async\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->replicas(), 1u);
  spec = ParseAndValidate("name: x\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_FALSE(spec->has_cluster_size());  // flat

  const std::pair<std::string, std::string> cases[] = {
      {"topology: hierarchical\ncluster_size: 1\n", "cluster_size: must be in 2..10000, got 1"},
      {"topology: hierarchical\ncluster_size: 10001\n", "got 10001"},
      {"cluster_size: 8\n", "cluster_size: only with topology: hierarchical"},
      {"fanout: 8\n", "fanout: only with topology: hierarchical"},
      {"topology: hierarchical\nfanout: 1\n", "fanout: must be in 2..1000, got 1"},
      {"replicas: 2\n", "replicas: only with topology: hierarchical"},
      {"topology: hierarchical\nreplicas: 0\n", "replicas: must be in 1..8"},
      {"topology: hierarchical\nreplicas: 9\n", "got 9"},
      {"topology: hierarchical\nmode: gossip\n",
       "topology: mode gossip does not run on a tree of aggregators yet"},
      {"topology: hierarchical\nmode: federated-async\nreplicas: 2\n",
       "replicas: a federated-async tree keeps no backups"},
      {"topology: hierarchical\nmin_participants: 10\ncluster_size: 4\naggregation: krum\n"
       "aggregation_options: {byzantine_peers: 1}\n",
       "cluster_size: krum needs at least 5 updates per round"},
      {"topology: ring\n", "topology"},
  };
  for (const auto& [text, message] : cases) {
    absl::StatusOr<TaskSpec> bad = ParseAndValidate("name: x\n" + text);
    ASSERT_FALSE(bad.ok()) << text;
    EXPECT_THAT(std::string(bad.status().message()), HasSubstr(message)) << text;
  }
}

}  // namespace
}  // namespace shoal::task
