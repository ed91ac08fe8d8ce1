// Package e2e holds the end-to-end tests of `ngdriver serve`: real
// `ngdriver owner serve` and `ngdriver serve` processes on loopback, driven
// over HTTP as NeMo Gym drives an agent server (POST /run with Gym's
// identity fields, the checkpoint control plane of pkg/gym, records read
// back from Gym's store) and the owner on its old control routes, with
// real sandboxes, real ngsup supervisors and real signals. The tests live
// in the _test.go files; TestMain builds the binaries they run.
package e2e
