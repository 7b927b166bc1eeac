#include "libs/gossip/dpwa_config.h"

#include <yaml-cpp/yaml.h>

#include <cmath>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "libs/common/escape.h"
#include "libs/common/small_file.h"
#include "libs/common/status_macros.h"
#include "libs/common/yaml_depth.h"
#include "libs/gossip/gossip_spec.h"

namespace shoal::gossip {
namespace {

class Reader {
 public:
  explicit Reader(absl::string_view source) : source_(EscapeBytes(source)) {}

  absl::Status Error(const YAML::Node& at, absl::string_view key, absl::string_view what) const {
    std::string where(source_);
    if (at.IsDefined() && at.Mark().line >= 0) absl::StrAppend(&where, ":", at.Mark().line + 1);
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", EscapeBytes(key), ": ", what));
  }

  absl::StatusOr<double> Number(const YAML::Node& n, absl::string_view key) const {
    double v = 0;
    if (!n.IsScalar()) return Error(n, key, "expected a number");
    const bool parsed = absl::SimpleAtod(n.Scalar(), &v);
    if (parsed && std::isfinite(v)) return v;
    // Named as written: `.nan` stays `.nan`.
    const absl::string_view text = n.Scalar();
    if (parsed || absl::EndsWithIgnoreCase(text, ".nan") ||
        absl::EndsWithIgnoreCase(text, ".inf")) {
      return Error(n, key, absl::StrCat("must be finite, got ", QuoteBytes(n.Scalar())));
    }
    return Error(n, key, absl::StrCat("expected a number, got ", QuoteBytes(n.Scalar())));
  }

  absl::StatusOr<int64_t> Integer(const YAML::Node& n, absl::string_view key) const {
    int64_t v = 0;
    if (!n.IsScalar() || !absl::SimpleAtoi(n.Scalar(), &v)) {
      return Error(n, key, "expected an integer");
    }
    return v;
  }

  absl::StatusOr<bool> Bool(const YAML::Node& n, absl::string_view key) const {
    bool v = false;
    if (!n.IsScalar() || !YAML::convert<bool>::decode(n, v)) {
      return Error(n, key, "expected true or false");
    }
    return v;
  }

  absl::StatusOr<std::string> String(const YAML::Node& n, absl::string_view key) const {
    if (!n.IsScalar() || n.Scalar().empty()) return Error(n, key, "expected a non-empty string");
    return n.Scalar();
  }

  absl::Status Nodes(const YAML::Node& n, DpwaConfig& out) const {
    if (!n.IsSequence() || n.size() == 0) {
      return Error(n, "nodes", "expected a non-empty list of {name, host, port}");
    }
    std::set<std::string> names;
    for (size_t i = 0; i < n.size(); ++i) {
      const YAML::Node& item = n[i];
      const std::string key = absl::StrCat("nodes[", i, "]");
      if (!item.IsMap()) return Error(item, key, "expected a map {name, host, port}");
      DpwaNode node;
      bool has_name = false, has_host = false, has_port = false;
      for (const auto& kv : item) {
        const std::string k = kv.first.as<std::string>();
        const std::string field = absl::StrCat(key, ".", k);
        if (k == "name") {
          auto v = String(kv.second, field);
          if (!v.ok()) return v.status();
          node.name = *v;
          has_name = true;
        } else if (k == "host") {
          auto v = String(kv.second, field);
          if (!v.ok()) return v.status();
          node.host = *v;
          has_host = true;
        } else if (k == "port") {
          auto v = Integer(kv.second, field);
          if (!v.ok()) return v.status();
          if (*v < 1 || *v > 65535) {
            return Error(kv.second, field, absl::StrCat("must be in 1..65535, got ", *v));
          }
          node.port = static_cast<uint16_t>(*v);
          has_port = true;
        } else {
          return Error(kv.first, field, "unknown key (expected name, host, port)");
        }
      }
      if (!has_name) return Error(item, key, "name is required");
      if (!has_host) return Error(item, key, "host is required");
      if (!has_port) return Error(item, key, "port is required");
      if (!names.insert(node.name).second) {
        return Error(item, key, absl::StrCat("duplicate node name ", QuoteBytes(node.name)));
      }
      out.nodes.push_back(std::move(node));
    }
    return absl::OkStatus();
  }

