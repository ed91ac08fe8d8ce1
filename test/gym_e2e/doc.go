// Package gyme2e plays NeMo Gym against real ngharness servers: a Go client
// in the role of Gym's checkpoint coordinator (nemo_gym/_checkpoint/
// coordination.py: discover, prepare in PREPARE_ORDER, commit, restore,
// resume in reverse, retire and forget in RETIRE_ORDER, renew) and of its
// rollout collector (nemo_gym/rollout_collection.py and the checkpointing
// collection.py: /run rows and /aggregate_metrics), driving real
// `ngdriver serve` (the agent participant, kind "agent") and
// `ngdriver owner serve` (the resources participant, kind "resources")
// processes over HTTP on loopback. Every reply is checked field by field as
// Gym's code reads it; records and manifests are checked on disk byte for
// byte. The tests are in the _test.go files; this file holds no code.
package gyme2e
