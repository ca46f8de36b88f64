#!/usr/bin/env bash
# progress.sh WHAT COMMAND...: runs COMMAND and, while it runs, prints
# "  ... still WHAT (1m30s)" every 30 seconds, so a long first-time build
# (kube-apiserver: ~10 minutes on 2 cores) does not look like a hang.
# Exits with COMMAND's status; Ctrl-C stops both.
set -uo pipefail
what=$1
shift
"$@" &
pid=$!
trap 'kill "$pid" 2>/dev/null; exit 130' INT TERM
start=$SECONDS
while kill -0 "$pid" 2>/dev/null; do
	for _ in $(seq 30); do
		sleep 1
		kill -0 "$pid" 2>/dev/null || break 2
	done
	elapsed=$((SECONDS - start))
	printf '   ... still %s (%dm%02ds)\n' "$what" $((elapsed / 60)) $((elapsed % 60))
done
wait "$pid"
