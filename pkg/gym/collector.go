package gym

// What Gym's collector sends to an agent's /run and reads back, as
// nemo_gym/rollout_collection.py at 00536e7a140e653f2c222c55cd6dea22575a1ba0
// (RolloutCollectionHelper) does it. Nothing here is a type: the body is a
// dataset row the agent hands on whole, so the driver keeps it as raw JSON
// and reads only the fields below.
//
// The /run body, POSTed to /run on the server named by the row's
// agent_ref (the collector adds no path prefix or header of its own), is
// the input row with:
//
//   - agent_ref {"name": ...}, set from the collection's agent_name when
//     the row has none;
//   - responses_create_params, the row's merged with the collection's
//     overrides (and, with num_repeats_add_seed, metadata.extra_body
//     carrying "seed": the rollout index);
//   - skills_ref, when the collection configures skills;
//   - _ng_task_index, kept when the row has one (an upstream slicer's
//     stable index), otherwise the row's position among distinct rows;
//   - _ng_rollout_index, 0, 1, ... per task index, one per repeat.
//
// Any other field of the row (an explicit _ng_rollout_id included) goes
// through as it is; main's collector never sets _ng_attempt_index (a retry
// re-posts the same task and rollout indexes), so RunIdentity gives attempt
// 0 for its rows. Nothing is stripped from /run.
//
// The reply must be 200 with a JSON object (any other status fails the
// collection: raise_for_status). The collector then overwrites the reply's
// _ng_task_index, _ng_rollout_index, agent_ref (and skills_ref) with the
// row's, and files it by the routing fields below: FieldNoPersist set
// (truthy) means written nowhere, so a resume dispatches the row again;
// FieldFailureClass set (not null) means written to the
// <output>_failures.jsonl sidecar, with FieldFailureTerminal true meaning
// never retried; otherwise written to the main output, which is what
// /aggregate_metrics and training read ("reward", "response" and the
// verify fields).
//
// At the end the collector posts /aggregate_metrics to each agent with
// those main-output rows (see AggregateMetricsRequest).
const (
	// FieldAgentRef is the row's {"name": <agent server>}.
	FieldAgentRef = "agent_ref"
	// FieldResponsesCreateParams is the model request the rollout starts from.
	FieldResponsesCreateParams = "responses_create_params"
	// FieldSkillsRef is the collection's skills, stamped on every row and result.
	FieldSkillsRef = "skills_ref"
	// FieldFailureClass, in a /run reply, marks a failed rollout and names
	// its class (agent-defined strings such as "timeout"); the collector
	// files it apart from the successes.
	FieldFailureClass = "_ng_failure_class"
	// FieldNoPersist, in a /run reply, asks the collector to write the
	// rollout nowhere (a kill-shaped failure), so a resume runs it again.
	FieldNoPersist = "_ng_no_persist"
	// FieldFailureTerminal, in a failed /run reply, asks that the rollout
	// never be retried.
	FieldFailureTerminal = "_ng_failure_terminal"
)
