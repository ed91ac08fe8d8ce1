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
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode/utf16"
)

// GymResponse is Gym's NeMoGymResponse (OpenAI's Responses API Response),
// field for field in the order Gym serialises it. The fields OpenCode's
// agent never sets are null.
type GymResponse struct {
	ID                 string          `json:"id"`
	CreatedAt          int64           `json:"created_at"`
	Error              json.RawMessage `json:"error"`
	IncompleteDetails  json.RawMessage `json:"incomplete_details"`
	Instructions       json.RawMessage `json:"instructions"`
	Metadata           json.RawMessage `json:"metadata"`
	Model              string          `json:"model"`
	Object             string          `json:"object"`
	Output             []GymItem       `json:"output"`
	ParallelToolCalls  bool            `json:"parallel_tool_calls"`
	Temperature        json.RawMessage `json:"temperature"`
	ToolChoice         json.RawMessage `json:"tool_choice"`
	Tools              json.RawMessage `json:"tools"`
	TopP               json.RawMessage `json:"top_p"`
	Background         json.RawMessage `json:"background"`
	Conversation       json.RawMessage `json:"conversation"`
	MaxOutputTokens    json.RawMessage `json:"max_output_tokens"`
	MaxToolCalls       json.RawMessage `json:"max_tool_calls"`
	PreviousResponseID json.RawMessage `json:"previous_response_id"`
	Prompt             json.RawMessage `json:"prompt"`
	PromptCacheKey     json.RawMessage `json:"prompt_cache_key"`
	Reasoning          json.RawMessage `json:"reasoning"`
	SafetyIdentifier   json.RawMessage `json:"safety_identifier"`
	ServiceTier        json.RawMessage `json:"service_tier"`
	Status             json.RawMessage `json:"status"`
	Text               json.RawMessage `json:"text"`
	TopLogprobs        json.RawMessage `json:"top_logprobs"`
	Truncation         json.RawMessage `json:"truncation"`
	// Usage is nil (null) when no export was found.
	Usage *GymUsage       `json:"usage"`
	User  json.RawMessage `json:"user"`
}

// GymItem is one output item: *GymInputMessage, *GymOutputMessage,
// *GymReasoning, *GymFunctionCall or *GymFunctionCallOutput.
type GymItem interface {
	// ItemType is the item's "type" field.
	ItemType() string
}

// GymInputMessage is Gym's NeMoGymEasyInputMessage: a user message of the
// session after the first (the task is the request's, not the output's).
type GymInputMessage struct {
	Content []GymInputText `json:"content"`
	Role    string         `json:"role"`
	Type    string         `json:"type"`
}

// GymInputText is one input_text part of a GymInputMessage.
type GymInputText struct {
	Text string `json:"text"`
	Type string `json:"type"`
}

// GymOutputMessage is Gym's NeMoGymResponseOutputMessage: assistant text.
type GymOutputMessage struct {
	ID      string          `json:"id"`
	Content []GymOutputText `json:"content"`
	Role    string          `json:"role"`
	Status  string          `json:"status"`
	Type    string          `json:"type"`
}

// GymOutputText is Gym's NeMoGymResponseOutputText.
type GymOutputText struct {
	Annotations []json.RawMessage `json:"annotations"`
	Text        string            `json:"text"`
	Type        string            `json:"type"`
	Logprobs    json.RawMessage   `json:"logprobs"`
}

// GymReasoning is Gym's NeMoGymResponseReasoningItem (Gym's model has no
// status field, so none is sent).
type GymReasoning struct {
	ID               string          `json:"id"`
	Summary          []GymSummary    `json:"summary"`
	Type             string          `json:"type"`
	EncryptedContent json.RawMessage `json:"encrypted_content"`
}

// GymSummary is one summary_text of a GymReasoning.
type GymSummary struct {
	Text string `json:"text"`
	Type string `json:"type"`
}

// GymFunctionCall is Gym's NeMoGymResponseFunctionToolCall: an OpenCode
// tool call, its arguments the tool input as Python's json.dumps writes it.
type GymFunctionCall struct {
	Arguments string          `json:"arguments"`
	CallID    string          `json:"call_id"`
	Name      string          `json:"name"`
	Type      string          `json:"type"`
	ID        json.RawMessage `json:"id"`
	Status    json.RawMessage `json:"status"`
}

// GymFunctionCallOutput is Gym's NeMoGymFunctionCallOutput: the tool's
// output ("" when the tool has none, e.g. still running or failed).
type GymFunctionCallOutput struct {
	CallID string          `json:"call_id"`
	Output string          `json:"output"`
	Type   string          `json:"type"`
	ID     json.RawMessage `json:"id"`
	Status json.RawMessage `json:"status"`
}

// ItemType implements GymItem.
func (*GymInputMessage) ItemType() string { return "message" }

// ItemType implements GymItem.
func (*GymOutputMessage) ItemType() string { return "message" }

// ItemType implements GymItem.
func (*GymReasoning) ItemType() string { return "reasoning" }

// ItemType implements GymItem.
func (*GymFunctionCall) ItemType() string { return "function_call" }

// ItemType implements GymItem.
func (*GymFunctionCallOutput) ItemType() string { return "function_call_output" }

// GymUsage is Gym's NeMoGymResponseUsage.
type GymUsage struct {
	InputTokens         int64                  `json:"input_tokens"`
	InputTokensDetails  GymInputTokensDetails  `json:"input_tokens_details"`
	OutputTokens        int64                  `json:"output_tokens"`
	OutputTokensDetails GymOutputTokensDetails `json:"output_tokens_details"`
	TotalTokens         int64                  `json:"total_tokens"`
}

