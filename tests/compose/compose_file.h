#pragma once

// Reading docker-compose.yml and the Dockerfile for the container checks: the static rules test
// and the test that runs the compose services' commands as plain processes. Only the parts of
// the formats Shoal's files use (compose exec-form lists, YAML anchors and `<<` merge keys,
// Dockerfile instructions with `\` continuations).

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace shoal::testing {

struct ComposeService {
  std::string name;
  std::string image;  // "" when only `build` is given
  bool build = false;
  std::string dockerfile;               // build.dockerfile; "" = the context's Dockerfile
  std::string restart;                  // "" = compose's default ("no")
  std::vector<std::string> entrypoint;  // exec form; empty = the image's
  std::vector<std::string> command;     // exec form
  // The health check command without its leading "CMD"; empty when none or disabled.
  std::vector<std::string> healthcheck;
  bool healthcheck_disabled = false;
  std::vector<std::string> volumes;  // "SOURCE:TARGET[:MODE]"
  std::vector<std::string> ports;
  std::vector<std::string> profiles;
  std::map<std::string, std::string> depends_on;  // service -> condition
  std::map<std::string, std::string> environment;

  // entrypoint followed by command: what the container runs, with ${NAME} and ${NAME:-DEFAULT}
  // replaced from the environment as compose does.
  std::vector<std::string> Argv() const;
  // The value of `--flag VALUE` or `--flag=VALUE` in Argv(), or "".
  std::string Flag(const std::string& flag) const;
  // Whether it runs Shoal's image: built from the repository's Dockerfile, or image shoal:*.
  bool RunsShoalImage() const;
};

struct ComposeFile {
  std::vector<ComposeService> services;  // in file order
  std::vector<std::string> volumes;      // named volumes declared at the top level

  const ComposeService* Find(const std::string& name) const;
};

// Errors: NOT_FOUND unreadable file; INVALID_ARGUMENT bad YAML or a field of an unexpected
// shape (a shell-form string where an exec-form list is expected), naming the service.
absl::StatusOr<ComposeFile> LoadComposeFile(const std::string& path);

struct DockerInstruction {
  std::string keyword;  // upper case, e.g. "FROM", "COPY"
  std::string args;     // the rest of the (joined) line
  int line = 0;         // where it starts, 1-based
};

struct DockerStage {
  std::string base;                             // FROM's image
  std::string name;                             // FROM ... AS name, or ""
  std::vector<DockerInstruction> instructions;  // after FROM
};

// Errors: NOT_FOUND unreadable; INVALID_ARGUMENT an instruction before the first FROM.
absl::StatusOr<std::vector<DockerStage>> LoadDockerfile(const std::string& path);

// Splits a Dockerfile exec form (`["a", "b"]`) into words; INVALID_ARGUMENT for shell form.
absl::StatusOr<std::vector<std::string>> ParseExecForm(const std::string& text);

// The whitespace-separated words of `text`.
std::vector<std::string> Words(const std::string& text);

}  // namespace shoal::testing
