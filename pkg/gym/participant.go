package gym

import "context"

// The participant kinds Gym's coordinator knows (coordination.py
// PREPARE_ORDER: environment, model, agent, resources); it prepares them in
// that order and refuses any other kind at discovery, and it refuses a
// deployment in which no participant is of kind model (the policy model).
const (
	KindEnvironment = "environment"
	KindModel       = "model"
	KindAgent       = "agent"
	KindResources   = "resources"
)

// Participant is the part of one server that owns checkpointable state
// (Gym's CheckpointParticipant). The Control drives it: fencing, phases,
// deadlines, the lease, retire marks and storage are the Control's; what
// the state is and how it parks, exports and comes back is the
// participant's. The driver's agent participant (kind "agent") and the
// owner's resources participant (kind "resources") each implement it.
//
// The Control calls the methods that change state one at a time, under
// its operation lock, with one exception: an Install that outlives its
// restore's deadline goes on in its own goroutine while later operations
// run (a retire or restore waits for it first; a prepare does not, as in
// Gym). Readiness, Ready and StatusExtra may be called at any moment (a
// status read, a prepare's wait), so all methods must be safe for
// concurrent use. The ctx of Export, Retire, ParkExported,
// RestoredPending and DeleteRestored ends at the request's deadline_ts: a
// method must give up then, because Go cannot abandon a call the way Gym
// cancels a task. CloseAdmission, OpenAdmission and Install get a ctx
// without a deadline: an install goes on past its restore's deadline (the
// Control reopens admission once it ends), and a reopen must happen even
// after the deadline.
// A participant tells the Control when its readiness may have changed by
// calling Control.Notify; it checks Control.CheckAttempt on its data plane
// so retired attempts are refused with ErrStaleAttempt.
type Participant interface {
	// Kind is the participant kind, a NamePattern name ("agent", "resources").
	Kind() string
	// CloseAdmission stops admitting new work (refused with
	// ErrCheckpointParked) and asks running work to park at its next
	// boundary. It returns once asked, not once parked.
	CloseAdmission(ctx context.Context, req Request) error
	// OpenAdmission admits work again: parked work continues and held
	// replies are delivered.
	OpenAdmission(ctx context.Context) error
	// Readiness reports whether every live execution is at a committable
	// boundary, with the blockers and restarts (NewReport caps the list).
	Readiness() Report
	// Export returns the frozen records of a prepared participant within
	// scope (nil: every episode). Restored state the scope leaves out must
	// not be exported. Called once per checkpoint: a retried commit
	// writes the same records again.
	Export(ctx context.Context, scope []EpisodeID) ([]Record, error)
	// Install validates every record (an invalid one is an
	// ErrCheckpointState naming its episode) and then installs all of them
	// under their next attempt; it changes nothing unless all are valid.
	// scope is every episode the restore continues, including ones without
	// a record here, so per-episode files can be cleared too.
	Install(ctx context.Context, records []Record, scope []EpisodeID) error
	// Retire stops the running work of id and of every earlier attempt of
	// its rollout, waits until it has stopped, then frees their state, live
	// or restored, and returns only once nothing of them remains. If it
	// fails, what still runs stays tracked so a retry stops it again.
	Retire(ctx context.Context, id EpisodeID) error
	// ParkExported frees what the exported state of records holds outside
	// the process (sandboxes), once a commit with stop is durable: the
	// controller stops instead of resuming, and a restore rebuilds that
	// state. A failure is logged and does not fail the commit.
	ParkExported(ctx context.Context, records []Record) error
}

// Readier is optional: a cheaper Ready than Readiness().Ready, which a
// prepare asks after every change.
type Readier interface {
	Ready() bool
}

// RestoredKeeper is optional, for a participant that holds restored state
// until a replacement attempt claims it. A commit whose scope leaves such
// an episode out deletes it: the controller no longer continues it, and
// nothing else would free it.
type RestoredKeeper interface {
	// RestoredPending lists restored episodes whose replacement has not
	// started yet, as the attempts that continue them.
	RestoredPending(ctx context.Context) ([]EpisodeID, error)
	// DeleteRestored frees the restored state of id. Unlike Retire it must
	// leave nothing that refuses the attempt later: the controller may still
	// start the rollout over as that attempt.
	DeleteRestored(ctx context.Context, id EpisodeID) error
}

// StatusExtender is optional: fields added to the status reply (the
// agent's "accepting").
type StatusExtender interface {
	StatusExtra() map[string]any
}

// ManifestExtender is optional: fields kept in the manifest beside the
// store's own, and read back before a restore installs the records.
type ManifestExtender interface {
	ManifestExtra() map[string]any
	RestoreManifest(m Manifest) error
}

// CommitReplier is optional: fields the controller needs in the commit
// reply, beside phase, manifest and episode_ids.
type CommitReplier interface {
	CommitReply(records []Record) map[string]any
}

// WriteWatcher is optional, for a participant that keeps state outside the
// checkpoint folder (an owner's sandbox snapshots) and may delete it only
// once no checkpoint on disk refers to it. Gym never tells a participant
// whether a checkpoint completed: the controller publishes it after every
// participant's commit succeeded and then resumes, and a resume is the
// same whether it published or gave up. What a participant can know is
// where its own records went: Writing is called, under the operation lock,
// as each write of a checkpoint's records starts, with the participant's
// folder (<checkpoint_dir>/gym/<kind>/<instance>). While that folder's
// manifest names the checkpoint (ManifestCheckpointID), the checkpoint is
// on disk and a restore may read it; once the controller deletes it, or if
// the write never published, nothing refers to that export any more.
type WriteWatcher interface {
	Writing(checkpointID, participantDir string)
}
