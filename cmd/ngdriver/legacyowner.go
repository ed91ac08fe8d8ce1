package main

import (
	"context"
	"sync"

	"github.com/ngharness/ngharness/pkg/driver/owner/localowner"
	"github.com/ngharness/ngharness/pkg/gym"
)

// legacyOwner puts the local owner's checkpoint side by checkpoint id
// (snapshot every open session at commit, rewind them at restore) behind
// the control plane, for `ngdriver run`'s in-process checkpoints, until the
// owner is a Gym resources participant itself. It exports no records.
type legacyOwner struct {
	own *localowner.Owner
	mu  sync.Mutex
	id  string // the checkpoint closing admission, snapshotted at export
}

func newLegacyOwnerControl(own *localowner.Owner) *gym.Control {
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
	return o.own.Restore(ctx, id[len("restore-"):])
}

func (o *legacyOwner) Retire(ctx context.Context, id gym.EpisodeID) error { return nil }

func (o *legacyOwner) ParkExported(ctx context.Context, records []gym.Record) error { return nil }
