#include "libs/task/task_file.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>
#include <google/protobuf/reflection.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <set>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "libs/aggregation/strategy.h"
#include "libs/common/escape.h"
#include "libs/common/small_file.h"
#include "libs/common/status_macros.h"
#include "libs/common/yaml_depth.h"
#include "libs/task/field_error.h"
#include "libs/task/task_dataset.h"
#include "libs/task/task_federated.h"
#include "libs/task/task_mode.h"
#include "libs/task/task_model.h"
#include "libs/task/task_privacy.h"
#include "libs/training/model_names.h"  // the model constants only: no LibTorch

namespace shoal::task {
namespace {

namespace pb = ::google::protobuf;
using common::v1::TaskSpec;

// "TaskState" -> "TASK_STATE_".
std::string EnumPrefix(const pb::EnumDescriptor& type) {
  std::string prefix;
  for (char c : type.name()) {
    if (absl::ascii_isupper(c) && !prefix.empty()) prefix.push_back('_');
    prefix.push_back(absl::ascii_toupper(c));
  }
  prefix.push_back('_');
  return prefix;
}

bool IsUnspecified(const pb::EnumValueDescriptor& value) {
  return value.number() == 0 && absl::EndsWith(value.name(), "_UNSPECIFIED");
}

// Lower case, '_' -> '-', for comparisons.
std::string Canonical(absl::string_view text) {
  std::string out = absl::AsciiStrToLower(text);
  for (char& c : out) {
    if (c == '_') c = '-';
  }
  return out;
}

// Reads a floating-point scalar. Besides decimal numbers, YAML's `.nan`, `.inf`, `-.inf` and
// the `nan`/`inf`/`NaN`/`Infinity` spellings parse, so that the caller can reject them by name.
bool ParseDouble(absl::string_view text, double* value) {
  absl::string_view rest = text;
  double sign = 1;
  if (!rest.empty() && (rest.front() == '-' || rest.front() == '+')) {
    if (rest.front() == '-') sign = -1;
    rest.remove_prefix(1);
  }
  if (absl::EqualsIgnoreCase(rest, ".nan") && rest.size() == text.size()) {
    *value = std::numeric_limits<double>::quiet_NaN();
    return true;
  }
  if (absl::EqualsIgnoreCase(rest, ".inf")) {
    *value = sign * std::numeric_limits<double>::infinity();
    return true;
  }
  return absl::SimpleAtod(text, value);
}

std::string ExpectedEnumValues(const pb::EnumDescriptor& type) {
  std::vector<std::string> names;
  for (int i = 0; i < type.value_count(); ++i) {
    if (!IsUnspecified(*type.value(i))) names.push_back(FriendlyEnumName(*type.value(i)));
  }
  return absl::StrJoin(names, ", ");
}

std::string ExpectedFields(const pb::Descriptor& type) {
  std::vector<std::string> names;
  for (int i = 0; i < type.field_count(); ++i) names.push_back(type.field(i)->name());
  return absl::StrJoin(names, ", ");
}

// A list field that also takes one number for a square, written twice: `image_size: 8` is
// [8, 8]. (A one-element list, `image_size: [8]`, is a square too, and stays as written.)
bool IsSquareSize(const pb::FieldDescriptor& field) {
  return &field == common::v1::DatasetSpec::descriptor()->FindFieldByName("image_size");
}

// Parses YAML nodes into a message by reflection. Errors carry "<source>: <path>: ".
class YamlReader {
 public:
  explicit YamlReader(absl::string_view source) : source_(EscapeBytes(source)) {}

