#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>
#include <google/protobuf/reflection.h>

#include <cmath>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "libs/task/task_file.h"

// Rendering messages as JSON in task-file form (MessageToFriendlyJson) and its helpers.

namespace shoal::task {
namespace {

namespace pb = ::google::protobuf;

void AppendJson(const pb::Message& message, int indent, int depth, std::string& out);

std::string Newline(int indent, int depth) {
  std::string out;
  if (indent <= 0) return out;
  out.push_back('\n');
  out.append(static_cast<size_t>(indent * depth), ' ');
  return out;
}

void AppendJsonValue(const pb::Message& message, const pb::FieldDescriptor& field, int index,
                     int indent, int depth, std::string& out) {
  const pb::Reflection& r = *message.GetReflection();
  const bool rep = field.is_repeated();
  switch (field.cpp_type()) {
    case pb::FieldDescriptor::CPPTYPE_MESSAGE:
      AppendJson(rep ? r.GetRepeatedMessage(message, &field, index) : r.GetMessage(message, &field),
                 indent, depth, out);
      return;
    case pb::FieldDescriptor::CPPTYPE_STRING:
      out += JsonQuote(rep ? r.GetRepeatedString(message, &field, index)
                           : r.GetString(message, &field));
      return;
    case pb::FieldDescriptor::CPPTYPE_ENUM: {
      const int number =
          rep ? r.GetRepeatedEnumValue(message, &field, index) : r.GetEnumValue(message, &field);
      // An unset enum (its *_UNSPECIFIED zero) as null, which the parser reads as "the default";
      // its name is no value a task file may hold.
      const pb::EnumValueDescriptor* value = field.enum_type()->FindValueByNumber(number);
      if (!rep && value != nullptr && value->number() == 0 &&
          absl::EndsWith(value->name(), "_UNSPECIFIED")) {
        out += "null";
        return;
      }
      out += JsonQuote(FriendlyEnumName(*field.enum_type(), number));
      return;
    }
    case pb::FieldDescriptor::CPPTYPE_BOOL:
      out += (rep ? r.GetRepeatedBool(message, &field, index) : r.GetBool(message, &field))
                 ? "true"
                 : "false";
      return;
    case pb::FieldDescriptor::CPPTYPE_DOUBLE:
      out += JsonNumber(rep ? r.GetRepeatedDouble(message, &field, index)
                            : r.GetDouble(message, &field));
      return;
    case pb::FieldDescriptor::CPPTYPE_FLOAT:
      out += JsonNumber(rep ? r.GetRepeatedFloat(message, &field, index)
                            : r.GetFloat(message, &field));
      return;
    case pb::FieldDescriptor::CPPTYPE_INT32:
      absl::StrAppend(
          &out, rep ? r.GetRepeatedInt32(message, &field, index) : r.GetInt32(message, &field));
      return;
    case pb::FieldDescriptor::CPPTYPE_INT64:
      absl::StrAppend(
          &out, rep ? r.GetRepeatedInt64(message, &field, index) : r.GetInt64(message, &field));
      return;
    case pb::FieldDescriptor::CPPTYPE_UINT32:
      absl::StrAppend(
          &out, rep ? r.GetRepeatedUInt32(message, &field, index) : r.GetUInt32(message, &field));
      return;
    case pb::FieldDescriptor::CPPTYPE_UINT64:
      absl::StrAppend(
          &out, rep ? r.GetRepeatedUInt64(message, &field, index) : r.GetUInt64(message, &field));
      return;
  }
}

void AppendJson(const pb::Message& message, int indent, int depth, std::string& out) {
  const pb::Descriptor& type = *message.GetDescriptor();
  const pb::Reflection& r = *message.GetReflection();
  out += "{";
  const char* sep = indent > 0 ? ": " : ":";
  for (int i = 0; i < type.field_count(); ++i) {
    const pb::FieldDescriptor& field = *type.field(i);
    if (i > 0) out += ",";
    out += Newline(indent, depth + 1);
    out += JsonQuote(field.name());
    out += sep;
    if (field.is_repeated()) {
      const int size = r.FieldSize(message, &field);
      out += "[";
      for (int j = 0; j < size; ++j) {
        if (j > 0) out += indent > 0 ? ", " : ",";
        AppendJsonValue(message, field, j, indent, depth + 1, out);
      }
      out += "]";
    } else if (field.has_presence() && !r.HasField(message, &field)) {
      out += "null";  // unset (the parser reads null as "keep the default")
    } else {
      AppendJsonValue(message, field, -1, indent, depth + 1, out);
    }
  }
  if (type.field_count() > 0) out += Newline(indent, depth);
  out += "}";
}

}  // namespace

std::string JsonQuote(absl::string_view text) {
  std::string out = "\"";
  for (unsigned char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20) {
          out += absl::StrFormat("\\u%04x", c);
        } else {
          out.push_back(static_cast<char>(c));
        }
    }
  }
  out += "\"";
  return out;
}

std::string JsonNumber(double value) {
  if (!std::isfinite(value)) return "null";
  if (value == std::floor(value) && std::fabs(value) < 1e15) {
    return absl::StrFormat("%.0f", value);
  }
  // Shortest form that reads back as the same double.
  for (int precision = 6; precision <= 17; ++precision) {
    std::string text = absl::StrFormat("%.*g", precision, value);
    double back = 0;
    if (absl::SimpleAtod(text, &back) && back == value) return text;
  }
  return absl::StrFormat("%.17g", value);
}

std::string MessageToFriendlyJson(const pb::Message& message, int indent) {
  std::string out;
  AppendJson(message, indent, 0, out);
  return out;
}

}  // namespace shoal::task
