package local

import (
	"context"

	"github.com/ngharness/ngharness/pkg/driver/sandbox"
)

// Lender is the backend's lending side (sandbox.Lender), for an owner that
// lends its sandboxes: the Backend's own methods, with a Snapshot that
// takes again a snapshot of that name left by a call that failed after
// copying.
func (b *Backend) Lender() sandbox.Lender { return lender{b} }

// LenderBackend is the Backend whose Lender l is (nil for any other
// lender): an owner ends the processes of local sandboxes by their mount
// namespace (EndSandboxes, EndStrays), which no other backend can.
func LenderBackend(l sandbox.Lender) *Backend {
	if l, ok := l.(lender); ok {
		return l.b
	}
	return nil
}

type lender struct{ b *Backend }

func (l lender) Name() string { return l.b.Name() }

func (l lender) Create(ctx context.Context, name string) (sandbox.Sandbox, error) {
	return l.b.Create(ctx, name)
}

func (l lender) Open(ctx context.Context, id string) (sandbox.Sandbox, error) {
	return l.b.Open(id)
}

func (l lender) Snapshot(ctx context.Context, sandboxID, name string) (string, error) {
	if l.b.HasSnapshot(name) {
		// Left by a call that failed after copying: take it again.
		if err := l.b.RemoveSnapshot(ctx, name); err != nil {
			return "", err
		}
	}
	if err := l.b.Snapshot(ctx, sandboxID, name); err != nil {
		return "", err
	}
	return name, nil
}

func (l lender) Fork(ctx context.Context, snapshotID, name string) (sandbox.Sandbox, error) {
	return l.b.Fork(ctx, snapshotID, name)
}

func (l lender) Remove(ctx context.Context, id string) error { return l.b.Remove(ctx, id) }

func (l lender) RemoveSnapshot(ctx context.Context, id string) error {
	return l.b.RemoveSnapshot(ctx, id)
}
