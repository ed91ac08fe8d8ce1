package opencode

// NeMo Gym's view of an OpenCode rollout: the `response` its /run reply
// carries, built from the session export, and the agent's own opencode_*
// fields beside it.
//
// This follows Gym's OpenCode agent, repository NVIDIA-NeMo/Gym at commit
// 05b60d59d226b633692523d57b73cc538a24d81a:
//   - responses_api_agents/opencode_sandboxed_agent/app.py: the export to
//     output items and usages (_opencode_export_to_output_items,
//     _opencode_export_to_usages), the reply of responses() and the
//     run_result fields that run() adds to the verify reply;
//   - responses_api_agents/opencode_sandboxed_agent/tests/test_app.py: the
//     cases ported in gymresponse_test.go.
//
// The item shapes are nemo_gym/openai_utils.py's (commit
// 009d2fec8e644065a260dfb83e58481c94af3562) and the assistant text goes
// through nemo_gym/responses_converter.py's postprocess_assistant_message_dict
// (commit 6fb2e8c4302db41de7849d1999c1d0567d23cee0), which splits
// <think>...</think> spans out as reasoning items.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf16"

	"github.com/ngharness/ngharness/pkg/gym"
)

// GymRunFields are the fields Gym's OpenCode agent adds to the verify reply
// in its /run reply.
type GymRunFields struct {
	// ResultsFpath is where the agent saved the export, "" when none was
	// found.
	ResultsFpath string `json:"opencode_results_fpath"`
	// RunStdout and RunStderr are what the OpenCode run printed.
	RunStdout string `json:"opencode_run_stdout"`
	RunStderr string `json:"opencode_run_stderr"`
	// ExportFound: a non-empty session export was read.
	ExportFound bool `json:"opencode_export_found"`
	// Finished: the OpenCode run ran to its end (Gym echoes a marker after
	// `opencode run` exits 0 and looks for it).
	Finished bool `json:"opencode_finished"`
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func nonNull(raw json.RawMessage) json.RawMessage {
	if t := bytes.TrimSpace(raw); len(t) == 0 || string(t) == "null" {
		return nil
	}
	return raw
}

// BuildGymResponse builds the NeMoGymResponse of a run from its session
// export (what `opencode export` printed, banner removed), as Gym's OpenCode
// agent does, and tells whether an export was found. An empty export, null
// or {} is "not found": no output and a null usage. Otherwise the output is
// every message's items but the first (the task), and the usage the sum over
// assistant messages. An export Gym's agent would fail on (an unknown role or
// part type, a tool part without callID, tool or state.input, a token count
// missing) is an error naming the message and what is wrong; a text part
// without text counts as empty.
func BuildGymResponse(export json.RawMessage, opt gym.ResponseOptions) (gym.Response, bool, error) {
	r := gym.NewResponse(&opt)
	e, found, err := parseGymExport(export)
	if err != nil || !found {
		return r, found, err
	}
	items, err := gymItems(e, opt.NewHex)
	if err != nil {
		return r, true, err
	}
	if len(items) > 1 {
		r.Output = items[1:]
	}
	usage, err := gymUsage(e)
	if err != nil {
		return r, true, err
	}
	r.Usage = &usage
	return r, true, nil
}

// gymExport is the part of an export the builder reads. Fields are
// pointers or raw where Gym tells a missing key from an empty one.
type gymExport struct {
	Messages *[]struct {
		Info struct {
			ID     string          `json:"id"`
			Role   *string         `json:"role"`
			Tokens json.RawMessage `json:"tokens"`
		} `json:"info"`
		Parts []gymPart `json:"parts"`
	} `json:"messages"`
}

type gymPart struct {
	ID     string  `json:"id"`
	Type   string  `json:"type"`
	Text   *string `json:"text"`
	CallID *string `json:"callID"`
	Tool   *string `json:"tool"`
	State  *struct {
		Input  json.RawMessage `json:"input"`
		Output json.RawMessage `json:"output"`
	} `json:"state"`
}

func parseGymExport(export json.RawMessage) (*gymExport, bool, error) {
	t := bytes.TrimSpace(export)
	if len(t) == 0 || string(t) == "null" {
		return nil, false, nil
	}
	var probe map[string]json.RawMessage
	if err := json.Unmarshal(t, &probe); err != nil {
		return nil, false, fmt.Errorf("opencode: the session export is not a JSON object: %w", err)
	}
	if len(probe) == 0 {
		return nil, false, nil
	}
	var e gymExport
	if err := json.Unmarshal(t, &e); err != nil {
		return nil, true, fmt.Errorf("opencode: the session export: %w", err)
	}
	if e.Messages == nil {
		return nil, true, errors.New("opencode: the session export has no messages")
	}
	return &e, true, nil
}

// gymItems turns every message into items: a user message into one input
// message of its text parts; each assistant part in turn: text through
// Gym's converter (reasoning from <think> spans, then the rest as a
// message), reasoning the same once wrapped in <think>, a tool into its
// call and its output; step-start, step-finish and patch parts are skipped.
func gymItems(e *gymExport, newHex func() string) ([]gym.Item, error) {
	var items []gym.Item
	for i, m := range *e.Messages {
		where := fmt.Sprintf("opencode: the session export's message %d (%s)", i, m.Info.ID)
		if m.Info.Role == nil {
			return nil, fmt.Errorf("%s has no role", where)
		}
		switch *m.Info.Role {
		case "user":
			in := &gym.InputMessage{Content: []gym.InputText{}, Role: "user", Type: "message"}
			for _, p := range m.Parts {
				if p.Type != "text" {
					continue
				}
				in.Content = append(in.Content, gym.InputText{Text: deref(p.Text), Type: "input_text"})
			}
			items = append(items, in)
		case "assistant":
			for _, p := range m.Parts {
				switch p.Type {
				case "text", "reasoning":
					text := deref(p.Text)
					if p.Type == "reasoning" && text != "" {
						text = "<think>" + text + "</think>"
					}
					items = append(items, assistantItems(text, newHex)...)
				case "tool":
					call, out, err := toolItems(p)
					if err != nil {
						return nil, fmt.Errorf("%s: %w", where, err)
					}
					items = append(items, call, out)
				case "step-finish", "step-start", "patch":
				default:
					return nil, fmt.Errorf("%s has a part of type %q, which Gym's OpenCode agent does not convert", where, p.Type)
				}
			}
		default:
			return nil, fmt.Errorf("%s has role %q, not user or assistant", where, *m.Info.Role)
		}
	}
	return items, nil
}

// thinkSpan is Gym's reasoning pattern (non-greedy, across lines).
var thinkSpan = regexp.MustCompile(`(?s)<think>(.*?)</think>`)

// assistantItems is Gym's postprocess_assistant_message_dict for a message
// of text alone: one reasoning item of the <think> spans, if any, then the
// text left once they are cut out, as a message, if any is left or there
// was no reasoning (so an empty text still gives an empty message).
func assistantItems(text string, newHex func() string) []gym.Item {
	var items []gym.Item
	if spans := thinkSpan.FindAllStringSubmatch(text, -1); len(spans) > 0 {
		rs := &gym.Reasoning{ID: "rs_" + newHex(), Summary: make([]gym.Summary, 0, len(spans)), Type: "reasoning"}
		for _, s := range spans {
			rs.Summary = append(rs.Summary, gym.Summary{Text: s[1], Type: "summary_text"})
		}
		items = append(items, rs)
		text = thinkSpan.ReplaceAllLiteralString(text, "")
	}
	if text != "" || len(items) == 0 {
		items = append(items, &gym.OutputMessage{
			ID:      "msg_" + newHex(),
			Content: []gym.OutputText{{Annotations: []json.RawMessage{}, Text: text, Type: "output_text"}},
			Role:    "assistant", Status: "completed", Type: "message",
		})
	}
	return items
}

// toolItems is a tool part's call and output.
func toolItems(p gymPart) (*gym.FunctionCall, *gym.FunctionCallOutput, error) {
	switch {
	case p.CallID == nil:
		return nil, nil, fmt.Errorf("tool part %s has no callID", p.ID)
	case p.Tool == nil:
		return nil, nil, fmt.Errorf("tool part %s has no tool", p.ID)
	case p.State == nil || len(p.State.Input) == 0:
		return nil, nil, fmt.Errorf("tool part %s has no state.input", p.ID)
	}
	args, err := pythonJSON(p.State.Input)
	if err != nil {
		return nil, nil, fmt.Errorf("tool part %s: state.input: %w", p.ID, err)
	}
	output := ""
	if o := nonNull(p.State.Output); o != nil {
		if err := json.Unmarshal(o, &output); err != nil {
			return nil, nil, fmt.Errorf("tool part %s: state.output is not a string", p.ID)
		}
	}
	return &gym.FunctionCall{Arguments: args, CallID: *p.CallID, Name: *p.Tool, Type: "function_call"},
		&gym.FunctionCallOutput{CallID: *p.CallID, Output: output, Type: "function_call_output"}, nil
}

// gymUsage sums the token counts of the assistant messages that have any:
// input, cache.read, output and reasoning are required, total is 0 when
// missing.
func gymUsage(e *gymExport) (gym.Usage, error) {
	var u gym.Usage
	for i, m := range *e.Messages {
		if m.Info.Role == nil || *m.Info.Role != "assistant" {
			continue
		}
		where := fmt.Sprintf("opencode: the session export's message %d (%s)", i, m.Info.ID)
		if nonNull(m.Info.Tokens) == nil {
			continue
		}
		var fields map[string]json.RawMessage
		if err := json.Unmarshal(m.Info.Tokens, &fields); err != nil {
			return u, fmt.Errorf("%s: tokens: %w", where, err)
		}
		if len(fields) == 0 {
			continue // {} counts nothing, as a missing one
		}
		var tok struct {
			Input     *json.Number `json:"input"`
			Output    *json.Number `json:"output"`
			Reasoning *json.Number `json:"reasoning"`
			Total     *json.Number `json:"total"`
			Cache     *struct {
				Read *json.Number `json:"read"`
			} `json:"cache"`
		}
		if err := json.Unmarshal(m.Info.Tokens, &tok); err != nil {
			return u, fmt.Errorf("%s: tokens: %w", where, err)
		}
		var cacheRead *json.Number
		if tok.Cache != nil {
			cacheRead = tok.Cache.Read
		}
		zero := json.Number("0")
		if tok.Total == nil {
			tok.Total = &zero
		}
		for _, f := range []struct {
			name string
			n    *json.Number
			sum  *int64
		}{
			{"input", tok.Input, &u.InputTokens},
			{"cache.read", cacheRead, &u.InputTokensDetails.CachedTokens},
			{"output", tok.Output, &u.OutputTokens},
			{"reasoning", tok.Reasoning, &u.OutputTokensDetails.ReasoningTokens},
			{"total", tok.Total, &u.TotalTokens},
		} {
			if f.n == nil {
				return u, fmt.Errorf("%s has no tokens.%s", where, f.name)
			}
			v, err := tokenCount(*f.n)
			if err != nil {
				return u, fmt.Errorf("%s: tokens.%s: %w", where, f.name, err)
			}
			*f.sum += v
		}
	}
	return u, nil
}

// tokenCount reads a count: an integer, or a float with no fraction (as
// Pydantic accepts for an int field).
func tokenCount(n json.Number) (int64, error) {
	if v, err := n.Int64(); err == nil {
		return v, nil
	}
	f, err := n.Float64()
	if err != nil || f != math.Trunc(f) || math.Abs(f) > 1<<53 {
		return 0, fmt.Errorf("%s is not a whole number", n)
	}
	return int64(f), nil
}

// pythonJSON writes a JSON value as Python's json.dumps does by default:
// ", " and ": " between items, keys in their order, all but printable ASCII
// escaped (\uXXXX unless it has a short escape), integers as written and
// other numbers as Python's repr of the float.
func pythonJSON(raw json.RawMessage) (string, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var b strings.Builder
	if err := writePython(&b, dec); err != nil {
		return "", err
	}
	if _, err := dec.Token(); err == nil {
		return "", errors.New("more than one JSON value")
	}
	return b.String(), nil
}

func writePython(b *strings.Builder, dec *json.Decoder) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	switch v := tok.(type) {
	case json.Delim:
		open, close := byte(v), byte('}')
		if v == '[' {
			close = ']'
		}
		b.WriteByte(open)
		for n := 0; dec.More(); n++ {
			if n > 0 {
				b.WriteString(", ")
			}
			if open == '{' {
				key, err := dec.Token()
				if err != nil {
					return err
				}
				writePythonString(b, key.(string))
				b.WriteString(": ")
			}
			if err := writePython(b, dec); err != nil {
				return err
			}
		}
		if _, err := dec.Token(); err != nil {
			return err
		}
		b.WriteByte(close)
	case string:
		writePythonString(b, v)
	case json.Number:
		b.WriteString(pythonNumber(v))
	case bool:
		b.WriteString(strconv.FormatBool(v))
	case nil:
		b.WriteString("null")
	}
	return nil
}

