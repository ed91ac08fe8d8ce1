#!/usr/bin/env bash
# Installs real OpenCode from npm into .tools/opencode-<version>/ (ignored by
# git), for the end-to-end tests and for running real rollouts. Idempotent.
# Usage: scripts/install-opencode.sh [VERSION ...]
#   (default: every version the tests run, 1.17.11 and 1.18.33; the
#   test/opencode_e2e suite runs once per version, see openCodeVersions)
# Prints the path of each installed binary, in the order given.
set -euo pipefail
cd "$(dirname "$0")/.."
versions=("$@")
[ ${#versions[@]} -gt 0 ] || versions=(1.17.11 1.18.33)
for v in "${versions[@]}"; do
	case "$v" in
	*[!0-9.]* | "") echo "install-opencode: bad version '$v'" >&2; exit 2 ;;
	esac
	dir=.tools/opencode-$v
	bin=$dir/node_modules/opencode-linux-x64/bin/opencode
	case "$(uname -m)" in
	aarch64 | arm64) bin=$dir/node_modules/opencode-linux-arm64/bin/opencode ;;
	esac
	if [ ! -x "$bin" ] || ! "$bin" --version >/dev/null 2>&1; then
		rm -rf "$dir"
		mkdir -p "$dir"
		(cd "$dir" && npm install --no-audit --no-fund --loglevel=error "opencode-ai@$v" >&2)
	fi
	if ! "$bin" --version >/dev/null 2>&1; then
		echo "install-opencode: $bin does not run" >&2
		exit 1
	fi
	echo "$PWD/$bin"
done
