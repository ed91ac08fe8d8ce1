package gyme2e

import (
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"testing"

	"github.com/ngharness/ngharness/pkg/gym"
)

// TestDiscovery: Gym's coordinator finds the agent (kind agent, its entry
// name as instance) and the owner (kind resources) with GET status, and a
// second agent server of the same config with checkpointing off answers
// 404 there, which Gym's discover takes as "not a participant". An idle
// participant's status is phase idle with null checkpoint_id and
// lease_expires_at, no retired rollouts, and a ready report; the agent's
// also says accepting. Status needs the bearer token. A checkpoint of an
// idle deployment writes empty records on both.
func TestDiscovery(t *testing.T) {
	w := newWorld(t, options{})
	offPort := freePort(t)
	offCfg := filepath.Join(w.dir, "gym-off.yaml")
	w.writeConfig(offCfg, "ngdriver_agent_off", offPort, false)
	offURL := fmt.Sprintf("http://127.0.0.1:%d", offPort)
	w.start("agentoff", offURL, "serve", "--gym-config", offCfg, "--gym-instance", "ngdriver_agent_off")

	servers := w.servers()
	servers["ngdriver_agent_off"] = offURL
	r := w.coord.call("ngdriver_agent_off", offURL, gym.OpStatus, nil, w.coord.bearer())
	if r.status != http.StatusNotFound {
		t.Errorf("checkpointing off: %s, want 404 (not a participant)", r)
	}
	members := w.coord.discover(servers)
	var names []string
	for _, m := range members {
		names = append(names, m.Name+":"+m.Kind)
	}
	if want := []string{agentEntry + ":agent", ownerEntry + ":resources"}; !slices.Equal(names, want) {
		t.Fatalf("discovered %q, want %q in PREPARE_ORDER", names, want)
	}
	for _, m := range members {
		st := w.coord.status(m)
		if st.Phase != gym.PhaseIdle || st.CheckpointID != nil || st.LeaseExpiresAt != nil || st.RetiredRollouts != 0 || !st.Report.Ready {
			t.Errorf("%s idle status: %+v", m.Name, st)
		}
		if m.Kind == gym.KindAgent && (st.Accepting == nil || !*st.Accepting) {
			t.Errorf("%s idle status: accepting %v, want true", m.Name, deref(st.Accepting))
		}
		for _, auth := range []string{"", "Bearer wrong-" + w.token, w.token} {
			checkRefusal(t, w.coord.call(m.Name, m.URL, gym.OpStatus, nil, auth), gym.CodeUnauthorized)
		}
	}
	// With nothing in flight a checkpoint writes empty records: a 0-byte
	// records file named after the digest of nothing, record_count 0.
	id := ckID("empty")
	ck := w.checkpoint(id, nil, false)
	for name, cr := range ck.commits {
		if cr.Manifest["record_count"] != float64(0) || cr.Manifest["records_sha256"] != emptySHA256 || len(cr.EpisodeIDs) != 0 {
			t.Errorf("%s: the empty checkpoint's manifest %v, episode_ids %q", name, cr.Manifest, cr.EpisodeIDs)
		}
	}
	w.coord.resume(id, deadlineIn(waitLimit))
}

// emptySHA256 is the sha256 of no bytes.
const emptySHA256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
