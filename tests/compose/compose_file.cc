#include "tests/compose/compose_file.h"

#include <yaml-cpp/yaml.h>

#include <cstdlib>
#include <fstream>
#include <regex>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace shoal::testing {
namespace {

// A copy of `node` with YAML merge keys (`<<: *anchor`, `<<: [*a, *b]`) applied at every
// level: merged entries first, the map's own entries override them.
YAML::Node ResolveMerges(const YAML::Node& node) {
  if (node.IsSequence()) {
    YAML::Node out(YAML::NodeType::Sequence);
    for (const YAML::Node& item : node) out.push_back(ResolveMerges(item));
    return out;
  }
  if (!node.IsMap()) return node;
  YAML::Node out(YAML::NodeType::Map);
  if (const YAML::Node merge = node["<<"]; merge) {
    std::vector<YAML::Node> sources;
    if (merge.IsSequence()) {
      for (const YAML::Node& m : merge) sources.push_back(m);
    } else {
      sources.push_back(merge);
    }
    for (const YAML::Node& source : sources) {
      const YAML::Node resolved = ResolveMerges(source);
      if (!resolved.IsMap()) continue;
      for (const auto& kv : resolved) out[kv.first.as<std::string>()] = kv.second;
    }
  }
  for (const auto& kv : node) {
    const std::string key = kv.first.as<std::string>();
    if (key == "<<") continue;
    out[key] = ResolveMerges(kv.second);
  }
  return out;
}

absl::StatusOr<std::vector<std::string>> StringList(const YAML::Node& node,
                                                    const std::string& what) {
  std::vector<std::string> out;
  if (!node) return out;
  if (!node.IsSequence()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": expected a list (exec form)"));
  }
  for (const YAML::Node& item : node) {
    if (!item.IsScalar()) return absl::InvalidArgumentError(absl::StrCat(what, ": not a string"));
    out.push_back(item.as<std::string>());
  }
  return out;
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

absl::StatusOr<ComposeService> ParseService(const std::string& name, const YAML::Node& node) {
  ComposeService s;
  s.name = name;
  const std::string where = absl::StrCat("services.", name);
  if (!node.IsMap()) return absl::InvalidArgumentError(where + ": not a map");
  if (node["image"]) s.image = node["image"].as<std::string>();
  s.build = static_cast<bool>(node["build"]);
  if (node["build"] && node["build"].IsMap() && node["build"]["dockerfile"]) {
    s.dockerfile = node["build"]["dockerfile"].as<std::string>();
  }
  if (node["restart"]) s.restart = node["restart"].as<std::string>();
  auto entrypoint = StringList(node["entrypoint"], where + ".entrypoint");
  if (!entrypoint.ok()) return entrypoint.status();
  s.entrypoint = *entrypoint;
  auto command = StringList(node["command"], where + ".command");
  if (!command.ok()) return command.status();
  s.command = *command;
  if (const YAML::Node hc = node["healthcheck"]; hc) {
    s.healthcheck_disabled = hc["disable"] && hc["disable"].as<bool>();
    auto test = StringList(hc["test"], where + ".healthcheck.test");
    if (!test.ok()) return test.status();
    if (!test->empty()) {
      if ((*test)[0] == "NONE") {
        s.healthcheck_disabled = true;
      } else if ((*test)[0] != "CMD") {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ".healthcheck.test: expected [\"CMD\", ...] (exec form)"));
      } else {
        s.healthcheck.assign(test->begin() + 1, test->end());
      }
    }
  }
  auto volumes = StringList(node["volumes"], where + ".volumes");
  if (!volumes.ok()) return volumes.status();
  s.volumes = *volumes;
  auto ports = StringList(node["ports"], where + ".ports");
  if (!ports.ok()) return ports.status();
  s.ports = *ports;
  auto profiles = StringList(node["profiles"], where + ".profiles");
  if (!profiles.ok()) return profiles.status();
  s.profiles = *profiles;
  if (const YAML::Node deps = node["depends_on"]; deps) {
    if (deps.IsSequence()) {
      for (const YAML::Node& d : deps) s.depends_on[d.as<std::string>()] = "service_started";
    } else {
      for (const auto& kv : deps) {
        const YAML::Node condition = kv.second["condition"];
        s.depends_on[kv.first.as<std::string>()] =
            condition ? condition.as<std::string>() : "service_started";
      }
    }
  }
  if (const YAML::Node env = node["environment"]; env) {
    if (env.IsMap()) {
      for (const auto& kv : env)
        s.environment[kv.first.as<std::string>()] = kv.second.as<std::string>();
    } else {
      for (const YAML::Node& e : env) {
        const std::string text = e.as<std::string>();
        const size_t eq = text.find('=');
        s.environment[text.substr(0, eq)] = eq == std::string::npos ? "" : text.substr(eq + 1);
      }
    }
  }
  return s;
}

}  // namespace

