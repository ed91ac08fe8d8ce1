package driver_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/ngharness/ngharness/pkg/driver"
	"github.com/ngharness/ngharness/pkg/proto"
)

// TestLaunchIDsAreInjective proves that launch ids never collide: rollout
// ids that the readable prefix makes the same ("dup:1" and "dup/1"; ids that
// share their first 120 characters) get different launch ids, and over many
// random rollout ids, attempts and launch numbers every id is distinct, in
// ngsup's alphabet and within its length (proto.ValidateID).
func TestLaunchIDsAreInjective(t *testing.T) {
	long := strings.Repeat("x", 120)
	pairs := [][2]string{
		{"dup:1", "dup/1"},
		{"dup:1", "dup_1"},
		{long + "-first", long + "-second"},
		{".hidden", "hidden"},
		{"a", "a\x00"},
	}
	for _, p := range pairs {
		a, b := driver.LaunchID(p[0], 1, 1, "sb"), driver.LaunchID(p[1], 1, 1, "sb")
		if a == b {
			t.Errorf("rollouts %q and %q share the launch id %s", p[0], p[1], a)
		}
	}
	// The attempt and the launch number are part of what is hashed, so a
	// rollout id that ends like another's prefix cannot meet it.
	if a, b := driver.LaunchID("r-a1-l1", 2, 3, "sb"), driver.LaunchID("r", 1, 1, "sb"); a == b {
		t.Errorf("launch ids of different launches collide: %s", a)
	}

	rng := rand.New(rand.NewPCG(1, 2))
	alphabet := []rune("abcXYZ019._-:/@ +=é\x00")
	seen := map[string]string{}
	for i := 0; i < 20000; i++ {
		n := rng.IntN(300) + 1
		var b strings.Builder
		for j := 0; j < n; j++ {
			b.WriteRune(alphabet[rng.IntN(len(alphabet))])
		}
		ro, attempt, launch := b.String(), rng.IntN(3)+1, rng.IntN(3)+1
		id := driver.LaunchID(ro, attempt, launch, "sb")
		if err := proto.ValidateID(id); err != nil {
			t.Fatalf("LaunchID(%q, %d, %d) = %q: %v", ro, attempt, launch, id, err)
		}
		if len(id) > proto.MaxIDLen {
			t.Fatalf("LaunchID(%q) is %d bytes, over %d", ro, len(id), proto.MaxIDLen)
		}
		key := fmt.Sprintf("%d/%d/%s", attempt, launch, ro)
		if other, ok := seen[id]; ok && other != key {
			t.Fatalf("launch id %s names both %q and %q", id, other, key)
		}
		seen[id] = key
	}
	if id := driver.LaunchID("rollout-7", 2, 3, "sb-1"); !strings.HasPrefix(id, "rollout-7-a2-l3-") {
		t.Errorf("LaunchID keeps no readable prefix: %s", id)
	}
	// The same launch of the same rollout in two sandboxes (two
	// deployments on one host reusing Gym's "<task>-<rollout>" ids) gets two
	// ids: a stop scanning for one never reaches the other's processes. The
	// sandbox id is hashed with its length, so no split of the same bytes
	// between sandbox and rollout id meets another.
	if a, b := driver.LaunchID("1-0", 0, 1, "sb-aa-0"), driver.LaunchID("1-0", 0, 1, "sb-bb-0"); a == b {
		t.Errorf("the same launch in two sandboxes shares the id %s", a)
	}
	if a, b := driver.LaunchID("x", 0, 1, "ab"), driver.LaunchID("bx", 0, 1, "a"); a == b {
		t.Errorf("sandbox %q + rollout %q meets sandbox %q + rollout %q: %s", "ab", "x", "a", "bx", a)
	}
}

// TestRolloutIDsEndingLikeAnAttemptAreRefused proves that a rollout id
// ending in "-a<N>" (the ending Gym reserves for attempt keys: a resources
// server would refuse its session) is refused before anything runs, with
// an error naming the rule, while other endings pass.
func TestRolloutIDsEndingLikeAnAttemptAreRefused(t *testing.T) {
	for _, id := range []string{"r-a1", "ignores-sigint-a3565007", "x-a84695"} {
		if err := driver.ValidateRolloutID(id); !errors.Is(err, driver.ErrBadRequest) || !strings.Contains(err.Error(), "-a<N>") {
			t.Errorf("ValidateRolloutID(%q) = %v, want a bad request naming the reserved -a<N> ending", id, err)
		}
	}
	for _, id := range []string{"r-a0", "r-a", "r-ab1", "run-20261201T150405-r1a2b3c4d", "ignores-sigint-t3565007"} {
		if err := driver.ValidateRolloutID(id); err != nil {
			t.Errorf("ValidateRolloutID(%q) = %v, want it accepted", id, err)
		}
	}
}
