#!/usr/bin/env bash
# A real Docker engine for the real-Docker tests (CI: a fresh Debian
# bookworm machine, as root, with a docker client but no engine).
#
#   scripts/docker-engine.sh [start]   install docker.io and debootstrap if
#       missing, start dockerd in the background unless an engine already
#       answers (its pid in $STATE/dockerd.pid), wait for `docker info`, and
#       build the base image once (no registry: debootstrap --variant=minbase
#       from Debian's archive, `docker import`; the rootfs tarball is cached
#       in $CACHE). On success it prints the image's name and exits 0; when
#       no engine can be had it prints one line saying why and exits 1.
#   scripts/docker-engine.sh stop      stop the dockerd that start started
#       (SIGTERM by its recorded pid, then wait); an engine it did not start
#       is left alone.
#
# Environment: NGHARNESS_DOCKER_IMAGE (default ngharness-base:bookworm),
# NGHARNESS_DOCKER_STATE (default /tmp/ngharness-docker-engine),
# NGHARNESS_DOCKER_CACHE (default .tools/docker), NGHARNESS_DEBIAN_MIRROR
# (default: the first Debian archive apt uses, else deb.debian.org).
# DOCKER_HOST (unix://PATH only) and NGHARNESS_DOCKERD_ARGS let a second
# engine start beside one that runs (another socket, --data-root,
# --exec-root, --pidfile, --iptables=false), to check this script. Never
# --bridge none there: a dockerd started so deletes docker0, the bridge the
# other engine's containers need.
set -euo pipefail
cd "$(dirname "$0")/.."

image=${NGHARNESS_DOCKER_IMAGE:-ngharness-base:bookworm}
state=${NGHARNESS_DOCKER_STATE:-/tmp/ngharness-docker-engine}
cache=${NGHARNESS_DOCKER_CACHE:-$PWD/.tools/docker}
suite=bookworm
pidfile=$state/dockerd.pid
log=$state/dockerd.log

say() { echo "docker-engine: $*" >&2; }
# no: the one line saying why there is no engine, and exit 1.
no() { echo "docker-engine: no Docker engine: $*" >&2; exit 1; }

answers() { timeout 20 docker info >/dev/null 2>&1; }

mirror() {
	if [ -n "${NGHARNESS_DEBIAN_MIRROR:-}" ]; then echo "$NGHARNESS_DEBIAN_MIRROR"; return; fi
	local m
	m=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '/^URIs:/ && $2 ~ /\/debian\/?$/ {print $2; exit}')
	[ -n "$m" ] || m=$(awk '$1 == "deb" && $3 == "'$suite'" {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
	echo "${m:-http://deb.debian.org/debian}"
}

install() {
	local need=()
	command -v dockerd >/dev/null || need+=(docker.io)
	command -v debootstrap >/dev/null || need+=(debootstrap)
	[ ${#need[@]} -gt 0 ] || return 0
	command -v apt-get >/dev/null || no "dockerd or debootstrap is missing and there is no apt-get to install ${need[*]}"
	[ "$(id -u)" = 0 ] || no "installing ${need[*]} needs root"
	local t0=$SECONDS
	export DEBIAN_FRONTEND=noninteractive
	if ! apt-cache show "${need[@]}" >/dev/null 2>&1; then
		apt-get update -qq >&2 || no "apt-get update failed"
	fi
	apt-get install -y -qq --no-install-recommends "${need[@]}" >&2 || no "apt-get install ${need[*]} failed"
	say "installed ${need[*]} in $((SECONDS - t0)) s"
}

start_engine() {
	if answers; then
		# The dockerd an earlier start of this script left running stays
		# on record, so `stop` still ends it; any other engine is never
		# stopped.
		if [ -s "$pidfile" ] && [ "$(cat /proc/"$(cat "$pidfile")"/comm 2>/dev/null)" = dockerd ]; then
			say "the dockerd this script started (pid $(cat "$pidfile")) answers: using it"
			return
		fi
		rm -f "$pidfile"
		say "an engine already answers: using it (not stopping it at the end)"
		return
	fi
	[ "$(id -u)" = 0 ] || no "no engine answers and starting dockerd needs root"
	mkdir -p "$state"
	if [ -s "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
		no "the dockerd started earlier (pid $(cat "$pidfile")) does not answer; see $log"
	fi
	local t0=$SECONDS
	local host=${DOCKER_HOST:-unix:///var/run/docker.sock}
	case "$host" in unix://*) ;; *) no "DOCKER_HOST=$host: only a unix socket can be started here" ;; esac
	# shellcheck disable=SC2086 # NGHARNESS_DOCKERD_ARGS is a list of flags
	setsid dockerd --host "$host" ${NGHARNESS_DOCKERD_ARGS:-} >"$log" 2>&1 </dev/null &
	echo $! >"$pidfile"
	local deadline=$((SECONDS + 60))
	until answers; do
		if ! kill -0 "$(cat "$pidfile")" 2>/dev/null; then
			rm -f "$pidfile"
			no "dockerd exited at start: $(tail -n 1 "$log")"
		fi
		if [ $SECONDS -ge $deadline ]; then
			no "dockerd (pid $(cat "$pidfile")) did not answer within 60 s; see $log"
		fi
		sleep 0.2
	done
	say "started dockerd (pid $(cat "$pidfile")) in $((SECONDS - t0)) s"
}

build_image() {
	if docker image inspect "$image" >/dev/null 2>&1; then
		return
	fi
	local tar=$cache/rootfs-$suite-$(dpkg --print-architecture 2>/dev/null || uname -m).tar t0=$SECONDS
	if [ ! -s "$tar" ]; then
		mkdir -p "$cache"
		local rootfs
		rootfs=$(mktemp -d "$cache/rootfs.XXXXXX")
		if ! debootstrap --variant=minbase "$suite" "$rootfs" "$(mirror)" >"$cache/debootstrap.log" 2>&1; then
			rm -rf "$rootfs"
			no "debootstrap $suite from $(mirror) failed: $(tail -n 1 "$cache/debootstrap.log")"
		fi
		rm -rf "$rootfs"/var/cache/apt/* "$rootfs"/var/lib/apt/lists/* "$rootfs"/usr/share/{doc,man,locale}
		tar -C "$rootfs" -cf "$tar.part" . && mv "$tar.part" "$tar"
		rm -rf "$rootfs"
	fi
	docker import - "$image" <"$tar" >/dev/null || no "docker import of $tar failed"
	say "built $image in $((SECONDS - t0)) s"
}

stop_engine() {
	[ -s "$pidfile" ] || return 0
	local pid
	pid=$(cat "$pidfile")
	# Only the dockerd this script started: the pid must still be dockerd.
	if kill -0 "$pid" 2>/dev/null && [ "$(cat /proc/"$pid"/comm 2>/dev/null)" = dockerd ]; then
		kill -TERM "$pid"
		local deadline=$((SECONDS + 30))
		while kill -0 "$pid" 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.2; done
		if kill -0 "$pid" 2>/dev/null; then
			say "dockerd (pid $pid) did not stop within 30 s of SIGTERM; killing it"
			kill -KILL "$pid" 2>/dev/null || true
		else
			say "stopped dockerd (pid $pid)"
		fi
	fi
	rm -f "$pidfile"
}

case "${1:-start}" in
start)
	command -v docker >/dev/null || no "there is no docker client on PATH"
	install
	start_engine
	build_image
	echo "$image"
	;;
stop) stop_engine ;;
*) echo "usage: $0 [start|stop]" >&2; exit 2 ;;
esac
