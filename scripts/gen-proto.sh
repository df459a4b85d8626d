#!/usr/bin/env bash
# Regenerates the Go code for envd's protobuf services (api/proto → api/gen).
# The plugin versions are pinned to the protobuf / connect versions in go.mod so the
# generated code matches the runtime libraries it is compiled against.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

protoc_bin="${PROTOC:-protoc}"
command -v "$protoc_bin" >/dev/null || { echo "protoc not found (apt-get install protobuf-compiler)" >&2; exit 1; }

modver() { go list -m -f '{{.Version}}' "$1"; }
pb_ver="$(modver google.golang.org/protobuf)"
connect_ver="$(modver connectrpc.com/connect)"

gobin="${GEN_GOBIN:-${XDG_CACHE_HOME:-$HOME/.cache}/airlock/protoc-bin}"
mkdir -p "$gobin"
stamp="$gobin/versions"
want="protobuf=$pb_ver connect=$connect_ver"
if [[ ! -x "$gobin/protoc-gen-go" || ! -x "$gobin/protoc-gen-connect-go" || "$(cat "$stamp" 2>/dev/null)" != "$want" ]]; then
  GOBIN="$gobin" go install "google.golang.org/protobuf/cmd/protoc-gen-go@$pb_ver"
  GOBIN="$gobin" go install "connectrpc.com/connect/cmd/protoc-gen-connect-go@$connect_ver"
  echo "$want" >"$stamp"
fi

# The well-known types (timestamp.proto) ship with protoc in its include dir.
include_dir="${PROTOC_INCLUDE:-/usr/include}"

rm -rf api/gen
mkdir -p api/gen
PATH="$gobin:$PATH" "$protoc_bin" \
  -I api/proto -I "$include_dir" \
  --go_out=api/gen --go_opt=paths=source_relative \
  --connect-go_out=api/gen --connect-go_opt=paths=source_relative \
  api/proto/process/process.proto api/proto/filesystem/filesystem.proto
echo "generated into api/gen"
