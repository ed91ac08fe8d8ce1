// Package e2e holds the end-to-end tests of `ngdriver serve`: real
// `ngdriver owner serve` and `ngdriver serve` processes on loopback, driven
// over HTTP as the rollout framework drives them (POST /run, the checkpoint
// control plane of the driver and of the owner), with real sandboxes, real
// ngsup supervisors and real signals. The tests live in the _test.go files;
// TestMain builds the binaries they run.
package e2e
