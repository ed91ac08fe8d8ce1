#!/usr/bin/env bash
# Installs the real Codex CLI, Claude Code and Pi from npm into .tools/
# (ignored by git), pinned, for the end-to-end tests and for running real
# rollouts. Idempotent: a harness whose binary already runs is left alone.
# Usage: scripts/install-harnesses.sh [codex|claude|pi ...]   (default: all)
# Prints the path of each installed binary (Codex's and Claude Code's native
# ones; Pi's CLI, a node script, whose package the pi adapter runs by node).
set -euo pipefail
cd "$(dirname "$0")/.."

# The pinned versions (the internal/fake/model tests expect the same ones).
codex_version=0.171.0
claude_version=2.1.332
pi_version=0.73.1

case "$(uname -m)" in
aarch64 | arm64) arch=arm64 triple=aarch64-unknown-linux-musl ;;
x86_64 | amd64) arch=x64 triple=x86_64-unknown-linux-musl ;;
*) echo "install-harnesses: unsupported machine $(uname -m)" >&2; exit 1 ;;
esac

# install NAME PACKAGE VERSION BIN: npm install PACKAGE@VERSION into
# .tools/NAME-VERSION unless BIN (relative to it) already runs. BIN
# --version runs with PI_OFFLINE=1, which keeps Pi off the network (the
# other harnesses ignore it).
install() {
	local name=$1 pkg=$2 v=$3 rel=$4
	local dir=.tools/$name-$v
	local bin=$dir/$rel
	if [ ! -x "$bin" ] || ! PI_OFFLINE=1 "$bin" --version >/dev/null 2>&1; then
		rm -rf "$dir"
		mkdir -p "$dir"
		(cd "$dir" && npm install --no-audit --no-fund --loglevel=error "$pkg@$v" >&2)
	fi
	if ! PI_OFFLINE=1 "$bin" --version >/dev/null 2>&1; then
		echo "install-harnesses: $bin does not run" >&2
		exit 1
	fi
	echo "$PWD/$bin"
}

which=("$@")
[ ${#which[@]} -gt 0 ] || which=(codex claude pi)
for h in "${which[@]}"; do
	case "$h" in
	codex) install codex @openai/codex "$codex_version" "node_modules/@openai/codex-linux-$arch/vendor/$triple/bin/codex" ;;
	claude) install claude @anthropic-ai/claude-code "$claude_version" "node_modules/@anthropic-ai/claude-code-linux-$arch/claude" ;;
	pi) install pi @mariozechner/pi-coding-agent "$pi_version" node_modules/.bin/pi ;;
	*) echo "install-harnesses: unknown harness '$h' (codex, claude or pi)" >&2; exit 2 ;;
	esac
done
