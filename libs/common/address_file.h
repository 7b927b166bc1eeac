#pragma once

#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace shoal {

// Services started with `--address-file PATH` write the addresses they actually bound there
// (one `key=HOST:PORT` per line, e.g. grpc=127.0.0.1:40123 and metrics=127.0.0.1:40124), so a
// launcher or a test can start them on port 0. The file is replaced atomically.
absl::Status WriteAddressFile(const std::string& path,
                              const std::map<std::string, std::string>& addresses);
absl::StatusOr<std::map<std::string, std::string>> ReadAddressFile(const std::string& path);

}  // namespace shoal
