#include "tests/testing/http_get.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace shoal::testing {

absl::StatusOr<std::string> HttpGet(const std::string& address, const std::string& path) {
  std::vector<std::string> parts = absl::StrSplit(address, ':');
  int port = 0;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[1], &port)) {
    return absl::InvalidArgumentError("bad address " + address);
  }
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, parts[0].c_str(), &addr.sin_addr);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return absl::UnavailableError("cannot connect to " + address);
  }
  const std::string request =
      absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: ", address, "\r\n\r\n");
  if (::write(fd, request.data(), request.size()) != static_cast<ssize_t>(request.size())) {
    ::close(fd);
    return absl::UnavailableError("write failed");
  }
  std::string response;
  char buf[8192];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof(buf))) > 0) response.append(buf, static_cast<size_t>(n));
  ::close(fd);
  const size_t body = response.find("\r\n\r\n");
  if (body == std::string::npos) return absl::DataLossError("no HTTP body from " + address);
  return response.substr(body + 4);
}

double MetricValue(const std::string& page, const std::string& name) {
  const std::string prefix = name + " ";
  for (size_t at = page.find(prefix); at != std::string::npos; at = page.find(prefix, at + 1)) {
    if (at != 0 && page[at - 1] != '\n') continue;
    const size_t start = at + prefix.size();
    double value = -1;
    if (absl::SimpleAtod(page.substr(start, page.find('\n', start) - start), &value)) return value;
  }
  return -1;
}

}  // namespace shoal::testing