  absl::Status FlowControl(const YAML::Node& n, common::v1::FlowControlSpec& fc) const {
    if (!n.IsMap()) return Error(n, "flow_control", "expected a map");
    for (const auto& kv : n) {
      const std::string k = kv.first.as<std::string>();
      const std::string field = absl::StrCat("flow_control.", k);
      auto v = Number(kv.second, field);
      if (!v.ok()) return v.status();
      if (k == "initial") {
        fc.set_initial(*v);
      } else if (k == "min") {
        fc.set_min(*v);
      } else if (k == "max") {
        fc.set_max(*v);
      } else if (k == "success_bonus") {
        fc.set_success_bonus(*v);
      } else if (k == "failure_penalty") {
        fc.set_failure_penalty(*v);
      } else if (k == "random_min") {
        fc.set_random_min(*v);
      } else if (k == "random_max") {
        fc.set_random_max(*v);
      } else {
        return Error(kv.first, field,
                     "unknown key (expected initial, min, max, success_bonus, failure_penalty, "
                     "random_min, random_max)");
      }
    }
    return absl::OkStatus();
  }

  absl::Status Entry(const std::string& key, const YAML::Node& value, DpwaConfig& out) const {
    common::v1::GossipSpec& g = out.gossip;
    if (key == "nodes") return Nodes(value, out);
    if (key == "fetch_probability") {
      auto v = Number(value, key);
      if (!v.ok()) return v.status();
      if (*v < 0 || *v > 1) return Error(value, key, absl::StrCat("must be in [0, 1], got ", *v));
      g.set_fetch_probability(*v);
      return absl::OkStatus();
    }
    if (key == "timeout_ms") {
      auto v = Integer(value, key);
      if (!v.ok()) return v.status();
      if (*v < 1 || *v > 600000) {
        return Error(value, key, absl::StrCat("must be in 1..600000, got ", *v));
      }
      g.set_timeout_ms(static_cast<uint32_t>(*v));
      return absl::OkStatus();
    }
    if (key == "interpolation") {
      auto v = String(value, key);
      if (!v.ok()) return v.status();
      const std::string name = absl::AsciiStrToLower(*v);
      if (name == "constant") {
        g.set_interpolation(common::v1::INTERPOLATION_CONSTANT);
      } else if (name == "clock") {
        g.set_interpolation(common::v1::INTERPOLATION_CLOCK);
      } else if (name == "loss") {
        g.set_interpolation(common::v1::INTERPOLATION_LOSS);
      } else {
        return Error(
            value, key,
            absl::StrCat("unknown method ", QuoteBytes(*v), " (expected constant, clock, loss)"));
      }
      return absl::OkStatus();
    }
    if (key == "divergence_threshold") {
      auto v = Number(value, key);
      if (!v.ok()) return v.status();
      if (*v < 0) return Error(value, key, absl::StrCat("must be >= 0 (0 = off), got ", *v));
      g.set_divergence_threshold(*v);
      return absl::OkStatus();
    }
    if (key == "constant") {
      // dpwa writes `constant: { value: 0.5 }`; a bare number is accepted too.
      YAML::Node v = value;
      std::string field = "constant";
      if (value.IsMap()) {
        for (const auto& kv : value) {
          const std::string k = kv.first.as<std::string>();
          if (k != "value") return Error(kv.first, "constant." + k, "unknown key (expected value)");
        }
        v = value["value"];
        field = "constant.value";
        if (!v.IsDefined()) return Error(value, "constant", "value is required");
      }
      auto f = Number(v, field);
      if (!f.ok()) return f.status();
      if (*f < 0 || *f > 1) return Error(v, field, absl::StrCat("must be in [0, 1], got ", *f));
      g.set_constant_factor(*f);
      return absl::OkStatus();
    }
    if (key == "clock" || key == "loss") {
      return absl::OkStatus();  // dpwa: these methods take no settings (its sample writes 0)
    }
    if (key == "include_buffers") {
      auto v = Bool(value, key);
      if (!v.ok()) return v.status();
      g.set_include_buffers(*v);
      return absl::OkStatus();
    }
    if (key == "mix_post_step") {
      auto v = Bool(value, key);
      if (!v.ok()) return v.status();
      g.set_mix_post_step(*v);
      return absl::OkStatus();
    }
    if (key == "flow_control") return FlowControl(value, *g.mutable_flow_control());
    return absl::InvalidArgumentError(
        absl::StrCat(source_, ":", value.Mark().line + 1, ": ", EscapeBytes(key),
                     ": unknown key (expected nodes, fetch_probability, timeout_ms, interpolation, "
                     "divergence_threshold, constant, clock, loss, include_buffers, mix_post_step, "
                     "flow_control)"));
  }

