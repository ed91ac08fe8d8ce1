package gym

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
)

// POST /aggregate_metrics, as Gym's agents answer it.
//
// Gym's collector (nemo_gym/rollout_collection.py at
// 00536e7a140e653f2c222c55cd6dea22575a1ba0, _call_aggregate_metrics) posts
// it to every agent once all rollouts are in, with the agent's /run
// replies, each stamped with _ng_task_index, _ng_rollout_index and
// agent_ref, minus "response" and "responses_create_params" except that
// "response": {"usage": ...} is kept when the usage is not empty. It reads
// back AggregateMetrics {group_level_metrics, agent_metrics, key_metrics}
// and writes them to <output>_aggregate_metrics.json.
//
// The agent does not relay this to its resources server: Gym's base agent
// (SimpleResponsesAPIAgent.aggregate_metrics in
// nemo_gym/base_responses_api_agent.py, the same at 011c338 and on main)
// computes it itself with compute_aggregate_metrics and its default hooks
// (compute_metrics adds nothing, get_key_metrics keeps the "mean/*"
// entries), and answers an empty AggregateMetrics when its config sets
// skip_verification. ComputeAggregateMetrics is that computation, ported
// from compute_aggregate_metrics and RewardProfiler in
// nemo_gym/reward_profile.py at 0281ad6f9505feea14df01698ed6c6fc0fe6bfbe.

// AggregateMetricsRequest is the body of POST /aggregate_metrics
// (AggregateMetricsRequest in nemo_gym/base_resources_server.py): the
// verify responses, one object per rollout. Other fields are ignored, as
// pydantic ignores them.
type AggregateMetricsRequest struct {
	VerifyResponses []map[string]json.RawMessage `json:"verify_responses"`
}

// DecodeAggregateMetricsRequest reads the body strictly enough to answer
// a bad one with a clear refusal: one JSON object whose verify_responses
// is a list of objects.
func DecodeAggregateMetricsRequest(body []byte) (AggregateMetricsRequest, error) {
	if err := singleValue(body); err != nil {
		return AggregateMetricsRequest{}, err
	}
	body = bytes.TrimSpace(body)
	if body[0] != '{' {
		return AggregateMetricsRequest{}, Refuse(ErrInvalidRequest, "aggregate_metrics body must be a JSON object")
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(body, &fields); err != nil {
		return AggregateMetricsRequest{}, Refuse(ErrInvalidRequest, "aggregate_metrics body is not valid JSON: %v", err)
	}
	raw, ok := fields["verify_responses"]
	if !ok {
		return AggregateMetricsRequest{}, Refuse(ErrInvalidRequest, "verify_responses is required")
	}
	var items []json.RawMessage
	if t := bytes.TrimSpace(raw); len(t) == 0 || t[0] != '[' || json.Unmarshal(t, &items) != nil {
		return AggregateMetricsRequest{}, Refuse(ErrInvalidRequest, "verify_responses must be a list of objects")
	}
	req := AggregateMetricsRequest{VerifyResponses: make([]map[string]json.RawMessage, len(items))}
	for i, item := range items {
		if t := bytes.TrimSpace(item); len(t) == 0 || t[0] != '{' {
			return AggregateMetricsRequest{}, Refuse(ErrInvalidRequest, "verify_responses[%d] must be an object", i)
		}
		if err := json.Unmarshal(item, &req.VerifyResponses[i]); err != nil {
			return AggregateMetricsRequest{}, Refuse(ErrInvalidRequest, "verify_responses[%d]: %v", i, err)
		}
	}
	return req, nil
}

// AggregateMetrics is the reply of POST /aggregate_metrics
// (AggregateMetrics in nemo_gym/base_resources_server.py). Values are
// int64 (the max and min of a column whose every rollout holds an
// integer or a boolean, as pandas keeps such a column integral), Float,
// or the group's "sample".
type AggregateMetrics struct {
	// GroupLevelMetrics has one entry per task, in ascending task index:
	// "<stat>/<field>" for each statistic, "sample" (Gym's is always
	// {"agent_ref": {"name": "agent"}} here) and _ng_task_index.
	GroupLevelMetrics []map[string]any `json:"group_level_metrics"`
	// AgentMetrics is "<stat>/<field>" over every rollout.
	AgentMetrics map[string]any `json:"agent_metrics"`
	// KeyMetrics is the "mean/*" subset of AgentMetrics.
	KeyMetrics map[string]any `json:"key_metrics"`
}

// EmptyAggregateMetrics is Gym's AggregateMetrics(): the reply for no
// verify responses, and the reply of an agent configured with
// skip_verification.
func EmptyAggregateMetrics() AggregateMetrics {
	return AggregateMetrics{GroupLevelMetrics: []map[string]any{}, AgentMetrics: map[string]any{}, KeyMetrics: map[string]any{}}
}

// Float is a statistic, written as Python's json.dumps writes a float
// (1.0 rather than Go's 1; 1e-05; 1e+16), so the file Gym's collector
// writes reads the same whichever agent answered.
type Float float64

// MarshalJSON writes f as Python's repr does: positional notation for
// decimal exponents from -4 to 15 with at least one digit after the
// point, scientific otherwise; both with the fewest digits that read back
// to f.
func (f Float) MarshalJSON() ([]byte, error) {
	v := float64(f)
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return nil, fmt.Errorf("gym: statistic %v has no JSON form", v)
	}
	if v == 0 {
		if math.Signbit(v) {
			return []byte("-0.0"), nil
		}
		return []byte("0.0"), nil
	}
	e := strconv.FormatFloat(v, 'e', -1, 64)
	if exp, _ := strconv.Atoi(e[strings.IndexByte(e, 'e')+1:]); exp < -4 || exp >= 16 {
		return []byte(e), nil
	}
	s := strconv.FormatFloat(v, 'f', -1, 64)
	if !strings.Contains(s, ".") {
		s += ".0"
	}
	return []byte(s), nil
}

