#pragma once

#include <string>

#include "google/protobuf/repeated_ptr_field.h"
#include "shoal/coordinator/v1/control.pb.h"

namespace shoal::shoalctl {

using Nodes = google::protobuf::RepeatedPtrField<coordinator::v1::NodeInfo>;

// One node as a JSON object: id, role, address, device, task, since_unix_ms and its capacity
// (cpu_cores, matmul_gflops, memory_bytes, memory_available_bytes, upload_bytes_per_second,
// upload_probe_bytes, reachability: "reachable", "unreachable" or "unknown").
std::string NodeToJson(const coordinator::v1::NodeInfo& node);
std::string NodesToJson(const Nodes& nodes);

// A table of nodes with their capacity, one line each after a header:
// ID  ROLE  ADDRESS  TASK  CORES  GFLOP/S  MEMORY  FREE  UPLOAD  REACHABLE
std::string FormatNodeTable(const Nodes& nodes);

// `shoalctl peers`: the peers' table, then the aggregators'.
std::string FormatNodeList(const coordinator::v1::ListNodesResponse& nodes);
std::string NodeListToJson(const coordinator::v1::ListNodesResponse& nodes);

}  // namespace shoal::shoalctl
