// Package gym is NeMo Gym's wire, and nothing else: what a Gym coordinator
// sends a participating server and what it expects back, the records a
// checkpoint leaves on disk, a control plane that answers the coordinator
// for any participant, and the NeMoGymResponse an agent's /run reply
// carries (response.go: Response and its items, which every harness
// adapter builds from its own session). It imports nothing of ngharness; the
// driver's agent participant and the owner's resources participant each
// implement Participant and serve a Control through NewHandler.
//
// Gym's checkpoint code lives on pull-request heads of NVIDIA-NeMo/Gym, not
// on its main branch. This package follows these versions, field for field:
//
//   - nemo_gym/episode_types.py at 05bf55ac50b5d95eb203ceb8f59145545c6def64:
//     EpisodeId {rollout_id, attempt} (attempt 0-based, default 0; unknown
//     fields refused; rollout id ^[A-Za-z0-9][A-Za-z0-9._-]*$, not ending in
//     -a<N>, no length limit), capture_key and from_capture_key
//     (episode.go: EpisodeID, CaptureKey, ParseCaptureKey).
//   - nemo_gym/_checkpoint/errors.py at 14f23fac28533e6324b0281189442085812f768d:
//     the envelope {"error": {"code", "detail"}} and the codes with their
//     statuses; restart_in_scope (409) is taken from the errors.py that
//     control.py 011c338 imports it from (7f40a593), since 14f23fa lacks it
//     (errors.go: the Err* sentinels, Classify, Envelope).
//   - nemo_gym/_checkpoint/control.py at 011c3386d691fd51a0ee388026c59660fcbffdac:
//     the routes under /ng-control/v1/checkpoint (GET status; POST prepare,
//     renew, retire, forget, commit, restore, resume), the request models
//     (checkpoint_id 1..128 matching the name pattern, finite deadline_ts,
//     commit's checkpoint_dir, optional episode_ids and stop, restore's
//     required episode_ids, retire's non-empty episode_ids, forget's
//     non-empty rollout_ids, extra fields forbidden), PrepareReport (at most
//     100 blockers listed, blocker_count, counts, restarts never capped),
//     the phase machine, fencing, the 64 resumed ids, replay per (checkpoint
//     id, operation), the lease (max(current, deadline_ts +
//     lease_grace_seconds), resume on expiry), RetiredAttempts, commit's
//     readiness re-check, restart_in_scope, deletion of unscoped restored
//     state and park_exported on stop, restore into attempt + 1, and every
//     reply (messages.go, control.go, participant.go, http.go).
//   - nemo_gym/_checkpoint/store.py at e7e449e9aa0d3fb3ac829d64ee290a3c7fbc2706
//     (the version whose write_participant_state takes extra and stop):
//     <checkpoint_dir>/gym/<kind>/<instance>/records-<sha256>.jsonl written
//     through a temporary file and renamed after its digest, then a
//     create-only manifest.json {schema_version: 1, kind, instance,
//     checkpoint_id, records_file, records_sha256, record_count, ...extra}
//     linked from a fsynced temporary file, the folder fsynced; the
//     streaming verified read; WriteStop (store.go).
//
// Beside the checkpoint wire, the /run and /aggregate_metrics exchange with
// Gym's collector, from Gym's main-branch files at these stored versions
// (several versions of each are stored, without their branch; the one
// followed is the one whose behaviour issue 10 describes: an explicit
// rollout id that wins and is never rewritten):
//
//   - nemo_gym/rollout_correlation.py at 1e1a16cb20c749985464427048185ae215a5215f:
//     maybe_rollout_id_from_run_body, a /run body's identity (explicit
//     _ng_rollout_id, else <_ng_task_index>-<_ng_rollout_index>, and
//     _ng_attempt_index as the attempt), malformed ids refused
//     (correlation.go: RunIdentity, RunIdentityFields).
//   - nemo_gym/rollout_collection.py at 00536e7a140e653f2c222c55cd6dea22575a1ba0:
//     the /run body the collector builds, the reply fields it stamps and
//     routes by, and what it posts to /aggregate_metrics (collector.go: the
//     Field* names).
//   - nemo_gym/reward_profile.py at 0281ad6f9505feea14df01698ed6c6fc0fe6bfbe
//     (compute_aggregate_metrics, RewardProfiler) as the base agent's
//     aggregate_metrics calls it (nemo_gym/base_responses_api_agent.py),
//     and the request and reply models of nemo_gym/base_resources_server.py
//     (aggregate.go: AggregateMetricsRequest, AggregateMetrics,
//     ComputeAggregateMetrics).
//
// The tests port the cases of Gym's own tests that apply to the wire
// (tests/unit_tests/test_episode_types.py, test_checkpoint_control.py,
// test_checkpoint_agent.py, test_checkpoint_environment.py and the
// invariants of test_checkpoint_sequences.py; for the collector exchange
// test_base_responses_api_model.py, test_rollout_correlation.py,
// test_reward_profile.py and test_rollout_collection.py); each test names
// the Gym test it ports.
//
// Where this differs from Gym, on purpose: a record's lines are Go's
// compact JSON, not Python's json.dumps spacing (Gym's reader only checks
// the digest of the bytes written, so either reads back); manifest extras
// may not reuse the store's own field names; a number may come as a JSON
// number or a numeric string (as pydantic's lax mode takes it) but never as
// a boolean, and stop must be a JSON boolean; an unexpected error is answered 500 with the envelope
// (code internal_error) instead of FastAPI's bare text; a /run identity or
// a verify response that Gym's Python would format or fail on in its own
// way is refused (RunIdentity and ComputeAggregateMetrics list each case).
// Gym's multi-worker
// coordination (a coordinator process holding the participant for several
// worker processes) is not part of this package.
package gym
