#!/usr/bin/env bash
# scripts/bench.sh [GO-BENCH-OUTPUT]
#
# The figures of docs/BENCHMARKS.md, as one table of medians:
#   - pause and continue of real trees of sleeping processes under a real
#     supervised launch (the Go benchmarks of pkg/reaper), for each tree and
#     method (default: signals, the cgroup only in a fork storm; cgroup:
#     freeze first; signal: never the cgroup);
#   - a pause of 64 launches of 7 processes in one call, each launch paused
#     on its own against every pause begun first (BenchmarkPauseBatch64);
#   - the stripped static sizes of bin/ngsup-linux-{amd64,arm64};
#   - the wall time of `bin/ngsup version`;
#   - the wall time of the CLI `ngsup pause` and `ngsup continue` on a
#     1,000-process flat tree (process start included);
#   - the stop of a fork storm whose supervisor is gone, with the launch's
#     cgroup and without (BenchmarkStopStorm*), and the CPU an idle
#     supervisor of the flat 1,000 tree uses, running and paused
#     (BenchmarkSupervisorIdleFlat1000).
#
# With an argument it reads that file of `go test -bench` output instead of
# running the Go benchmarks. Needs root (the benchmarks skip otherwise).
# Knobs: BENCH_PATTERN (Pause) selects the pause benchmarks, run
# BENCH_COUNT (default 5) times with BENCH_TIMES (default 5) pauses each;
# STORM_PATTERN (StopStorm|SupervisorIdle) the stop and idle benchmarks, run
# STORM_COUNT (3) times with STORM_TIMES (3) storms (or idle windows) each;
# an empty pattern skips those. NGSUP_BENCH_STOP_BIN=PATH times that ngsup
# binary's stop of the storm instead of this tree's (an older ngsup).
# VERSION_RUNS (200); CLI_RUNS (20).
# SEED_PATTERN (SeedWalk) selects the comparison with the seed's walk
# (BenchmarkSeedWalkFlat{1000,4000,10000}: the CLI `ngsup pause` of
# $BIN/ngsup against scripts/seedwalk.py, and against the ngsup binary
# NGSUP_BENCH_OLD_BIN when set, on the same tree in the same run), SEED_TIMES
# (5) rounds of each; an empty pattern skips it.
set -euo pipefail
cd "$(dirname "$0")/.."

GO=${GO:-go}
BIN=${BIN:-bin}
BENCH_COUNT=${BENCH_COUNT:-5}
BENCH_TIMES=${BENCH_TIMES:-5}
BENCH_PATTERN=${BENCH_PATTERN-Pause}
STORM_PATTERN=${STORM_PATTERN-StopStorm|SupervisorIdle}
STORM_COUNT=${STORM_COUNT:-3}
STORM_TIMES=${STORM_TIMES:-3}
SEED_PATTERN=${SEED_PATTERN-SeedWalk}
SEED_TIMES=${SEED_TIMES:-5}
VERSION_RUNS=${VERSION_RUNS:-200}
CLI_RUNS=${CLI_RUNS:-20}
NGSUP=$BIN/ngsup

if [ ! -x "$NGSUP" ] || [ ! -f "$BIN/ngsup-linux-amd64" ] || [ ! -f "$BIN/ngsup-linux-arm64" ]; then
	make build >&2
fi

