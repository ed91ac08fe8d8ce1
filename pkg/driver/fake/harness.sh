#!/bin/sh
# The fake harness: a scripted stand-in for an agent harness, run under ngsup
# by the fake adapter. Usage: harness.sh SESSION_DIR WORKDIR [TASK WORDS...]
# Each "step" stands for a model turn: it is appended once to SESSION_DIR/steps
# (the saved session) and to WORKDIR/progress. A relaunch on a saved session
# continues after the last step recorded. Behaviour comes from FAKE_* variables:
#   FAKE_STEPS (6) FAKE_STEP_S (0.5) FAKE_INSTALL_S (0) FAKE_INSTALL_UNTIL ()
#   FAKE_IGNORE_SIGINT (0) FAKE_CHILD (1) FAKE_OWN_SESSION (1) FAKE_DAEMON (1)
#   FAKE_UNTAGGED (1) FAKE_EXIT_CODE (0)
set -u
session=$1
work=$2
shift 2
mkdir -p "$session" "$work" || exit 70
# A step is one turn recorded whole, as a harness appends a turn to its
# session in one write: SIGINT or SIGTERM (a stop) is taken between steps,
# never between a step's two lines, and ends the harness with 130 (what a
# death by SIGINT reports). A stop's SIGKILL after its grace may still cut
# anywhere; the grace is there so that it rarely has to.
interrupted=
if [ "${FAKE_IGNORE_SIGINT:-0}" = 1 ]; then
	trap '' INT
else
	trap 'interrupted=1' INT TERM
fi
leave_if_interrupted() {
	if [ -n "$interrupted" ]; then
		exit 130
	fi
}
if [ "${FAKE_INSTALL_S:-0}" != 0 ]; then
	# "Installing": a child busy writing to the session folder.
	mkdir -p "$session/install"
	sleep "$FAKE_INSTALL_S" && touch "$session/install/done"
	leave_if_interrupted
fi
if [ -n "${FAKE_INSTALL_UNTIL:-}" ]; then
	# "Installing" until the file WORKDIR/FAKE_INSTALL_UNTIL exists.
	mkdir -p "$session/install"
	while [ ! -e "$work/$FAKE_INSTALL_UNTIL" ]; do
		sleep 0.05
		leave_if_interrupted
	done
	touch "$session/install/done"
fi
# Every process started here records its pid in $session/pids, so tests
# can check that a stop left none of them.
echo "harness $$" >>"$session/pids"
if [ "${FAKE_CHILD:-1}" = 1 ]; then
	sleep 100000 &
	echo "child $!" >>"$session/pids"
fi
if [ "${FAKE_OWN_SESSION:-1}" = 1 ]; then
	# As every tool call of OpenCode: a session and process group of its own.
	setsid sleep 100000 </dev/null >/dev/null 2>&1 &
	echo "own_session $!" >>"$session/pids"
fi
if [ "${FAKE_DAEMON:-1}" = 1 ]; then
	# Double-forked: re-parented to the supervisor, in a session of its own.
	(setsid sh -c 'echo "daemon $$" >>"$0/pids"; while :; do sleep 3600; done' "$session" </dev/null >/dev/null 2>&1 &)
fi
if [ "${FAKE_UNTAGGED:-1}" = 1 ]; then
	# A child that cleared its environment, tag included.
	env -i /bin/sh -c 'echo "untagged $$" >>"$0/pids"; exec sleep 100000' "$session" </dev/null >/dev/null 2>&1 &
fi
done_steps=0
if [ -f "$session/steps" ]; then
	done_steps=$(wc -l <"$session/steps")
fi
first=$((done_steps + 1))
i=$first
while [ "$i" -le "${FAKE_STEPS:-6}" ]; do
	sleep "${FAKE_STEP_S:-0.5}"
	leave_if_interrupted
	echo "step $i" >>"$session/steps"
	echo "step $i" >>"$work/progress"
	leave_if_interrupted
	i=$((i + 1))
done
total=$(wc -l <"$session/steps" 2>/dev/null || echo 0)
printf '{"text":"done after %s steps","steps":%s,"first_step":%s,"task":"%s"}\n' \
	"$total" "$total" "$first" "$(printf '%s' "$*" | tr -d '"\\\n' | cut -c1-200)"
exit "${FAKE_EXIT_CODE:-0}"
