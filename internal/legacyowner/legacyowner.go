// Package legacyowner puts the local owner's checkpoint side by checkpoint
// id behind pkg/gym's control plane, for in-process checkpoints (`ngdriver
// run`, the e2e tests), until the owner is a Gym resources participant
// itself. It is temporary: it exports no records, snapshots every open
// session at export and rewinds them at install.
package legacyowner

import (
	"context"
	"strings"
	"sync"

	"github.com/ngharness/ngharness/pkg/driver/owner/localowner"
	"github.com/ngharness/ngharness/pkg/gym"
)

// legacyOwner is the shim; see the package comment.
type legacyOwner struct {
	own *localowner.Owner
	mu  sync.Mutex
	id  string // the checkpoint closing admission, snapshotted at export
}

// Control returns a control plane over own's checkpoint side. A restore
// through it rewinds the sessions of the checkpoint whose id follows
// "restore-" in the restore's checkpoint id (driver.Restore's naming).
func Control(own *localowner.Owner) *gym.Control {
	c, err := gym.NewControl(&legacyOwner{own: own}, gym.Config{Instance: "local_owner", LeaseGrace: 600e9})
	if err != nil {
		panic(err) // the instance name is a constant that is valid
	}
	return c
}

func (o *legacyOwner) Kind() string { return gym.KindResources }

func (o *legacyOwner) CloseAdmission(ctx context.Context, req gym.Request) error {
	o.mu.Lock()
	o.id = req.CheckpointID
	o.mu.Unlock()
	return nil
}

func (o *legacyOwner) OpenAdmission(ctx context.Context) error { return nil }

func (o *legacyOwner) Readiness() gym.Report { return gym.NewReport(true, nil, nil, nil) }

func (o *legacyOwner) Export(ctx context.Context, scope []gym.EpisodeID) ([]gym.Record, error) {
	o.mu.Lock()
	id := o.id
	o.mu.Unlock()
	_, err := o.own.Snapshot(ctx, id)
	return nil, err
}

func (o *legacyOwner) Install(ctx context.Context, records []gym.Record, scope []gym.EpisodeID) error {
	o.mu.Lock()
	id := o.id
	o.mu.Unlock()
	return o.own.Restore(ctx, strings.TrimPrefix(id, "restore-"))
}

func (o *legacyOwner) Retire(ctx context.Context, id gym.EpisodeID) error { return nil }

func (o *legacyOwner) ParkExported(ctx context.Context, records []gym.Record) error { return nil }
