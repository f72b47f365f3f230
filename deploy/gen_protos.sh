#!/usr/bin/env bash
# Generate the Python code of protos/tandem/v1/*.proto into tandem/v1/.
#
#   deploy/gen_protos.sh          regenerate tandem/v1/*_pb2*.py(i) in place
#   deploy/gen_protos.sh --check  generate into a temp dir and compare with
#                                 tandem/v1; exit 1 naming every differing,
#                                 missing or stale file (for CI)
#
# Generated with -I protos so the output lands in tandem/v1/ and imports read
# `from tandem.v1 import data_pb2` with no rewriting. Never edit the output.
# Uses grpcio-tools (pinned in requirements.txt) so every machine emits the
# same bytes.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python}"

generate() {  # $1 = output root (tandem/v1 is created beneath it)
  mkdir -p "$1"
  "$PYTHON" -m grpc_tools.protoc -I protos \
    --python_out="$1" --pyi_out="$1" --grpc_python_out="$1" \
    protos/tandem/v1/*.proto
}

case "${1:-}" in
  "")
    rm -f tandem/v1/*_pb2.py tandem/v1/*_pb2.pyi tandem/v1/*_pb2_grpc.py
    generate .
    [ -f tandem/v1/__init__.py ] || : > tandem/v1/__init__.py
    echo "generated: $(cd tandem/v1 && ls *_pb2*.py* | tr '\n' ' ')"
    ;;
  --check)
    TMP="$(mktemp -d)"
    trap 'rm -rf "$TMP"' EXIT
    generate "$TMP"
    bad=()
    for f in "$TMP"/tandem/v1/*; do
      name="$(basename "$f")"
      if [ ! -f "tandem/v1/$name" ]; then
        bad+=("tandem/v1/$name (missing)")
      elif ! cmp -s "$f" "tandem/v1/$name"; then
        bad+=("tandem/v1/$name (differs)")
      fi
    done
    for f in tandem/v1/*_pb2.py tandem/v1/*_pb2.pyi tandem/v1/*_pb2_grpc.py; do
      [ -e "$f" ] || continue
      [ -f "$TMP/tandem/v1/$(basename "$f")" ] || bad+=("$f (stale: no proto generates it)")
    done
    if [ "${#bad[@]}" -gt 0 ]; then
      echo "generated code is out of date with protos/; run deploy/gen_protos.sh:" >&2
      printf '  %s\n' "${bad[@]}" >&2
      exit 1
    fi
    echo "generated code matches protos/"
    ;;
  *)
    echo "usage: $0 [--check]" >&2
    exit 2
    ;;
esac