  absl::Status ReadMessage(const YAML::Node& node, const std::string& path, pb::Message& message) {
    if (!node.IsMap()) {
      return Error(path, path.empty() ? "expected a mapping of task fields at the top level"
                                      : "expected a mapping");
    }
    const pb::Descriptor& type = *message.GetDescriptor();
    std::set<std::string> seen;
    for (const auto& item : node) {
      if (!item.first.IsScalar()) return Error(path, "keys must be plain names");
      const std::string key = item.first.Scalar();
      const std::string shown = EscapeBytes(key);
      const std::string field_path = path.empty() ? shown : absl::StrCat(path, ".", shown);
      if (!seen.insert(key).second) return Error(field_path, "duplicate key");
      const pb::FieldDescriptor* field = type.FindFieldByName(key);
      if (field == nullptr) {
        return Error(field_path,
                     absl::StrCat("unknown field (expected one of ", ExpectedFields(type), ")"));
      }
      if (field == TaskSpec::descriptor()->FindFieldByName("model") && item.second.IsMap()) {
        SHOAL_RETURN_IF_ERROR(ReadModelMapping(item.second, field_path, message));
        continue;
      }
      if (field == TaskSpec::descriptor()->FindFieldByName("torchscript") && model_mapping_ &&
          item.second.IsMap() && item.second["file"]) {
        return Error(field_path,
                     "the model file is given twice (model.torchscript and torchscript.file)");
      }
      SHOAL_RETURN_IF_ERROR(ReadField(item.second, field_path, *field, message));
    }
    return absl::OkStatus();
  }

 private:
  absl::Status Error(const std::string& path, absl::string_view what) const {
    if (path.empty()) return absl::InvalidArgumentError(absl::StrCat(source_, ": ", what));
    return absl::InvalidArgumentError(absl::StrCat(source_, ": ", path, ": ", what));
  }

  // `model: {torchscript: FILE}`: the user's model file. Same as `model: torchscript` with
  // `torchscript: {file: FILE}`.
  absl::Status ReadModelMapping(const YAML::Node& node, const std::string& path,
                                pb::Message& message) {
    if (node.size() != 1 || !node.begin()->first.IsScalar() ||
        node.begin()->first.Scalar() != "torchscript") {
      return Error(path, absl::StrCat("expected a model name (",
                                      absl::StrJoin(training::KnownModels(), ", "),
                                      ") or {torchscript: FILE}"));
    }
    auto& spec = static_cast<TaskSpec&>(message);
    if (!spec.torchscript().file().empty()) {
      return Error(path, "the model file is given twice (model.torchscript and torchscript.file)");
    }
    spec.set_model(std::string(training::kTorchScriptModel));
    model_mapping_ = true;
    pb::Message& ref = *spec.mutable_torchscript();
    return ReadField(node.begin()->second, absl::StrCat(path, ".torchscript"),
                     *ref.GetDescriptor()->FindFieldByName("file"), ref);
  }

  absl::Status ReadField(const YAML::Node& node, const std::string& path,
                         const pb::FieldDescriptor& field, pb::Message& message) {
    // `key:` with no value (or JSON null) keeps the default.
    if (node.IsNull()) return absl::OkStatus();
    const pb::Reflection& reflection = *message.GetReflection();
    if (field.is_map()) return Error(path, "map fields are not supported in task files");
    if (field.is_repeated()) {
      if (node.IsScalar() && IsSquareSize(field)) {
        // `image_size: 8` is one value for a square: [8, 8].
        reflection.ClearField(&message, &field);
        SHOAL_RETURN_IF_ERROR(ReadValue(node, path, field, message, /*add=*/true));
        return ReadValue(node, path, field, message, /*add=*/true);
      }
      if (!node.IsSequence()) return Error(path, "expected a list");
      reflection.ClearField(&message, &field);
      size_t index = 0;
      for (const auto& element : node) {
        SHOAL_RETURN_IF_ERROR(ReadValue(element, absl::StrCat(path, "[", index++, "]"), field,
                                        message, /*add=*/true));
      }
      return absl::OkStatus();
    }
    return ReadValue(node, path, field, message, /*add=*/false);
  }

