"""Entry point Gym's launcher runs for the ngdriver agent server.

Gym starts every server as `python <entrypoint>` in the server's folder, with
NEMO_GYM_CONFIG_DICT and NEMO_GYM_CONFIG_PATH set. ngdriver is a Go binary, so
this file only replaces itself with `ngdriver serve` (same process id, same
environment): ngdriver reads both variables, listens on the entry's host and
port, and gets Gym's SIGINT at shutdown directly.
"""

import os
import shutil
import sys


def main() -> None:
    binary = os.environ.get("NGDRIVER_BIN") or shutil.which("ngdriver")
    if not binary:
        sys.exit("ngdriver_agent: no ngdriver binary: put it on PATH or set NGDRIVER_BIN")
    os.execv(binary, [binary, "serve", *sys.argv[1:]])


if __name__ == "__main__":
    main()
