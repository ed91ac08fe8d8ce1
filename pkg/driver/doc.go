// Package driver is the host side of a checkpointable rollout: the stage
// machine of one run (seed, the harness as one long wait step, verify,
// return) with a bookmark recorded before each step, and the checkpoint
// participant that parks runs, exports their bookmarks and lets them go
// on. What is harness-specific is an adapter (pkg/harness.Adapter, the
// adapter SDK): the Runner calls it and never knows which harness it runs;
// adapters never import this package.
//
// Launch control (ngsup uploaded and driven inside the sandbox, supervised
// or tag-only launches, host batching, retries) is pkg/driver/launch: the
// Runner chooses a launch.Launcher once per launch, and that launcher
// controls the launch to its end. It reaches sandboxes only through
// pkg/driver/sandbox and owners only through pkg/driver/owner; it never
// knows which harness it runs. The imports go one way: pkg/driver imports
// launch, never the reverse.
package driver