  absl::StatusOr<DpwaConfig> Read(const YAML::Node& root) const {
    DpwaConfig out;
    std::set<std::string> seen;
    auto one = [&](const YAML::Node& k, const YAML::Node& v) -> absl::Status {
      if (!k.IsScalar()) return Error(k, "config", "keys must be strings");
      const std::string key = k.Scalar();
      if (!seen.insert(key).second) return Error(k, key, "set twice");
      return Entry(key, v, out);
    };
    if (root.IsSequence()) {
      for (size_t i = 0; i < root.size(); ++i) {
        const YAML::Node& item = root[i];
        if (!item.IsMap() || item.size() != 1) {
          return Error(item, absl::StrCat("item ", i + 1),
                       "expected a single-key map such as `- timeout_ms: 2500`");
        }
        for (const auto& kv : item) {
          if (absl::Status s = one(kv.first, kv.second); !s.ok()) return s;
        }
      }
    } else if (root.IsMap()) {
      for (const auto& kv : root) {
        if (absl::Status s = one(kv.first, kv.second); !s.ok()) return s;
      }
    } else {
      return Error(root, "config", "expected a list of single-key maps (dpwa's format)");
    }
    if (out.nodes.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(source_, ": nodes: required"));
    }
    if (absl::Status s = ValidateGossipSpec(out.gossip, ""); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(source_, ": ", s.message()));
    }
    return out;
  }

 private:
  std::string source_;
};

}  // namespace

std::string DpwaNode::address() const {
  if (host.find(':') != std::string::npos && host.front() != '[') {
    return absl::StrCat("[", host, "]:", port);
  }
  return absl::StrCat(host, ":", port);
}

const DpwaNode* DpwaConfig::Find(absl::string_view name) const {
  for (const DpwaNode& n : nodes) {
    if (n.name == name) return &n;
  }
  return nullptr;
}

absl::StatusOr<DpwaConfig> ParseDpwaConfig(absl::string_view text, absl::string_view source) {
  const std::string shown = EscapeBytes(source);
  if (text.size() > kMaxDpwaConfigBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(shown, ": the dpwa config is ", DescribeBytes(text.size()),
                     ", over the limit of ", DescribeBytes(kMaxDpwaConfigBytes)));
  }
  SHOAL_RETURN_IF_ERROR(CheckYamlDepth(text, source, kMaxDpwaConfigDepth));
  YAML::Node root;
  try {
    root = YAML::Load(std::string(text));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(shown, ":", e.mark.line + 1, ":",
                                                   e.mark.column + 1, ": ", EscapeBytes(e.msg)));
  }
  if (!root.IsDefined() || root.IsNull()) {
    return absl::InvalidArgumentError(absl::StrCat(shown, ": the dpwa config is empty"));
  }
  try {
    return Reader(source).Read(root);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(shown, ": ", EscapeBytes(e.what())));
  }
}

absl::StatusOr<DpwaConfig> LoadDpwaConfig(const std::string& path) {
  SHOAL_ASSIGN_OR_RETURN(std::string text, ReadSmallFile(path, kMaxDpwaConfigBytes, "dpwa config"));
  return ParseDpwaConfig(text, path);
}

}  // namespace shoal::gossip