namespace {

// ${NAME} and ${NAME:-DEFAULT} (DEFAULT also when NAME is set but empty), as compose reads them.
std::string Interpolate(const std::string& text) {
  static const std::regex kVariable(R"(\$\{([A-Za-z_][A-Za-z0-9_]*)(:-([^}]*))?\})");
  std::string out;
  auto begin = std::sregex_iterator(text.begin(), text.end(), kVariable);
  size_t at = 0;
  for (auto it = begin; it != std::sregex_iterator(); ++it) {
    const std::smatch& m = *it;
    out += text.substr(at, static_cast<size_t>(m.position()) - at);
    const char* value = std::getenv(m[1].str().c_str());
    out += value != nullptr && *value != '\0' ? std::string(value) : m[3].str();
    at = static_cast<size_t>(m.position() + m.length());
  }
  return out + text.substr(at);
}

}  // namespace

std::vector<std::string> ComposeService::Argv() const {
  std::vector<std::string> argv = entrypoint;
  argv.insert(argv.end(), command.begin(), command.end());
  for (std::string& arg : argv) arg = Interpolate(arg);
  return argv;
}

std::string ComposeService::Flag(const std::string& flag) const {
  const std::vector<std::string> argv = Argv();
  const std::string dashed = "--" + flag;
  for (size_t i = 0; i < argv.size(); ++i) {
    if (argv[i] == dashed && i + 1 < argv.size()) return argv[i + 1];
    if (absl::StartsWith(argv[i], dashed + "=")) return argv[i].substr(dashed.size() + 1);
  }
  return "";
}

bool ComposeService::RunsShoalImage() const {
  return (build && dockerfile.empty()) || absl::StartsWith(image, "shoal:");
}

const ComposeService* ComposeFile::Find(const std::string& name) const {
  for (const ComposeService& s : services) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

absl::StatusOr<ComposeFile> LoadComposeFile(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) return text.status();
  YAML::Node root;
  try {
    root = ResolveMerges(YAML::Load(*text));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", e.what()));
  }
  ComposeFile file;
  if (!root["services"] || !root["services"].IsMap()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": no services map"));
  }
  try {
    for (const auto& kv : root["services"]) {
      absl::StatusOr<ComposeService> s = ParseService(kv.first.as<std::string>(), kv.second);
      if (!s.ok())
        return absl::InvalidArgumentError(absl::StrCat(path, ": ", s.status().message()));
      file.services.push_back(*std::move(s));
    }
    if (root["volumes"] && root["volumes"].IsMap()) {
      for (const auto& kv : root["volumes"]) file.volumes.push_back(kv.first.as<std::string>());
    }
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", e.what()));
  }
  return file;
}

std::vector<std::string> Words(const std::string& text) {
  return absl::StrSplit(text, absl::ByAnyChar(" \t"), absl::SkipEmpty());
}

absl::StatusOr<std::vector<std::string>> ParseExecForm(const std::string& text) {
  const std::string trimmed(absl::StripAsciiWhitespace(text));
  if (!absl::StartsWith(trimmed, "[")) {
    return absl::InvalidArgumentError(absl::StrCat("not exec form: ", trimmed));
  }
  try {
    return StringList(YAML::Load(trimmed), "exec form");
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("bad exec form ", trimmed, ": ", e.what()));
  }
}

absl::StatusOr<std::vector<DockerStage>> LoadDockerfile(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) return text.status();
  std::vector<DockerStage> stages;
  std::string pending;
  int pending_line = 0;
  int line_number = 0;
  auto flush = [&]() -> absl::Status {
    const std::string joined(absl::StripAsciiWhitespace(pending));
    pending.clear();
    if (joined.empty()) return absl::OkStatus();
    const size_t space = joined.find_first_of(" \t");
    DockerInstruction instruction;
    instruction.keyword = absl::AsciiStrToUpper(joined.substr(0, space));
    instruction.args = space == std::string::npos
                           ? ""
                           : std::string(absl::StripAsciiWhitespace(joined.substr(space)));
    instruction.line = pending_line;
    if (instruction.keyword == "FROM") {
      std::vector<std::string> words = Words(instruction.args);
      DockerStage stage;
      for (size_t i = 0; i < words.size(); ++i) {
        if (absl::StartsWith(words[i], "--")) continue;
        if (absl::AsciiStrToUpper(words[i]) == "AS" && i + 1 < words.size()) {
          stage.name = words[++i];
        } else if (stage.base.empty()) {
          stage.base = words[i];
        }
      }
      stages.push_back(std::move(stage));
      return absl::OkStatus();
    }
    if (stages.empty()) {
      if (instruction.keyword == "ARG") return absl::OkStatus();
      return absl::InvalidArgumentError(
          absl::StrCat(path, ":", pending_line, ": ", instruction.keyword, " before any FROM"));
    }
    stages.back().instructions.push_back(std::move(instruction));
    return absl::OkStatus();
  };
  for (absl::string_view raw : absl::StrSplit(*text, '\n')) {
    ++line_number;
    std::string line(absl::StripTrailingAsciiWhitespace(raw));
    const std::string stripped(absl::StripLeadingAsciiWhitespace(line));
    if (absl::StartsWith(stripped, "#")) continue;  // comments, also inside continuations
    if (pending.empty()) pending_line = line_number;
    if (absl::EndsWith(line, "\\")) {
      line.pop_back();
      absl::StrAppend(&pending, line, " ");
      continue;
    }
    absl::StrAppend(&pending, line);
    if (absl::Status s = flush(); !s.ok()) return s;
  }
  if (absl::Status s = flush(); !s.ok()) return s;
  return stages;
}

}  // namespace shoal::testing
