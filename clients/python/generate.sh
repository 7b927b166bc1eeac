#!/usr/bin/env bash
# Usage: clients/python/generate.sh [OUT_DIR]
# Generates the Python protobuf and gRPC modules of the coordinator's ControlService (and the
# protos it imports) from protos/ into OUT_DIR (default: clients/python/shoal_client/_gen, where
# they are checked in), with Debian's protoc and grpc_python_plugin. protoc writes
# `from shoal.common.v1 import task_pb2`; the imports are rewritten to
# `from shoal_client._gen.shoal.common.v1 import task_pb2`, so the modules live inside the
# package and add no top-level `shoal` module. tests/python/client_stubs_test.py checks that the
# checked-in copy matches a fresh run.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${1:-$here/shoal_client/_gen}
plugin=${GRPC_PYTHON_PLUGIN:-/usr/bin/grpc_python_plugin}
command -v protoc >/dev/null || { echo "generate.sh: protoc is not installed" >&2; exit 1; }
if [[ ! -x "$plugin" ]]; then
  echo "generate.sh: $plugin is not installed (protobuf-compiler-grpc)" >&2
  exit 1
fi

messages=(shoal/common/v1/capacity.proto shoal/common/v1/model.proto shoal/common/v1/task.proto
  shoal/common/v1/tensor.proto shoal/coordinator/v1/control.proto)
services=(shoal/coordinator/v1/control.proto)

rm -rf "$out/shoal"
mkdir -p "$out"
protoc -I "$root/protos" --python_out="$out" "${messages[@]/#/$root/protos/}"
protoc -I "$root/protos" --plugin=protoc-gen-grpc_python="$plugin" --grpc_python_out="$out" \
  "${services[@]/#/$root/protos/}"
find "$out/shoal" -name '*.py' -exec sed -i 's/^from shoal\./from shoal_client._gen.shoal./' {} +
for dir in $(find "$out" -type d); do
  [[ -f "$dir/__init__.py" ]] || : > "$dir/__init__.py"
done