// column is one numeric field of the rollouts, NaN where a rollout lacks
// it, and whether pandas would hold it as integers (every rollout has it
// and every value is an integer or a boolean).
type column struct {
	name     string
	values   []float64
	ints     []int64
	integral bool
}

// ComputeAggregateMetrics computes what Gym's agent answers to
// /aggregate_metrics for these verify responses (compute_aggregate_metrics
// with the base agent's default hooks):
//
//   - Each rollout's numeric fields, after its response.usage fields are
//     merged over them (usage wins), are its values; booleans count as 0
//     and 1; strings, objects, arrays and nulls are left out.
//   - group_level_metrics: per task index, ascending, the mean, max, min,
//     median and sample standard deviation of every field but the task
//     and rollout indexes, over that task's rollouts; then "sample" and
//     _ng_task_index.
//   - agent_metrics: the same over all rollouts; key_metrics: its "mean/*".
//
// As pandas does: missing values are skipped; a statistic with no value
// (NaN) is left out; the standard deviation needs two values, except that
// when no field of a group has one, a field every rollout of the group
// holds gets 0; sums are NumPy's pairwise sums, so means and deviations
// match Gym's to the bit.
//
// Where this differs from Gym, on purpose: every verify response must
// carry integer _ng_task_index and _ng_rollout_index, as Gym's collector
// always stamps them (Gym fails with a KeyError when a column is absent
// altogether and mis-assigns task indexes when only some rollouts lack
// it); a response or usage that is not an object is refused (Gym raises
// a TypeError or AttributeError, answered 500).
func ComputeAggregateMetrics(verifyResponses []map[string]json.RawMessage) (AggregateMetrics, error) {
	if len(verifyResponses) == 0 {
		return EmptyAggregateMetrics(), nil
	}
	n := len(verifyResponses)
	tasks := make([]int64, n)
	var order []string
	byName := map[string]*column{}
	for i, vr := range verifyResponses {
		var err error
		if tasks[i], err = requiredIndex(vr, FieldTaskIndex, i); err != nil {
			return AggregateMetrics{}, err
		}
		if _, err = requiredIndex(vr, FieldRolloutIndex, i); err != nil {
			return AggregateMetrics{}, err
		}
		values, err := numericFields(vr, i)
		if err != nil {
			return AggregateMetrics{}, err
		}
		for name, v := range values {
			c := byName[name]
			if c == nil {
				c = &column{name: name, values: make([]float64, n), ints: make([]int64, n), integral: true}
				for j := range c.values {
					c.values[j] = math.NaN()
				}
				byName[name] = c
				order = append(order, name)
			}
			c.values[i] = v.f
			c.ints[i] = v.i
			c.integral = c.integral && v.isInt
		}
	}
	sort.Strings(order)
	var stats []*column // every column but the task and rollout indexes
	for _, name := range order {
		c := byName[name]
		for _, f := range c.values {
			c.integral = c.integral && !math.IsNaN(f)
		}
		if name != FieldTaskIndex && name != FieldRolloutIndex {
			stats = append(stats, c)
		}
	}

	groups := map[int64][]int{}
	var taskOrder []int64
	for i, task := range tasks {
		if _, seen := groups[task]; !seen {
			taskOrder = append(taskOrder, task)
		}
		groups[task] = append(groups[task], i)
	}
	sort.Slice(taskOrder, func(a, b int) bool { return taskOrder[a] < taskOrder[b] })

	out := EmptyAggregateMetrics()
	for _, task := range taskOrder {
		entry := describe(stats, groups[task])
		entry["sample"] = map[string]any{"agent_ref": map[string]any{"name": "agent"}}
		entry[FieldTaskIndex] = task
		out.GroupLevelMetrics = append(out.GroupLevelMetrics, entry)
	}
	all := make([]int, n)
	for i := range all {
		all[i] = i
	}
	out.AgentMetrics = describe(stats, all)
	for k, v := range out.AgentMetrics {
		if strings.HasPrefix(k, "mean/") {
			out.KeyMetrics[k] = v
		}
	}
	return out, nil
}

