// Package cgrouptest removes what end-to-end tests leave in the cgroup tree:
// the empty cgroup of a launch whose sandbox a test deleted behind the
// owner's back. A real sandbox service takes a container's cgroups with it;
// the fakes of these tests run their sandboxes' processes on this machine,
// so the launch's ngsup-* cgroup outlives the sandbox. Only empty cgroups
// whose name holds the test process's own tag are touched.
package cgrouptest

import (
	"os"
	"path/filepath"
	"strings"
)

// roots are where ngsup makes a launch's cgroup when the test runs in the
// root cgroup: a cgroup2 mount (alone, or beside v1 as "unified") and the v1
// freezer.
var roots = []string{"/sys/fs/cgroup", "/sys/fs/cgroup/unified", "/sys/fs/cgroup/freezer"}

// RemoveEmpty removes every empty ngsup-* cgroup whose name holds tag and
// returns the ones it removed. A cgroup that still has a process in it is
// left alone (rmdir refuses it).
func RemoveEmpty(tag string) []string {
	if tag == "" {
		return nil
	}
	var removed []string
	for _, root := range roots {
		entries, err := os.ReadDir(root)
		if err != nil {
			continue
		}
		for _, e := range entries {
			name := e.Name()
			if !e.IsDir() || !strings.HasPrefix(name, "ngsup-") || !strings.Contains(name, tag) {
				continue
			}
			path := filepath.Join(root, name)
			if os.Remove(path) == nil {
				removed = append(removed, path)
			}
		}
	}
	return removed
}
