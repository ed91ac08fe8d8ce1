// Package driver is the host side of a checkpointable rollout: the stage
// machine of one run (seed, the harness as one long wait step, verify,
// return) with a bookmark recorded before each step, the adapter interface
// (what is harness-specific), launch control through ngsup inside the
// sandbox, and the checkpoint participant that parks runs, exports their
// bookmarks and lets them go on.
//
// It reaches sandboxes only through pkg/driver/sandbox and owners only
// through pkg/driver/owner; it never knows which harness it runs.
package driver
