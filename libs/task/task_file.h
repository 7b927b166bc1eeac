#pragma once

// Task files: a TaskSpec written as YAML or JSON (yaml-cpp parses both). Keys are the proto
// field names (snake_case), nested messages are nested mappings, and enums are written in their
// friendly form (`mode: federated-sync`, `partition: label-skew`, `kind: sgd`) or as the full
// enum value name (`MODE_FEDERATED_SYNC`). Fields left out keep the defaults of DefaultTaskSpec().
//
// Every error is INVALID_ARGUMENT and names the file and the field path, e.g.
//   task.yaml: dataset.partition: unknown value "foo" (expected iid, label-skew, dirichlet)
// Values and names quoted from the input are escaped (libs/common/escape.h), and a non-finite
// number is named as written (`got .nan`).

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "shoal/common/v1/task.pb.h"

namespace google::protobuf {
class EnumDescriptor;
class EnumValueDescriptor;
class Message;
}  // namespace google::protobuf

namespace shoal::task {

// Limits of task files (and of any text given to ParseTaskSpec / ParseMessageFromYaml): larger or
// more deeply nested input is refused with INVALID_ARGUMENT before it is parsed.
inline constexpr size_t kMaxTaskFileBytes = size_t{1} << 20;  // 1 MiB
inline constexpr int kMaxTaskFileDepth = 32;                  // nested mappings and lists

// The documented defaults, applied to every field a task file leaves out:
//   mode federated-sync, model cnn, dataset {name fashion-mnist, partition iid,
//   classes_per_shard 2 (label-skew only)}, batch_size 32, optimizer {kind sgd,
//   learning_rate 0.05, momentum 0.9}, round_batches 50, rounds 10, min_participants 1,
//   max_participants 0 (no limit), round_deadline_seconds 120, aggregation mean, seed 1,
//   max_update_norm 0 (no bound). `name` has no default.
// Settings that depend on other fields are filled once those are known (by ParseTaskSpec and
// ApplyTaskDefaults): the mode's own (its ModeDefinition's apply_defaults, libs/task/task_mode.h:
// max_connection_retry 3 in decentralized tasks, dpwa's `gossip` settings in gossip tasks, the
// `async` section in federated-async tasks: buffer_size = min_participants, max_staleness 4,
// staleness polynomial with a 0.5), and the parameter defaults of the chosen aggregation
// (aggregation::ApplyAggregationDefaults, e.g. trim_ratio 0.1 for trimmed-mean).
common::v1::TaskSpec DefaultTaskSpec();

// Fills the fields of `spec` whose zero value is invalid (unspecified enums, empty dataset
// name, zero batch size, learning rate, round counts, deadline...) with their defaults. Fields
// where zero is meaningful (momentum, max_participants, seed, limits, max_update_norm) are left
// alone. For specs that arrive without a file, e.g. over gRPC.
void ApplyTaskDefaults(common::v1::TaskSpec& spec);

// Checks every rule documented in protos/shoal/common/v1/task.proto. Returns the first
// violation as INVALID_ARGUMENT "<field path>: <what is wrong>", e.g.
// "optimizer.learning_rate: must be > 0, got 0".
absl::Status ValidateTaskSpec(const common::v1::TaskSpec& spec);

// Parses task file text (YAML or JSON) on top of DefaultTaskSpec(). `source` (the file name)
// starts every error message. Does not validate.
absl::StatusOr<common::v1::TaskSpec> ParseTaskSpec(absl::string_view text,
                                                   absl::string_view source);

// Reads, parses and validates a task file. Errors: NOT_FOUND missing file, INVALID_ARGUMENT
// anything wrong in it (message "<path>: <field>: <what>"), including a file over
// kMaxTaskFileBytes, which is refused from its size before it is read.
absl::StatusOr<common::v1::TaskSpec> LoadTaskFile(const std::string& path);

// Fills `message` from YAML/JSON text with the rules above, without defaults or validation.
// Works for any message type; `source` starts every error message.
absl::Status ParseMessageFromYaml(absl::string_view text, absl::string_view source,
                                  google::protobuf::Message& message);

// The friendly name of an enum value: the enum's prefix stripped, lower case, '_' -> '-'
// (TASK_STATE_RUNNING -> "running", PARTITION_LABEL_SKEW -> "label-skew").
std::string FriendlyEnumName(const google::protobuf::EnumValueDescriptor& value);
// Friendly name of `number` in `type` ("unknown(<n>)" for a number the enum does not define).
std::string FriendlyEnumName(const google::protobuf::EnumDescriptor& type, int number);
// Finds a value by friendly name or full name (case-insensitive; '_' and '-' are the same).
// The *_UNSPECIFIED value is never matched. Returns nullptr when nothing matches.
const google::protobuf::EnumValueDescriptor* FindEnumValue(
    const google::protobuf::EnumDescriptor& type, absl::string_view text);

// Renders any message as JSON in task-file form: proto field names, friendly enum names, every
// field present (defaults included). `indent` > 0 pretty-prints. The output of TaskSpec parses
// back with ParseTaskSpec.
std::string MessageToFriendlyJson(const google::protobuf::Message& message, int indent = 0);

// Escapes `text` as a JSON string literal, quotes included.
std::string JsonQuote(absl::string_view text);
// A JSON number for `value` (shortest round-trip form); "null" when it is not finite.
std::string JsonNumber(double value);
// A number for error messages: JsonNumber's form, but a non-finite value by name (nan, inf,
// -inf), never JSON's null.
std::string ShowNumber(double value);

}  // namespace shoal::task