# median: the median of the numbers on stdin, one a line ("-" if none).
median() {
	sort -g | awk '{ v[NR] = $1 } END {
		if (NR == 0) { print "-"; exit }
		if (NR % 2) printf "%.2f\n", v[(NR + 1) / 2]
		else printf "%.2f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
# median3: median with three decimals (for ratios).
median3() {
	sort -g | awk '{ v[NR] = $1 } END {
		if (NR == 0) { print "-"; exit }
		if (NR % 2) printf "%.3f\n", v[(NR + 1) / 2]
		else printf "%.3f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
# range: "min-max" of the numbers on stdin.
range() {
	sort -g | awk 'NR == 1 { lo = $1 } { hi = $1 } END { if (NR) printf "%.1f-%.1f\n", lo, hi; else print "-" }'
}
# now_us: the wall clock in microseconds, without starting a process.
now_us() {
	local t=${EPOCHREALTIME/./}
	echo "$t"
}

echo "# bench.sh: $(git describe --tags --always --dirty 2>/dev/null || echo unknown), $(date -u +%Y-%m-%dT%H:%M:%SZ), $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg)"

# --- 1. The Go benchmarks -------------------------------------------------
if [ $# -ge 1 ]; then
	raw=$1
else
	raw=$BIN/bench.txt
	mkdir -p "$BIN"
	: >"$raw"
	# gobench PATTERN TIMES COUNT: one run of the Go benchmarks, appended to $raw.
	gobench() {
		[ -n "$1" ] || return 0
		echo "running: $GO test -run '^\$' -bench '$1' -benchtime ${2}x -count $3 ./pkg/reaper/ (output in $raw; load average $(cut -d' ' -f1-3 /proc/loadavg))" >&2
		$GO test -run '^$' -bench "$1" -benchtime "${2}x" -count "$3" -timeout 60m ./pkg/reaper/ >>"$raw" 2>&1 || {
			tail -40 "$raw" >&2
			echo "bench.sh: the Go benchmarks failed; see $raw" >&2
			exit 1
		}
	}
	gobench "$BENCH_PATTERN" "$BENCH_TIMES" "$BENCH_COUNT"
	gobench "$STORM_PATTERN" "$STORM_TIMES" "$STORM_COUNT"
	NGSUP_BENCH_BIN=$(realpath "$NGSUP") gobench "$SEED_PATTERN" "$SEED_TIMES" 1
	grep -E '^(Benchmark|goos|goarch|cpu|PASS|ok)' "$raw" >&2 || true
fi
if grep -q -- '--- SKIP' "$raw"; then
	grep -A2 -- '--- SKIP' "$raw" >&2
fi

# samples KEY FIELD: the FIELD values of the BENCHSAMPLE lines of tree/method KEY.
samples() {
	local tree=${1%/*} method=${1#*/} field=$2
	{ grep -o "BENCHSAMPLE tree=$tree method=$method .*" "$raw" || true; } |
		tr ' ' '\n' | sed -n "s/^$field=//p"
}

echo
echo "## Pause and continue (Go benchmarks, pkg/reaper; medians of every pause)"
echo
printf '| %-13s | %-7s | %9s | %4s | %14s | %12s | %17s | %-17s |\n' \
	tree method processes runs "pause ms (med)" "pause range" "continue ms (med)" "target"
printf '|%s|%s|%s|%s|%s|%s|%s|%s|\n' --------------- -------- ----------- ------ ---------------- -------------- ------------------- -------------------
for key in flat1000/default flat1000/cgroup flat1000/signal fanout4-2400/default fanout4-2400/cgroup fanout4-2400/signal chain2400/default chain2400/cgroup chain2400/signal; do
	n=$(samples "$key" pause_ms | wc -l)
	if [ "$n" -eq 0 ]; then
		printf '| %-13s | %-7s | %9s | %4s | %14s | %12s | %17s | %-17s |\n' "${key%/*}" "${key#*/}" - 0 - - - "not measured"
		continue
	fi
	procs=$(samples "$key" processes | sort -u | tr '\n' ' ' | sed 's/ $//')
	pmed=$(samples "$key" pause_ms | median)
	prange=$(samples "$key" pause_ms | range)
	cmed=$(samples "$key" continue_ms | median)
	limit=100
	[ "${key%/*}" = flat1000 ] && limit=40
	verdict=$(awk -v m="$pmed" -v l="$limit" 'BEGIN { if (m <= l) print "<= " l " ms: met"; else print "<= " l " ms: MISSED" }')
	printf '| %-13s | %-7s | %9s | %4s | %14s | %12s | %17s | %-17s |\n' \
		"${key%/*}" "${key#*/}" "$procs" "$n" "$pmed" "$prange" "$cmed" "$verdict"
done
cgv=$({ grep -o 'cgroup_v=[0-9]' "$raw" || true; } | sort -u | tr '\n' ' ')
echo
echo "cgroup of the launches: ${cgv:-none}(1 = v1 freezer, 2 = cgroup2 cgroup.freeze)"

# batch FIELD: the FIELD values of BenchmarkPauseBatch64's BENCHSAMPLE lines.
batch() {
	{ grep -o "BENCHSAMPLE batch=64 .*" "$raw" || true; } | tr ' ' '\n' | sed -n "s/^$1=//p"
}
echo
echo "## A pause of 64 launches of 7 processes in one call (BenchmarkPauseBatch64; the two orders alternate in each round)"
echo
printf '| %-34s | %4s | %15s | %13s | %16s |\n' order runs "batch ms (med)" "batch range" "ms/launch (med)"
printf '|%s|%s|%s|%s|%s|\n' ------------------------------------ ------ ----------------- --------------- ------------------
for o in each all; do
	n=$(batch "${o}_ms" | wc -l)
	label="each launch paused on its own"
	[ "$o" = all ] && label="every pause begun first (PauseAll)"
	if [ "$n" -eq 0 ]; then
		printf '| %-34s | %4s | %15s | %13s | %16s |\n' "$label" 0 - - "not measured"
		continue
	fi
	med=$(batch "${o}_ms" | median)
	printf '| %-34s | %4s | %15s | %13s | %16s |\n' "$label" "$n" "$med" "$(batch "${o}_ms" | range)" \
		"$(awk -v m="$med" 'BEGIN { printf "%.2f", m / 64 }')"
done

# storm METHOD STOPPER FIELD: the FIELD values of the storm's BENCHSAMPLE lines.
storm() {
	{ grep -o "BENCHSAMPLE tree=storm[0-9]* method=$1 stopper=$2 .*" "$raw" || true; } |
		tr ' ' '\n' | sed -n "s/^$3=//p"
}
# count1: how many of the numbers on stdin are 1.
count1() { grep -c '^1$' || true; }

echo
echo "## ngsup stop --grace 1s of a fork storm with the supervisor gone (Go benchmarks BenchmarkStopStorm*)"
echo
printf '| %-9s | %-14s | %4s | %9s | %14s | %13s | %7s | %11s | %10s | %12s | %11s |\n' \
	launch stopper runs processes "stop ms (med)" "stop range" stopped out_of_time "left (med)" "left range" "load before"
printf '|%s|%s|%s|%s|%s|%s|%s|%s|%s|%s|%s|\n' ----------- ---------------- ------ ----------- ---------------- --------------- --------- ------------- ------------ -------------- -------------
stoppers=$({ grep -o 'BENCHSAMPLE tree=storm[0-9]* method=[a-z-]* stopper=[^ ]*' "$raw" || true; } | sed 's/.*stopper=//' | sort -u)
for st in ${stoppers:-in-process}; do
	for m in cgroup no-cgroup; do
		n=$(storm "$m" "$st" stop_ms | wc -l)
		if [ "$n" -eq 0 ]; then
			printf '| %-9s | %-14s | %4s | %9s | %14s | %13s | %7s | %11s | %10s | %12s | %11s |\n' "$m" "$st" 0 - - - - - - - "not measured"
			continue
		fi
		printf '| %-9s | %-14s | %4s | %9s | %14s | %13s | %7s | %11s | %10s | %12s | %11s |\n' "$m" "$st" "$n" \
			"$(storm "$m" "$st" processes | median | cut -d. -f1)" \
			"$(storm "$m" "$st" stop_ms | median)" "$(storm "$m" "$st" stop_ms | range)" \
			"$(storm "$m" "$st" stopped | count1)/$n" "$(storm "$m" "$st" out_of_time | count1)/$n" \
			"$(storm "$m" "$st" left | median | cut -d. -f1)" "$(storm "$m" "$st" left | range)" \
			"$(storm "$m" "$st" load1 | range)"
	done
done
echo
echo "(processes: in the storm's cgroup when the supervisor was SIGKILLed; left: still there when the stop returned; load before: the 1-minute load average before each storm was built)"

echo
echo "## The idle supervisor of the flat 1,000 tree (BenchmarkSupervisorIdleFlat1000; per 10 s window)"
echo
printf '| %-8s | %4s | %12s | %11s | %13s | %12s | %14s | %13s |\n' launch runs "ticks (med)" "ticks range" "CPU ms (med)" "CPU ms range" "wake-ups (med)" "wake-ups range"
printf '|%s|%s|%s|%s|%s|%s|%s|%s|\n' ---------- ------ -------------- ------------- --------------- -------------- ---------------- ---------------
for m in running paused; do
	n=$(samples "flat1000/idle-$m" cpu_ms | wc -l)
	if [ "$n" -eq 0 ]; then
		printf '| %-8s | %4s | %12s | %11s | %13s | %12s | %14s | %13s |\n' "$m" 0 - - - - - "not measured"
		continue
	fi
	printf '| %-8s | %4s | %12s | %11s | %13s | %12s | %14s | %13s |\n' "$m" "$n" \
		"$(samples "flat1000/idle-$m" ticks | median)" "$(samples "flat1000/idle-$m" ticks | range)" \
		"$(samples "flat1000/idle-$m" cpu_ms | median)" "$(samples "flat1000/idle-$m" cpu_ms | range)" \
		"$(samples "flat1000/idle-$m" wakeups | median)" "$(samples "flat1000/idle-$m" wakeups | range)"
done
echo
echo "(ticks: utime+stime in clock ticks of $(getconf CLK_TCK 2>/dev/null || echo 100) a second; CPU ms and wake-ups (context switches) summed over the supervisor's threads)"

# seed TREE WHO FIELD: the FIELD values of the seed-walk samples of TREE by WHO.
seed() {
	{ grep -o "BENCHSAMPLE tree=$1 method=seedwalk who=$2 .*" "$raw" || true; } |
		tr ' ' '\n' | sed -n "s/^$3=//p"
}
# paired TREE A FA B FB: per round, A's FA over B's FB; one ratio a line.
paired() {
	{ grep -o "BENCHSAMPLE tree=$1 method=seedwalk .*" "$raw" || true; } | awk -v a="$2" -v fa="$3" -v b="$4" -v fb="$5" '
		{ delete f; for (i = 1; i <= NF; i++) { split($i, kv, "="); f[kv[1]] = kv[2] }
		  if (f["who"] == a) x[f["round"]] = f[fa]; if (f["who"] == b) y[f["round"]] = f[fb] }
		END { for (r in x) if ((r in y) && y[r] > 0) printf "%.3f\n", x[r] / y[r] }'
}

echo
echo "## ngsup pause against the seed's walk (BenchmarkSeedWalkFlat*; the same tree, rounds in rotated order)"
echo
echo "ngsup: \`ngsup pause --dir D\` (wall time, process start included); old: the same with NGSUP_BENCH_OLD_BIN; seed: scripts/seedwalk.py, its walk alone (self: the interpreter's start not counted, as the seed's supervisor was already running). Medians; ratios are the medians of each round's ratio."
echo
printf '| %-9s | %-4s | %4s | %13s | %13s | %12s | %11s | %14s | %15s | %11s |\n' \
	tree who runs "wall ms (med)" "self ms (med)" "CPU ms (med)" "us/process" "/ seed (self)" "<= 0.25x seed" "/ old"
printf '|%s|%s|%s|%s|%s|%s|%s|%s|%s|%s|\n' ----------- ------ ------ --------------- --------------- -------------- ------------- ---------------- ----------------- -------------
for tree in flat1000 flat4000 flat10000; do
	if [ "$(seed "$tree" seed pause_ms | wc -l)" -eq 0 ]; then
		printf '| %-9s | %-4s | %4s | %13s | %13s | %12s | %11s | %14s | %15s | %11s |\n' "$tree" - 0 - - - - - "not measured" -
		continue
	fi
	procs=$(seed "$tree" seed processes | sort -u | head -1)
	for who in new old seed; do
		n=$(seed "$tree" "$who" pause_ms | wc -l)
		[ "$n" -eq 0 ] && continue
		wall=$(seed "$tree" "$who" pause_ms | median)
		self=$(seed "$tree" "$who" self_ms | median)
		cpu=$(seed "$tree" "$who" cpu_ms | median)
		per=$(awk -v m="$wall" -v p="$procs" 'BEGIN { printf "%.1f", m * 1000 / p }')
		if [ "$who" = seed ]; then
			ratio=1 verdict=- vsold=-
			per=$(awk -v m="$self" -v p="$procs" 'BEGIN { printf "%.1f", m * 1000 / p }')
		else
			ratio=$(paired "$tree" "$who" pause_ms seed self_ms | median3)
			verdict=$(awk -v r="$ratio" 'BEGIN { print (r <= 0.25) ? "met" : "MISSED" }')
			vsold=-
			if [ "$who" = new ] && [ "$(seed "$tree" old pause_ms | wc -l)" -gt 0 ]; then
				vsold=$(paired "$tree" new pause_ms old pause_ms | median3)
			fi
			[ "$who" = old ] && verdict="($verdict)"
		fi
		printf '| %-9s | %-4s | %4s | %13s | %13s | %12s | %11s | %14s | %15s | %11s |\n' \
			"$tree" "$who" "$n" "$wall" "$self" "$cpu" "$per" "$ratio" "$verdict" "$vsold"
	done
done
echo
fails=$({ grep -o 'BENCHFAIL tree=[^ ]* method=seedwalk who=[^ ]*' "$raw" || true; } | sed 's/BENCHFAIL tree=//; s/ method=seedwalk who=/ /' | sort | uniq -c | awk '{ printf "%s%s %s: %d", sep, $2, $3, $1; sep = "; " }')
if [ -n "$fails" ]; then
	echo
	echo "Pauses not confirmed within their budget (left out of the medians; BENCHFAIL lines in $raw): $fails"
fi
echo "(us/process: the median over the processes of the tree, the harness included; for the seed its self median. Load average (1 min) at the samples: $({ grep -o 'BENCHSAMPLE tree=flat[0-9]* method=seedwalk .*' "$raw" || true; } | tr ' ' '\n' | sed -n 's/^load1=//p' | range))"

# --- 2. Sizes ---------------------------------------------------------------
echo
echo "## ngsup binaries (stripped, static; limit 4 MiB = 4194304 bytes)"
echo
printf '| %-20s | %9s | %8s | %-14s | %-8s |\n' binary bytes MiB linking "<= 4 MiB"
printf '|%s|%s|%s|%s|%s|\n' ---------------------- ----------- ---------- ---------------- ----------
for arch in amd64 arm64; do
	f=$BIN/ngsup-linux-$arch
	size=$(stat -c %s "$f")
	link=unknown
	if command -v file >/dev/null; then
		desc=$(file -b "$f")
		case $desc in
		*"statically linked"*) link=static ;;
		*"dynamically linked"*) link=DYNAMIC ;;
		esac
		case $desc in *"not stripped"*) link="$link, NOT stripped" ;; esac
	fi
	ok=yes
	[ "$size" -le 4194304 ] || ok=NO
	printf '| %-20s | %9d | %8s | %-14s | %-8s |\n' "ngsup-linux-$arch" "$size" "$(awk -v s="$size" 'BEGIN { printf "%.2f", s / 1048576 }')" "$link" "$ok"
