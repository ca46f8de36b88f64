#!/usr/bin/env bash
# Prints a short summary of a failed `go test` log: each failing test and the
# lines its test code logged (file.go:NN: ...), without the long dumps (node
# consoles, router logs) that follow them. CI logs keep only their head and
# tail; this puts the reason for a failure in the tail.
set -euo pipefail
log=${1:?usage: failures.sh go-test.log}
echo
echo "==== failure summary (from $log) ===="
grep -E '^(--- FAIL|\s+--- FAIL|FAIL\s|panic:|\s+[A-Za-z0-9_]+\.go:[0-9]+: )' "$log" | cut -c1-300 | tail -n 150 || true