func writePythonString(b *strings.Builder, s string) {
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"':
			b.WriteString(`\"`)
		case r == '\\':
			b.WriteString(`\\`)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\b':
			b.WriteString(`\b`)
		case r == '\f':
			b.WriteString(`\f`)
		case r < 0x20 || r > 0x7e:
			if r > 0xffff {
				r1, r2 := utf16.EncodeRune(r)
				fmt.Fprintf(b, `\u%04x\u%04x`, r1, r2)
			} else {
				fmt.Fprintf(b, `\u%04x`, r)
			}
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
}

// pythonNumber is how json.dumps writes a number json.loads read: an
// integer literal stays one (Python ints are unbounded), anything else is a
// float written as Python's repr.
func pythonNumber(n json.Number) string {
	s := string(n)
	if !strings.ContainsAny(s, ".eE") {
		if strings.TrimLeft(s, "-0") == "" {
			return "0"
		}
		return s
	}
	f, err := strconv.ParseFloat(s, 64)
	switch {
	case err != nil && math.IsInf(f, 1):
		return "Infinity"
	case err != nil && math.IsInf(f, -1):
		return "-Infinity"
	}
	return pythonFloat(f)
}

// pythonFloat is Python's repr of a float: the shortest digits that read
// back the same, fixed-point (with ".0" when whole) for exponents -4 to 15,
// else scientific with a signed exponent of at least two digits.
func pythonFloat(f float64) string {
	sci := strconv.FormatFloat(f, 'e', -1, 64) // e.g. -1.25e+07
	mant, exp, _ := strings.Cut(sci, "e")
	x, _ := strconv.Atoi(exp)
	if x >= -4 && x < 16 {
		s := strconv.FormatFloat(f, 'f', -1, 64)
		if !strings.Contains(s, ".") {
			s += ".0"
		}
		return s
	}
	sign := "+"
	if x < 0 {
		sign, x = "-", -x
	}
	return fmt.Sprintf("%se%s%02d", mant, sign, x)
}
