package config

import (
	"path/filepath"
	"testing"
	"time"
)

// TestExampleLoads: examples/ngdriver.yaml, every key documented there,
// is a valid config (lease_grace included).
func TestExampleLoads(t *testing.T) {
	cfg, err := Load(filepath.Join("..", "..", "..", "examples", "ngdriver.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.LeaseGrace.D() != 600*time.Second || cfg.Owner.URL == "" {
		t.Errorf("lease_grace %v, owner %q", cfg.LeaseGrace.D(), cfg.Owner.URL)
	}
}

// TestLeaseGraceDefault: a file that does not say lease_grace gets Gym's
// default, 600 s; one that does gets its value.
func TestLeaseGraceDefault(t *testing.T) {
	cfg := Default()
	if err := Parse([]byte("max_runs: 2\n"), &cfg); err != nil || cfg.LeaseGrace.D() != 600*time.Second {
		t.Errorf("default: %v, %v", cfg.LeaseGrace.D(), err)
	}
	cfg = Default()
	if err := Parse([]byte("lease_grace: 90s\n"), &cfg); err != nil || cfg.LeaseGrace.D() != 90*time.Second {
		t.Errorf("set: %v, %v", cfg.LeaseGrace.D(), err)
	}
}