// requiredIndex reads a task or rollout index of verify response i.
func requiredIndex(vr map[string]json.RawMessage, field string, i int) (int64, error) {
	raw, ok := vr[field]
	t := bytes.TrimSpace(raw)
	if !ok || !jsonInteger.Match(t) {
		return 0, Refuse(ErrInvalidRequest, "verify_responses[%d]: %s must be an integer", i, field)
	}
	v, err := strconv.ParseInt(string(t), 10, 64)
	if err != nil {
		return 0, Refuse(ErrInvalidRequest, "verify_responses[%d]: %s %s is out of range", i, field, t)
	}
	return v, nil
}

// number is one numeric value: as a float, and as an integer when it is one.
type number struct {
	f     float64
	i     int64
	isInt bool
}

// numericFields is RewardProfiler's numeric_result for one rollout: its
// fields with response.usage merged over them, booleans as 0 and 1, other
// numbers as they are, everything else left out.
func numericFields(vr map[string]json.RawMessage, i int) (map[string]number, error) {
	merged := make(map[string]json.RawMessage, len(vr))
	for k, v := range vr {
		merged[k] = v
	}
	if raw, ok := vr["response"]; ok {
		var response map[string]json.RawMessage
		if t := bytes.TrimSpace(raw); len(t) == 0 || t[0] != '{' || json.Unmarshal(t, &response) != nil {
			return nil, Refuse(ErrInvalidRequest, "verify_responses[%d]: response must be an object", i)
		}
		if usage, ok := response["usage"]; ok && !falsy(usage) {
			var fields map[string]json.RawMessage
			if t := bytes.TrimSpace(usage); t[0] != '{' || json.Unmarshal(t, &fields) != nil {
				return nil, Refuse(ErrInvalidRequest, "verify_responses[%d]: response.usage must be an object", i)
			}
			for k, v := range fields {
				merged[k] = v
			}
		}
	}
	out := map[string]number{}
	for k, raw := range merged {
		t := bytes.TrimSpace(raw)
		switch {
		case string(t) == "true":
			out[k] = number{f: 1, i: 1, isInt: true}
		case string(t) == "false":
			out[k] = number{isInt: true}
		case len(t) > 0 && (t[0] == '-' || (t[0] >= '0' && t[0] <= '9')):
			if jsonInteger.Match(t) {
				if v, err := strconv.ParseInt(string(t), 10, 64); err == nil {
					out[k] = number{f: float64(v), i: v, isInt: true}
					continue
				}
			}
			f, err := strconv.ParseFloat(string(t), 64)
			if err != nil {
				return nil, Refuse(ErrInvalidRequest, "verify_responses[%d]: %s %s is not a finite number", i, k, t)
			}
			out[k] = number{f: f}
		}
	}
	return out, nil
}