done

# --- 3. ngsup version -------------------------------------------------------
echo
vt=$(mktemp)
for _ in $(seq "$VERSION_RUNS"); do
	t0=$(now_us)
	"$NGSUP" version >/dev/null
	t1=$(now_us)
	echo "$(( t1 - t0 ))" >>"$vt"
done
vmed=$(awk '{ print $1 / 1000 }' "$vt" | median)
vrange=$(awk '{ print $1 / 1000 }' "$vt" | range)
rm -f "$vt"
verdict=$(awk -v m="$vmed" 'BEGIN { print (m < 5) ? "met" : "MISSED" }')
echo "## ngsup version: median ${vmed} ms over $VERSION_RUNS runs (range ${vrange} ms; target < 5 ms: $verdict)"

# --- 4. The CLI on the 1,000-flat tree --------------------------------------
if [ "$(id -u)" -ne 0 ]; then
	echo
	echo "## CLI pause+continue: skipped (needs root)"
	exit 0
fi
work=$(mktemp -d)
dir=$work/launch
id=bench-cli-$$-$(date +%s)
tag=NEMO_GYM_HARNESS_LAUNCH=$id
cat >"$work/flat.sh" <<'EOF'
n=$1; i=0
while [ "$i" -lt "$n" ]; do sleep 3600 & i=$((i+1)); done
wait
EOF
cleanup() {
	"$NGSUP" stop --dir "$dir" --grace 200ms >/dev/null 2>&1 || true
	# Anything still carrying this launch's tag is killed by pid.
	local left
	left=$(grep -lxz "$tag" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3 || true)
	if [ -n "$left" ]; then
		echo "bench.sh: killing $(echo "$left" | wc -l) processes left by launch $id" >&2
		kill -KILL $left 2>/dev/null || true
	fi
	rm -rf "$work"
}
trap cleanup EXIT
"$NGSUP" run --detach --dir "$dir" --id "$id" -- /bin/sh "$work/flat.sh" 1000 >/dev/null
# Wait until the harness and its 1,000 sleeps are there, all asleep.
for _ in $(seq 600); do
	tree=$("$NGSUP" tree --dir "$dir" --json)
	total=$(echo "$tree" | grep -o '"pid":' | wc -l)
	sleeping=$(echo "$tree" | grep -o '"state":"S"' | wc -l)
	# The supervisor is listed too.
	[ "$total" -eq 1002 ] && [ "$sleeping" -eq 1002 ] && break
	sleep 0.1
