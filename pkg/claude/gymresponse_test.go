package claude

import (
	"strings"

	"github.com/ngharness/ngharness/pkg/gym"
)

// testOptions are Gym options with predictable ids.
func testOptions() gym.ResponseOptions {
	n := 0
	return gym.ResponseOptions{Model: "policy", NewHex: func() string { n++; return strings.Repeat("a", n) }}
}
