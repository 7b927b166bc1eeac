#include "services/shoalctl/node_format.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "libs/task/task_file.h"

namespace shoal::shoalctl {
namespace {

using coordinator::v1::NodeInfo;
using task::JsonNumber;
using task::JsonQuote;

const char* ReachabilityName(common::v1::Reachability r) {
  switch (r) {
    case common::v1::REACHABILITY_REACHABLE:
      return "reachable";
    case common::v1::REACHABILITY_UNREACHABLE:
      return "unreachable";
    default:
      return "unknown";
  }
}

// 1.5G, 512M; "-" for 0 (not reported).
std::string Size(uint64_t bytes) {
  if (bytes == 0) return "-";
  if (bytes >= (uint64_t{1} << 30)) {
    return absl::StrFormat("%.1fG", static_cast<double>(bytes) / (1 << 30));
  }
  return absl::StrFormat("%.0fM", static_cast<double>(bytes) / (1 << 20));
}

std::string Rate(double bytes_per_second) {
  if (bytes_per_second <= 0) return "-";
  if (bytes_per_second >= 1e9) return absl::StrFormat("%.2fGB/s", bytes_per_second / 1e9);
  return absl::StrFormat("%.1fMB/s", bytes_per_second / 1e6);
}

// The SUPERNODE column: a peer's "elected" or "offered", "on PEER" for an elected peer's
// aggregator, "-" otherwise.
std::string Supernode(const NodeInfo& n) {
  if (n.supernode().empty()) return "-";
  return n.role() == "aggregator" ? absl::StrCat("on ", n.supernode()) : n.supernode();
}

}  // namespace

std::string NodeToJson(const NodeInfo& n) {
  const common::v1::Capacity& c = n.capacity();
  return absl::StrCat("{\"id\":", JsonQuote(n.id()), ",\"role\":", JsonQuote(n.role()),
                      ",\"address\":", JsonQuote(n.address()),
                      ",\"device\":", JsonQuote(n.device()), ",\"task\":", JsonQuote(n.task()),
                      ",\"since_unix_ms\":", n.since_unix_ms(), ",\"cpu_cores\":", c.cpu_cores(),
                      ",\"matmul_gflops\":", JsonNumber(c.matmul_gflops()),
                      ",\"memory_bytes\":", c.memory_bytes(),
                      ",\"memory_available_bytes\":", c.memory_available_bytes(),
                      ",\"upload_bytes_per_second\":", JsonNumber(c.upload_bytes_per_second()),
                      ",\"upload_probe_bytes\":", c.upload_probe_bytes(),
                      ",\"reachability\":", JsonQuote(ReachabilityName(c.reachability())),
                      ",\"supernode\":", JsonQuote(n.supernode()), "}");
}

std::string NodesToJson(const Nodes& nodes) {
  std::vector<std::string> items;
  items.reserve(nodes.size());
  for (const NodeInfo& n : nodes) items.push_back(NodeToJson(n));
  return absl::StrCat("[", absl::StrJoin(items, ","), "]");
}

std::string FormatNodeTable(const Nodes& nodes) {
  size_t id_width = 2, address_width = 7, task_width = 4;
  for (const NodeInfo& n : nodes) {
    id_width = std::max(id_width, n.id().size());
    address_width = std::max(address_width, n.address().size());
    task_width = std::max(task_width, n.task().size());
  }
  std::string out =
      absl::StrFormat("%-*s  %-10s  %-*s  %-*s  %5s  %7s  %7s  %7s  %10s  %-11s  %s\n", id_width,
                      "ID", "ROLE", address_width, "ADDRESS", task_width, "TASK", "CORES",
                      "GFLOP/S", "MEMORY", "FREE", "UPLOAD", "REACHABLE", "SUPERNODE");
  for (const NodeInfo& n : nodes) {
    const common::v1::Capacity& c = n.capacity();
    const std::string role =
        n.role() == "peer" && !n.device().empty() ? absl::StrCat("peer/", n.device()) : n.role();
    absl::StrAppend(
        &out,
        absl::StrFormat(
            "%-*s  %-10s  %-*s  %-*s  %5s  %7s  %7s  %7s  %10s  %-11s  %s\n", id_width, n.id(),
            role, address_width, n.address(), task_width, n.task().empty() ? "-" : n.task(),
            c.cpu_cores() == 0 ? "-" : absl::StrCat(c.cpu_cores()),
            c.matmul_gflops() > 0 ? absl::StrFormat("%.1f", c.matmul_gflops()) : "-",
            Size(c.memory_bytes()), Size(c.memory_available_bytes()),
            Rate(c.upload_bytes_per_second()), ReachabilityName(c.reachability()), Supernode(n)));
  }
  return out;
}

std::string FormatNodeList(const coordinator::v1::ListNodesResponse& nodes) {
  Nodes all = nodes.peers();
  all.MergeFrom(nodes.aggregators());
  if (all.empty()) return "no peers are connected and no aggregator is registered\n";
  return FormatNodeTable(all);
}

std::string NodeListToJson(const coordinator::v1::ListNodesResponse& nodes) {
  return absl::StrCat("{\"peers\":", NodesToJson(nodes.peers()),
                      ",\"aggregators\":", NodesToJson(nodes.aggregators()), "}");
}

}  // namespace shoal::shoalctl