done
[ "$total" -eq 1002 ] || { echo "bench.sh: the flat tree has $total processes, want 1002" >&2; exit 1; }

cli() { # cli METHOD-FLAGS...: CLI_RUNS pause+continue pairs; prints "pause continue both" ms lines
	local t0 t1 t2 i out
	for i in $(seq "$CLI_RUNS"); do
		t0=$(now_us)
		out=$("$NGSUP" pause --dir "$dir" "$@")
		t1=$(now_us)
		"$NGSUP" continue --dir "$dir" >/dev/null
		t2=$(now_us)
		case $out in *'"paused":true'*'"processes":1001'*) ;; *)
			echo "bench.sh: pause did not hold 1001 processes: $out" >&2
			exit 1
			;;
		esac
		awk -v a="$t0" -v b="$t1" -v c="$t2" 'BEGIN { printf "%.3f %.3f %.3f\n", (b - a) / 1000, (c - b) / 1000, (c - a) / 1000 }'
	done
}
echo
echo "## CLI on the 1,000-flat tree (1,001 processes; wall time per command, process start included; $CLI_RUNS runs each)"
echo
printf '| %-22s | %15s | %18s | %15s |\n' method "pause ms (med)" "continue ms (med)" "both ms (med)"
printf '|%s|%s|%s|%s|\n' ------------------------ ----------------- -------------------- -----------------
for m in default cgroup-first no-cgroup; do
	flags=()
	[ "$m" != default ] && flags=(--"$m")
	res=$(cli "${flags[@]}")
	case $m in
	default) label="default" ;;
	cgroup-first) label="--cgroup-first" ;;
	no-cgroup) label="--no-cgroup" ;;
	esac
	printf '| %-22s | %15s | %18s | %15s |\n' "$label" \
		"$(echo "$res" | awk '{ print $1 }' | median)" \
		"$(echo "$res" | awk '{ print $2 }' | median)" \
		"$(echo "$res" | awk '{ print $3 }' | median)"
done
