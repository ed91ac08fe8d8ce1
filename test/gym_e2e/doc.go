// Package gyme2e plays NeMo Gym against real ngharness servers: a Go client
// in the role of Gym's checkpoint coordinator and of its rollout collector
// drives real `ngdriver serve` (the agent participant, kind "agent",
// configured from a Gym config file with --gym-config/--gym-instance),
// `ngdriver owner serve` (the resources participant, kind "resources") and
// the fake model (internal/fake/model/cmd/fakemodel with
// -checkpoint-token-env, the policy model participant, kind "model", which
// Gym's coordinator requires) processes built from this repository, over HTTP on loopback.
//
// The client follows Gym's code as stored for NVIDIA-NeMo/Gym:
// nemo_gym/_checkpoint/coordination.py at 011c338 (discover with Gym's
// rules: the config's server entries probed with GET status, 404 meaning
// "not a participant", a server down, silent, failing or of an unknown
// kind failing the discovery, a deployment with no policy model refused;
// ported with the discover cases of tests/unit_tests/
// test_checkpoint_coordination.py at 9288a79; prepare stage by stage in PREPARE_ORDER,
// stopping at the first stage not prepared; commit and restore fanned out;
// resume in reverse; retire and forget in RETIRE_ORDER; a failed restore
// retires the replacement attempts and resumes), collection.py at 011c338
// (the commit scope is the rows in flight minus the restarts; a restored
// row is posted again as its next attempt; the logged attempt of a row not
// continued is retired first), control.py at 011c338 and errors.py
// (every reply and refusal checked field by field), store.py at e7e449e
// (each participant's folder checked byte for byte), steps.py and agent.py
// (what parks and what blocks), and on Gym's main rollout_collection.py
// and rollout_correlation.py (the /run rows, what is read back,
// /aggregate_metrics).
//
// The scenarios run the fake harness (each step a line in its saved
// session), so "no finished step repeated" is read from disk: every
// session holds each step once, and the owner's check gives reward 1 only
// when the workdir's progress does. Each test kills exactly the processes
// it started (by pid, their process groups, and `ngsup stop` on every
// launch of its sandboxes, which live under the test's own temporary
// folder) and fails if any is left.
//
// Run with `go test ./test/gym_e2e` (about two minutes);
// NGHARNESS_E2E_RACE=1 builds the servers with the race detector. The
// tests are in the _test.go files; this file holds no code.
package gyme2e
