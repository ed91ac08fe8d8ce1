package gym

// NeMoGymResponse: the `response` an agent's /run reply carries (OpenAI's
// Responses API Response, as Gym serialises it), shared by every harness
// adapter that builds one from its session. The item shapes are
// nemo_gym/openai_utils.py's, repository NVIDIA-NeMo/Gym at commit
// 009d2fec8e644065a260dfb83e58481c94af3562.

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"
)

// Response is Gym's NeMoGymResponse (OpenAI's Responses API Response),
// field for field in the order Gym serialises it. The fields an agent
// never sets are null.
type Response struct {
	ID                 string          `json:"id"`
	CreatedAt          int64           `json:"created_at"`
	Error              json.RawMessage `json:"error"`
	IncompleteDetails  json.RawMessage `json:"incomplete_details"`
	Instructions       json.RawMessage `json:"instructions"`
	Metadata           json.RawMessage `json:"metadata"`
	Model              string          `json:"model"`
	Object             string          `json:"object"`
	Output             []Item          `json:"output"`
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
	Usage *Usage          `json:"usage"`
	User  json.RawMessage `json:"user"`
}

// Item is one output item: *InputMessage, *OutputMessage,
// *Reasoning, *FunctionCall or *FunctionCallOutput.
type Item interface {
	// ItemType is the item's "type" field.
	ItemType() string
}

// InputMessage is Gym's NeMoGymEasyInputMessage: a user message of the
// session after the first (the task is the request's, not the output's).
type InputMessage struct {
	Content []InputText `json:"content"`
	Role    string      `json:"role"`
	Type    string      `json:"type"`
}

// InputText is one input_text part of a InputMessage.
type InputText struct {
	Text string `json:"text"`
	Type string `json:"type"`
}

// OutputMessage is Gym's NeMoGymResponseOutputMessage: assistant text.
type OutputMessage struct {
	ID      string       `json:"id"`
	Content []OutputText `json:"content"`
	Role    string       `json:"role"`
	Status  string       `json:"status"`
	Type    string       `json:"type"`
}

// OutputText is Gym's NeMoGymResponseOutputText.
type OutputText struct {
	Annotations []json.RawMessage `json:"annotations"`
	Text        string            `json:"text"`
	Type        string            `json:"type"`
	Logprobs    json.RawMessage   `json:"logprobs"`
}

// Reasoning is Gym's NeMoGymResponseReasoningItem (Gym's model has no
// status field, so none is sent).
type Reasoning struct {
	ID               string          `json:"id"`
	Summary          []Summary       `json:"summary"`
	Type             string          `json:"type"`
	EncryptedContent json.RawMessage `json:"encrypted_content"`
}

// Summary is one summary_text of a Reasoning.
type Summary struct {
	Text string `json:"text"`
	Type string `json:"type"`
}

// FunctionCall is Gym's NeMoGymResponseFunctionToolCall: an OpenCode
// tool call, its arguments the tool input as Python's json.dumps writes it.
type FunctionCall struct {
	Arguments string          `json:"arguments"`
	CallID    string          `json:"call_id"`
	Name      string          `json:"name"`
	Type      string          `json:"type"`
	ID        json.RawMessage `json:"id"`
	Status    json.RawMessage `json:"status"`
}

// FunctionCallOutput is Gym's NeMoGymFunctionCallOutput: the tool's
// output ("" when the tool has none, e.g. still running or failed).
type FunctionCallOutput struct {
	CallID string          `json:"call_id"`
	Output string          `json:"output"`
	Type   string          `json:"type"`
	ID     json.RawMessage `json:"id"`
	Status json.RawMessage `json:"status"`
}

// ItemType implements Item.
func (*InputMessage) ItemType() string { return "message" }

// ItemType implements Item.
func (*OutputMessage) ItemType() string { return "message" }

// ItemType implements Item.
func (*Reasoning) ItemType() string { return "reasoning" }

// ItemType implements Item.
func (*FunctionCall) ItemType() string { return "function_call" }

// ItemType implements Item.
func (*FunctionCallOutput) ItemType() string { return "function_call_output" }

// Usage is Gym's NeMoGymResponseUsage.
type Usage struct {
	InputTokens         int64               `json:"input_tokens"`
	InputTokensDetails  InputTokensDetails  `json:"input_tokens_details"`
	OutputTokens        int64               `json:"output_tokens"`
	OutputTokensDetails OutputTokensDetails `json:"output_tokens_details"`
	TotalTokens         int64               `json:"total_tokens"`
}

// InputTokensDetails is the usage's input_tokens_details.
type InputTokensDetails struct {
	CachedTokens int64 `json:"cached_tokens"`
}

// OutputTokensDetails is the usage's output_tokens_details.
type OutputTokensDetails struct {
	ReasoningTokens int64 `json:"reasoning_tokens"`
}

// ResponseOptions are the parts of the response that come from the
// request rather than the export.
type ResponseOptions struct {
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

// ResponseOptionsFrom reads a run's responses_create_params for the
// request-side fields: model (else modelServer), tool_choice, tools and
// parallel_tool_calls. Empty params give the defaults.
func ResponseOptionsFrom(params json.RawMessage, modelServer string) (ResponseOptions, error) {
	opt := ResponseOptions{Model: modelServer}
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
		return opt, fmt.Errorf("responses_create_params: %w", err)
	}
	if p.Model != nil && *p.Model != "" {
		opt.Model = *p.Model
	}
	opt.ToolChoice, opt.Tools, opt.ParallelToolCalls = nonNull(p.ToolChoice), nonNull(p.Tools), p.ParallelToolCalls
	return opt, nil
}

// ResponseOptionsFromBody is ResponseOptionsFrom of a /run body's
// responses_create_params (a body that is not an object, or names none,
// gives the defaults).
func ResponseOptionsFromBody(body json.RawMessage, modelServer string) (ResponseOptions, error) {
	var b struct {
		Params json.RawMessage `json:"responses_create_params"`
	}
	_ = json.Unmarshal(body, &b)
	return ResponseOptionsFrom(b.Params, modelServer)
}

func nonNull(raw json.RawMessage) json.RawMessage {
	if t := bytes.TrimSpace(raw); len(t) == 0 || string(t) == "null" {
		return nil
	}
	return raw
}

// NewResponse is the response of opt with no output yet: the request-side
// fields from opt and Gym's defaults where opt has none (an id "resp_"
// and NewHex's hex, created now, tool_choice "auto", tools [], parallel
// tool calls on). opt.NewHex is filled in (random hex) when nil, so the
// caller's item ids come from the same source.
func NewResponse(opt *ResponseOptions) Response {
	if opt.NewHex == nil {
		opt.NewHex = RandomHex
	}
	r := Response{
		ID: opt.ID, CreatedAt: opt.CreatedAt, Model: opt.Model, Object: "response",
		Output: []Item{}, ToolChoice: opt.ToolChoice, Tools: opt.Tools, ParallelToolCalls: true,
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
	return r
}

// RandomHex is 32 random hex digits, as Python's uuid4().hex.
func RandomHex() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never returns an error (Go 1.24 and later)
	return hex.EncodeToString(b[:])
}