  absl::Status ReadValue(const YAML::Node& node, const std::string& path,
                         const pb::FieldDescriptor& field, pb::Message& message, bool add) {
    const pb::Reflection& r = *message.GetReflection();
    if (field.cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE) {
      pb::Message* sub = add ? r.AddMessage(&message, &field) : r.MutableMessage(&message, &field);
      return ReadMessage(node, path, *sub);
    }
    if (!node.IsScalar()) return Error(path, "expected a single value, not a list or mapping");
    const std::string& text = node.Scalar();
    // Quoted scalars ("32") are strings; numbers and booleans must be written bare.
    const bool quoted = node.Tag() == "!";
    switch (field.cpp_type()) {
      case pb::FieldDescriptor::CPPTYPE_STRING:
        // Proto3 strings are UTF-8; anything else could not be sent or written back.
        if (!IsValidUtf8(text)) {
          return Error(path, absl::StrCat("not valid UTF-8: ", QuoteBytes(text)));
        }
        // No field of a task needs them, and they do not survive every YAML/JSON round trip.
        if (std::any_of(text.begin(), text.end(),
                        [](unsigned char c) { return c < 0x20 || c == 0x7F; })) {
          return Error(path,
                       absl::StrCat("control characters are not allowed: ", QuoteBytes(text)));
        }
        add ? r.AddString(&message, &field, text) : r.SetString(&message, &field, text);
        return absl::OkStatus();
      case pb::FieldDescriptor::CPPTYPE_ENUM: {
        const pb::EnumDescriptor& type = *field.enum_type();
        const pb::EnumValueDescriptor* value = FindEnumValue(type, text);
        if (value == nullptr) {
          return Error(path, absl::StrCat("unknown value ", QuoteBytes(text), " (expected ",
                                          ExpectedEnumValues(type), ")"));
        }
        add ? r.AddEnumValue(&message, &field, value->number())
            : r.SetEnumValue(&message, &field, value->number());
        return absl::OkStatus();
      }
      case pb::FieldDescriptor::CPPTYPE_BOOL: {
        const std::string lower = absl::AsciiStrToLower(text);
        if (quoted || (lower != "true" && lower != "false")) {
          return Error(path, absl::StrCat("expected true or false, got ", QuoteBytes(text)));
        }
        add ? r.AddBool(&message, &field, lower == "true")
            : r.SetBool(&message, &field, lower == "true");
        return absl::OkStatus();
      }
      case pb::FieldDescriptor::CPPTYPE_DOUBLE:
      case pb::FieldDescriptor::CPPTYPE_FLOAT: {
        double value = 0;
        if (quoted || !ParseDouble(text, &value)) {
          return Error(path, absl::StrCat("expected a number, got ", QuoteBytes(text)));
        }
        if (!std::isfinite(value))
          return Error(path, absl::StrCat("must be finite, got ", EscapeBytes(text)));
        if (field.cpp_type() == pb::FieldDescriptor::CPPTYPE_FLOAT) {
          if (std::fabs(value) > std::numeric_limits<float>::max()) {
            return Error(path, absl::StrCat("out of range: ", EscapeBytes(text)));
          }
          add ? r.AddFloat(&message, &field, static_cast<float>(value))
              : r.SetFloat(&message, &field, static_cast<float>(value));
        } else {
          add ? r.AddDouble(&message, &field, value) : r.SetDouble(&message, &field, value);
        }
        return absl::OkStatus();
      }
      case pb::FieldDescriptor::CPPTYPE_INT32:
      case pb::FieldDescriptor::CPPTYPE_INT64: {
        int64_t value = 0;
        if (quoted || !absl::SimpleAtoi(text, &value)) {
          return Error(path, absl::StrCat("expected an integer, got ", QuoteBytes(text)));
        }
        if (field.cpp_type() == pb::FieldDescriptor::CPPTYPE_INT32) {
          if (value < std::numeric_limits<int32_t>::min() ||
              value > std::numeric_limits<int32_t>::max()) {
            return Error(path, absl::StrCat("out of range: ", EscapeBytes(text)));
          }
          add ? r.AddInt32(&message, &field, static_cast<int32_t>(value))
              : r.SetInt32(&message, &field, static_cast<int32_t>(value));
        } else {
          add ? r.AddInt64(&message, &field, value) : r.SetInt64(&message, &field, value);
        }
        return absl::OkStatus();
      }
      case pb::FieldDescriptor::CPPTYPE_UINT32:
      case pb::FieldDescriptor::CPPTYPE_UINT64: {
        if (!quoted && !text.empty() && text[0] == '-') {
          return Error(path, absl::StrCat("must not be negative, got ", EscapeBytes(text)));
        }
        uint64_t value = 0;
        if (quoted || !absl::SimpleAtoi(text, &value)) {
          int64_t ignored = 0;
          if (!quoted && absl::SimpleAtoi(text, &ignored)) {
            return Error(path, absl::StrCat("out of range: ", EscapeBytes(text)));
          }
          return Error(path,
                       absl::StrCat("expected a non-negative integer, got ", QuoteBytes(text)));
        }
        if (field.cpp_type() == pb::FieldDescriptor::CPPTYPE_UINT32) {
          if (value > std::numeric_limits<uint32_t>::max()) {
            return Error(path, absl::StrCat("out of range: ", EscapeBytes(text), " (at most ",
                                            std::numeric_limits<uint32_t>::max(), ")"));
          }
          add ? r.AddUInt32(&message, &field, static_cast<uint32_t>(value))
              : r.SetUInt32(&message, &field, static_cast<uint32_t>(value));
        } else {
          add ? r.AddUInt64(&message, &field, value) : r.SetUInt64(&message, &field, value);
        }
        return absl::OkStatus();
      }
      default:
        return Error(path, "unsupported field type");
    }
  }

