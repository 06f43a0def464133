#!/usr/bin/env bash
# Captures the three corpora of docs/encoding.md with sonde itself and stores them here
# as gzip-compressed OTLP ProfilesData. Needs root (BPF), a C compiler, Go and python3.
# Every workload is bounded in time and talks only to 127.0.0.1.
#
#   make build && docs/encoding/testdata/capture.sh            # all three
#   docs/encoding/testdata/capture.sh deep                     # one of them
#
# Profiles differ run to run (timing, addresses, what else the host runs), so a new
# capture changes the study's numbers a little, not its conclusions.
set -euo pipefail

repo=$(cd "$(dirname "$0")/../../.." && pwd)
out="$repo/docs/encoding/testdata"
sonde=${SONDE:-$repo/bin/sonde}
work=$(mktemp -d)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	rm -rf "$work"
}
trap cleanup EXIT

[ -x "$sonde" ] || { echo "capture: $sonde missing: run make build" >&2; exit 1; }
cc -O1 -g -fno-inline -fno-optimize-sibling-calls -o "$work/deep" "$out/progs/deep/deep.c" -lm
(cd "$repo" && go build -o "$work/svc" ./docs/encoding/testdata/progs/svc)

keep() { # keep NAME: gzip the capture into testdata
	gzip -9 -n -c "$work/$1.otlp.pb" >"$out/$1.otlp.pb.gz"
	echo "capture: $out/$1.otlp.pb.gz ($(stat -c %s "$out/$1.otlp.pb.gz") bytes)"
}

# average: an HTTP service with three middlewares and JSON/HTML/gzip handlers, sampled
# alone at 199 Hz while four clients load it. GOGC=400 keeps the GC from dwarfing the
# handlers, as services tuned for throughput do.
average() {
	GOGC=400 "$work/svc" -listen 127.0.0.1:18080 & local srv=$!
	pids+=("$srv")
	sleep 0.5
	"$work/svc" -load http://127.0.0.1:18080 -for 13s -workers 4 & local load=$!
	sleep 1
	"$sonde" --pid "$srv" --duration 10s --timestamps --top 0 --output "$work/average.otlp.pb"
	wait "$load"
	kill "$srv"
	keep average
}

# deep: interpreter-like recursion 90-120 calls deep, one thread, 199 Hz.
deep() {
	"$work/deep" 14 & local p=$!
	sleep 1
	"$sonde" --pid "$p" --duration 10s --timestamps --top 0 --output "$work/deep.otlp.pb"
	wait "$p"
	keep deep
}

# large: the whole host at 199 Hz while a cold-cache Go build, the HTTP service under
# load and a Python program share it, besides whatever else the host runs.
large() {
	(cd "$repo" && GOCACHE="$work/gocache" timeout 25 go build -o /dev/null ./cmd/agent) & local build=$!
	GOGC=400 "$work/svc" -listen 127.0.0.1:18081 & local srv=$!
	pids+=("$srv")
	sleep 0.5
	"$work/svc" -load http://127.0.0.1:18081 -for 18s -workers 2 & local load=$!
	python3 - <<'PY' & local py=$!
import json, re, time
end = time.time() + 18
doc = {"items": [{"id": i, "name": "item-%d" % i, "tags": ["a", "b"] * (i % 5)} for i in range(300)]}
pat = re.compile(r"item-(\d+)7")
while time.time() < end:
    s = json.dumps(doc)
    sum(int(m.group(1)) for m in pat.finditer(s))
    json.loads(s)
PY
	sleep 1
	"$sonde" --frequency 199 --duration 15s --timestamps --top 0 --output "$work/large.otlp.pb"
	wait "$load" "$py"
	wait "$build" || true # the build may outlast its time limit; it is only load
	kill "$srv"
	keep large
}

for c in "${@:-average deep large}"; do
	for name in $c; do "$name"; done
done