// falsy is Python's truth test for a JSON value: null, false, 0, "", [] and {}.
func falsy(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	switch string(t) {
	case "null", "false", `""`, "[]", "{}":
		return true
	}
	var v any
	if json.Unmarshal(t, &v) != nil {
		return false
	}
	switch v := v.(type) {
	case float64:
		return v == 0
	case []any:
		return len(v) == 0
	case map[string]any:
		return len(v) == 0
	}
	return false
}

// describe is RewardProfiler.describe_dataframe over the rollouts rows,
// with NaN statistics left out as calculate_metrics_single_df leaves them.
func describe(columns []*column, rows []int) map[string]any {
	type stat struct {
		mean, max, min, median, std float64
		maxInt, minInt              int64
		complete                    bool // every row holds the field
	}
	s := make([]stat, len(columns))
	allStdNaN := true
	for ci, c := range columns {
		filled := make([]float64, len(rows))
		var present []float64
		st := stat{max: math.NaN(), min: math.NaN(), complete: true}
		for ri, r := range rows {
			v := c.values[r]
			if math.IsNaN(v) {
				st.complete = false
				continue
			}
			filled[ri] = v
			present = append(present, v)
			if math.IsNaN(st.max) || v > st.max {
				st.max, st.maxInt = v, c.ints[r]
			}
			if math.IsNaN(st.min) || v < st.min {
				st.min, st.minInt = v, c.ints[r]
			}
		}
		count := float64(len(present))
		st.mean, st.median, st.std = math.NaN(), math.NaN(), math.NaN()
		if len(present) > 0 {
			st.mean = pairwiseSum(filled) / count
			sort.Float64s(present)
			mid := len(present) / 2
			if len(present)%2 == 1 {
				st.median = present[mid]
			} else {
				st.median = (present[mid-1] + present[mid]) / 2
			}
		}
		if len(present) > 1 {
			avg := pairwiseSum(filled) / count
			sqr := make([]float64, len(rows))
			for ri, r := range rows {
				if !math.IsNaN(c.values[r]) {
					d := avg - c.values[r]
					sqr[ri] = d * d
				}
			}
			st.std = math.Sqrt(pairwiseSum(sqr) / (count - 1))
			allStdNaN = false
		}
		s[ci] = st
	}
	out := map[string]any{}
	put := func(name string, v float64) {
		if !math.IsNaN(v) {
			out[name] = Float(v)
		}
	}
	for ci, c := range columns {
		st := s[ci]
		if allStdNaN && st.complete {
			st.std = 0
		}
		put("mean/"+c.name, st.mean)
		if c.integral && !math.IsNaN(st.max) {
			out["max/"+c.name] = st.maxInt
			out["min/"+c.name] = st.minInt
		} else {
			put("max/"+c.name, st.max)
			put("min/"+c.name, st.min)
		}
		put("median/"+c.name, st.median)
		put("std/"+c.name, st.std)
	}
	return out
}

// pairwiseSum adds as NumPy's float64 sum does (pairwise_sum in
// numpy/_core/src/umath/loops_utils.h.src): a plain loop under 8 values,
// eight running sums up to 128, and halves (cut at a multiple of 8) above.
func pairwiseSum(a []float64) float64 {
	n := len(a)
	switch {
	case n < 8:
		res := 0.0
		for _, v := range a {
			res += v
		}
		return res
	case n <= 128:
		var r [8]float64
		copy(r[:], a[:8])
		i := 8
		for ; i < n-n%8; i += 8 {
			for j := range r {
				r[j] += a[i+j]
			}
		}
		res := ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))
		for ; i < n; i++ {
			res += a[i]
		}
		return res
	default:
		n2 := n / 2
		n2 -= n2 % 8
		return pairwiseSum(a[:n2]) + pairwiseSum(a[n2:])
	}
}