// GymInputTokensDetails is the usage's input_tokens_details.
type GymInputTokensDetails struct {
	CachedTokens int64 `json:"cached_tokens"`
}

// GymOutputTokensDetails is the usage's output_tokens_details.
type GymOutputTokensDetails struct {
	ReasoningTokens int64 `json:"reasoning_tokens"`
}

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

// GymResponseOptions are the parts of the response that come from the
// request rather than the export.
type GymResponseOptions struct {
	// ID is the response id; "" makes "resp_" and a random hex id.
	ID string
	// CreatedAt is in Unix seconds; 0 means now.
	CreatedAt int64
	// Model is the request's model, else the model server's name.
	Model string
	// ToolChoice, Tools and ParallelToolCalls are the request's (nil: Gym's
	// defaults "auto", [] and true).
	ToolChoice        json.RawMessage
	Tools             json.RawMessage
	ParallelToolCalls *bool
	// NewHex makes the hex part of each generated id (nil: 32 random hex
	// digits, as uuid4().hex).
	NewHex func() string
}

// GymResponseOptionsFrom reads a run's responses_create_params for the
// request-side fields: model (else modelServer), tool_choice, tools and
// parallel_tool_calls. Empty params give the defaults.
func GymResponseOptionsFrom(params json.RawMessage, modelServer string) (GymResponseOptions, error) {
	opt := GymResponseOptions{Model: modelServer}
	if len(bytes.TrimSpace(params)) == 0 {
		return opt, nil
	}
	var p struct {
		Model             *string         `json:"model"`
		ToolChoice        json.RawMessage `json:"tool_choice"`
		Tools             json.RawMessage `json:"tools"`
		ParallelToolCalls *bool           `json:"parallel_tool_calls"`
	}
	if err := json.Unmarshal(params, &p); err != nil {
		return opt, fmt.Errorf("opencode: responses_create_params: %w", err)
	}
	if p.Model != nil && *p.Model != "" {
		opt.Model = *p.Model
	}
	opt.ToolChoice, opt.Tools, opt.ParallelToolCalls = nonNull(p.ToolChoice), nonNull(p.Tools), p.ParallelToolCalls
	return opt, nil
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
func BuildGymResponse(export json.RawMessage, opt GymResponseOptions) (GymResponse, bool, error) {
	if opt.NewHex == nil {
		opt.NewHex = randomHex
	}
	r := GymResponse{
		ID: opt.ID, CreatedAt: opt.CreatedAt, Model: opt.Model, Object: "response",
		Output: []GymItem{}, ToolChoice: opt.ToolChoice, Tools: opt.Tools, ParallelToolCalls: true,
	}
	if r.ID == "" {
		r.ID = "resp_" + opt.NewHex()
	}
	if r.CreatedAt == 0 {
		r.CreatedAt = time.Now().Unix()
	}
	if r.ToolChoice == nil {
		r.ToolChoice = json.RawMessage(`"auto"`)
	}
	if r.Tools == nil {
		r.Tools = json.RawMessage(`[]`)
	}
	if opt.ParallelToolCalls != nil {
		r.ParallelToolCalls = *opt.ParallelToolCalls
	}
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
func gymItems(e *gymExport, newHex func() string) ([]GymItem, error) {
	var items []GymItem
	for i, m := range *e.Messages {
		where := fmt.Sprintf("opencode: the session export's message %d (%s)", i, m.Info.ID)
		if m.Info.Role == nil {
			return nil, fmt.Errorf("%s has no role", where)
		}
		switch *m.Info.Role {
		case "user":
			in := &GymInputMessage{Content: []GymInputText{}, Role: "user", Type: "message"}
			for _, p := range m.Parts {
				if p.Type != "text" {
					continue
				}
				in.Content = append(in.Content, GymInputText{Text: deref(p.Text), Type: "input_text"})
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
func assistantItems(text string, newHex func() string) []GymItem {
	var items []GymItem
	if spans := thinkSpan.FindAllStringSubmatch(text, -1); len(spans) > 0 {
		rs := &GymReasoning{ID: "rs_" + newHex(), Summary: make([]GymSummary, 0, len(spans)), Type: "reasoning"}
		for _, s := range spans {
			rs.Summary = append(rs.Summary, GymSummary{Text: s[1], Type: "summary_text"})
		}
		items = append(items, rs)
		text = thinkSpan.ReplaceAllLiteralString(text, "")
	}
	if text != "" || len(items) == 0 {
		items = append(items, &GymOutputMessage{
			ID:      "msg_" + newHex(),
			Content: []GymOutputText{{Annotations: []json.RawMessage{}, Text: text, Type: "output_text"}},
			Role:    "assistant", Status: "completed", Type: "message",
		})
	}
	return items
}

// toolItems is a tool part's call and output.
func toolItems(p gymPart) (*GymFunctionCall, *GymFunctionCallOutput, error) {
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
	return &GymFunctionCall{Arguments: args, CallID: *p.CallID, Name: *p.Tool, Type: "function_call"},
		&GymFunctionCallOutput{CallID: *p.CallID, Output: output, Type: "function_call_output"}, nil
}

// gymUsage sums the token counts of the assistant messages that have any:
// input, cache.read, output and reasoning are required, total is 0 when
// missing.
func gymUsage(e *gymExport) (GymUsage, error) {
	var u GymUsage
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

func randomHex() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never returns an error (Go 1.24 and later)
	return hex.EncodeToString(b[:])
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