  std::string source_;
  bool model_mapping_ = false;  // `model: {torchscript: FILE}` was read
};

}  // namespace

std::string ShowNumber(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  return JsonNumber(value);
}

std::string FriendlyEnumName(const pb::EnumValueDescriptor& value) {
  std::string name = value.name();
  const std::string prefix = EnumPrefix(*value.type());
  if (absl::StartsWith(name, prefix)) name = name.substr(prefix.size());
  return Canonical(name);
}

std::string FriendlyEnumName(const pb::EnumDescriptor& type, int number) {
  const pb::EnumValueDescriptor* value = type.FindValueByNumber(number);
  if (value == nullptr) return absl::StrCat("unknown(", number, ")");
  return FriendlyEnumName(*value);
}

const pb::EnumValueDescriptor* FindEnumValue(const pb::EnumDescriptor& type,
                                             absl::string_view text) {
  const std::string wanted = Canonical(absl::StripAsciiWhitespace(text));
  for (int i = 0; i < type.value_count(); ++i) {
    const pb::EnumValueDescriptor* value = type.value(i);
    if (IsUnspecified(*value)) continue;
    if (wanted == FriendlyEnumName(*value) || wanted == Canonical(value->name())) return value;
  }
  return nullptr;
}

// The defaults that depend on other fields: the mode's settings (its definition's), the
// strategy's parameters, compression, stragglers, topology and privacy.
void ApplyModeDefaults(TaskSpec& spec) {
  const ModeDefinition* mode = FindModeDefinition(spec.mode());
  if (mode != nullptr && mode->apply_defaults != nullptr) mode->apply_defaults(spec);
  aggregation::ApplyAggregationDefaults(spec);
  ApplyCompressionDefaults(spec);
  ApplyStragglerDefaults(spec);
  ApplyTopologyDefaults(spec);
  ApplyPrivacyDefaults(spec);
}

TaskSpec DefaultTaskSpec() {
  TaskSpec spec;
  spec.set_mode(common::v1::MODE_FEDERATED_SYNC);
  spec.set_model("cnn");
  spec.set_loss(common::v1::LOSS_CROSS_ENTROPY);
  spec.mutable_dataset()->set_name("fashion-mnist");
  spec.mutable_dataset()->set_format(common::v1::DATA_FORMAT_FASHION_MNIST);
  spec.mutable_dataset()->set_partition(common::v1::PARTITION_IID);
  spec.set_batch_size(32);
  spec.mutable_optimizer()->set_kind(common::v1::OPTIMIZER_SGD);
  spec.mutable_optimizer()->set_learning_rate(0.05);
  spec.mutable_optimizer()->set_momentum(0.9);
  spec.set_round_batches(50);
  spec.set_rounds(10);
  spec.set_min_participants(1);
  spec.set_max_participants(0);
  spec.set_round_deadline_seconds(120);
  spec.set_aggregation(common::v1::AGGREGATION_MEAN);
  spec.set_seed(1);
  spec.set_max_update_norm(0);
  spec.set_compression(common::v1::COMPRESSION_NONE);
  return spec;
}

void ApplyTaskDefaults(TaskSpec& spec) {
  const TaskSpec d = DefaultTaskSpec();
  if (spec.mode() == common::v1::MODE_UNSPECIFIED) spec.set_mode(d.mode());
  if (spec.model().empty()) spec.set_model(d.model());
  if (spec.loss() == common::v1::LOSS_UNSPECIFIED) spec.set_loss(d.loss());
  auto& dataset = *spec.mutable_dataset();
  if (dataset.name().empty()) dataset.set_name(d.dataset().name());
  if (dataset.partition() == common::v1::PARTITION_UNSPECIFIED) {
    dataset.set_partition(d.dataset().partition());
  }
  ApplyDatasetDefaults(dataset);
  if (spec.batch_size() == 0) spec.set_batch_size(d.batch_size());
  auto& optimizer = *spec.mutable_optimizer();
  if (optimizer.kind() == common::v1::OPTIMIZER_UNSPECIFIED) {
    optimizer.set_kind(d.optimizer().kind());
  }
  if (optimizer.learning_rate() == 0) optimizer.set_learning_rate(d.optimizer().learning_rate());
  if (spec.round_batches() == 0) spec.set_round_batches(d.round_batches());
  if (spec.rounds() == 0) spec.set_rounds(d.rounds());
  if (spec.min_participants() == 0) spec.set_min_participants(d.min_participants());
  if (spec.round_deadline_seconds() == 0) {
    spec.set_round_deadline_seconds(d.round_deadline_seconds());
  }
  if (spec.aggregation() == common::v1::AGGREGATION_UNSPECIFIED) {
    spec.set_aggregation(d.aggregation());
  }
  ApplyModeDefaults(spec);
}

absl::Status ValidateTaskSpec(const TaskSpec& spec) {
  if (spec.name().empty()) return FieldError("name", "required");
  if (!IsValidName(spec.name())) {
    return FieldError("name",
                      absl::StrCat("must match ", kNamePattern, ", got ", QuoteBytes(spec.name())));
  }
  const ModeDefinition* mode = FindModeDefinition(spec.mode());
  if (mode == nullptr) {
    return FieldError(
        "mode",
        absl::StrCat("unsupported value ",
                     JsonQuote(FriendlyEnumName(*common::v1::Mode_descriptor(), spec.mode())),
                     " (expected ", ModeNames([](const ModeDefinition&) { return true; }), ")"));
  }
  SHOAL_RETURN_IF_ERROR(ValidateModelFields(spec));
  SHOAL_RETURN_IF_ERROR(ValidateDatasetFields(spec.dataset()));
  if (spec.batch_size() < 1 || spec.batch_size() > 4096) {
    return FieldError("batch_size", absl::StrCat("must be in 1..4096, got ", spec.batch_size()));
  }
  const auto& optimizer = spec.optimizer();
  if (optimizer.kind() != common::v1::OPTIMIZER_SGD &&
      optimizer.kind() != common::v1::OPTIMIZER_ADAM) {
    return FieldError("optimizer.kind",
                      absl::StrCat("unsupported value ",
                                   JsonQuote(FriendlyEnumName(*common::v1::Optimizer_descriptor(),
                                                              optimizer.kind())),
                                   " (expected sgd, adam)"));
  }
  if (!(optimizer.learning_rate() > 0) || !std::isfinite(optimizer.learning_rate())) {
    return FieldError("optimizer.learning_rate",
                      absl::StrCat("must be > 0, got ", ShowNumber(optimizer.learning_rate())));
  }
  if (!(optimizer.momentum() >= 0 && optimizer.momentum() < 1)) {
    return FieldError("optimizer.momentum",
                      absl::StrCat("must be in [0, 1), got ", ShowNumber(optimizer.momentum())));
  }
  if (spec.round_batches() < 1) {
    return FieldError("round_batches", absl::StrCat("must be >= 1, got ", spec.round_batches()));
  }
  if (spec.rounds() < 1)
    return FieldError("rounds", absl::StrCat("must be >= 1, got ", spec.rounds()));
  if (spec.min_participants() < 1) {
    return FieldError("min_participants",
                      absl::StrCat("must be >= 1, got ", spec.min_participants()));
  }
  if (spec.max_participants() != 0 && spec.max_participants() < spec.min_participants()) {
    return FieldError("max_participants",
                      absl::StrCat("must be 0 (no limit) or >= min_participants (",
                                   spec.min_participants(), "), got ", spec.max_participants()));
  }
  if (spec.round_deadline_seconds() < 1) {
    return FieldError("round_deadline_seconds",
                      absl::StrCat("must be >= 1, got ", spec.round_deadline_seconds()));
  }
  const RoundSize round = RoundSizeOf(spec);
  if (mode->round_size == nullptr && spec.aggregation() != common::v1::AGGREGATION_MEAN) {
    return FieldError("aggregation",
                      absl::StrCat(mode->name,
                                   " aggregates no rounds, so only mean (the default) "
                                   "applies, got ",
                                   aggregation::StrategyName(spec.aggregation())));
  }
  SHOAL_RETURN_IF_ERROR(aggregation::ValidateAggregation(spec, round.updates, round.field));
  if (!(spec.max_update_norm() >= 0) || !std::isfinite(spec.max_update_norm())) {
    return FieldError("max_update_norm", absl::StrCat("must be >= 0 (0 = no bound), got ",
                                                      ShowNumber(spec.max_update_norm())));
  }
  if (spec.join_token().size() > 256) {
    return FieldError("join_token", "at most 256 characters");
  }
  // Another mode's own settings.
  for (const ModeDefinition& other : ModeDefinitions()) {
    if (other.sections.own.empty() || other.mode == mode->mode) continue;
    const pb::FieldDescriptor* field = TaskSpec::descriptor()->FindFieldByName(other.sections.own);
    if (field != nullptr && spec.GetReflection()->HasField(spec, field)) {
      return FieldError(
          other.sections.own,
          absl::StrCat("settings for mode ", other.name, ", but this task's mode is ", mode->name,
                       " (remove the section or set mode: ", other.name, ")"));
    }
  }
  if (mode->validate != nullptr) SHOAL_RETURN_IF_ERROR(mode->validate(spec));
  SHOAL_RETURN_IF_ERROR(ValidateCompression(spec));
  SHOAL_RETURN_IF_ERROR(ValidateStragglers(spec));
  SHOAL_RETURN_IF_ERROR(ValidateTopology(spec));
  SHOAL_RETURN_IF_ERROR(ValidatePrivacy(spec));
  return absl::OkStatus();
}

absl::Status ParseMessageFromYaml(absl::string_view text, absl::string_view source,
                                  pb::Message& message) {
  const std::string shown = EscapeBytes(source);
  if (text.size() > kMaxTaskFileBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(shown, ": the task file is ", DescribeBytes(text.size()),
                     ", over the limit of ", DescribeBytes(kMaxTaskFileBytes)));
  }
  // Before yaml-cpp builds a tree: it recurses once per level.
  SHOAL_RETURN_IF_ERROR(CheckYamlDepth(text, source, kMaxTaskFileDepth));
  YAML::Node root;
  try {
    root = YAML::Load(std::string(text));
  } catch (const YAML::Exception& e) {
    // e.mark is 0-based; people count lines from 1.
    return absl::InvalidArgumentError(absl::StrCat(shown, ":", e.mark.line + 1, ":",
                                                   e.mark.column + 1, ": ", EscapeBytes(e.msg)));
  }
  if (root.IsNull()) {
    return absl::InvalidArgumentError(absl::StrCat(shown, ": the task file is empty"));
  }
  try {
    return YamlReader(source).ReadMessage(root, "", message);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(shown, ": ", EscapeBytes(e.what())));
  }
}

absl::StatusOr<TaskSpec> ParseTaskSpec(absl::string_view text, absl::string_view source) {
  TaskSpec spec = DefaultTaskSpec();
  SHOAL_RETURN_IF_ERROR(ParseMessageFromYaml(text, source, spec));
  ApplyDatasetDefaults(*spec.mutable_dataset());
  ApplyModeDefaults(spec);
  return spec;
}

absl::StatusOr<TaskSpec> LoadTaskFile(const std::string& path) {
  SHOAL_ASSIGN_OR_RETURN(std::string text, ReadSmallFile(path, kMaxTaskFileBytes, "task file"));
  SHOAL_ASSIGN_OR_RETURN(TaskSpec spec, ParseTaskSpec(text, path));
  if (absl::Status s = ResolveModelFile(spec, std::filesystem::path(path).parent_path().string());
      !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(EscapeBytes(path), ": ", s.message()));
  }
  absl::Status valid = ValidateTaskSpec(spec);
  if (!valid.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(EscapeBytes(path), ": ", valid.message()));
  }
  return spec;
}

}  // namespace shoal::task
