package gym

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
)

// route is one checkpoint control route: everything the handler
// (NewHandler), the request decoder (DecodeRequest) and the phase machine
// (admitLocked) know of it. Adding a route is its Op name, a row in
// routes, and the Control method the row calls.
type route struct {
	// op is its name: the last element of its path under RoutePrefix.
	op string
	// method is its HTTP method; a POST route takes a body.
	method string
	// fields are the body's fields beside checkpoint_id and deadline_ts
	// (Request): any other field is refused.
	fields []string
	// decode reads those fields into the request serve takes, given the
	// decoded checkpoint_id and deadline_ts (nil: the request is the
	// *Request itself).
	decode func(base Request, fields map[string]json.RawMessage) (any, error)
	// serve answers a decoded request (nil for a GET route).
	serve func(c *Control, ctx context.Context, req any) (any, error)
	// phases are the phases it is accepted in (nil: any). With the move
	// each one makes, the rows are the whole machine (control.py's
	// docstring):
	//
	//	prepare         idle|preparing -> preparing -> prepared (once ready)
	//	commit          prepared -> committed
	//	restore         idle -> restored
	//	resume          preparing|prepared|committed|restored -> idle (also on lease expiry)
	//	renew           any open phase, no move
	//	retire, forget  idle|restored, no move
	phases []Phase
}

// notIdle is every phase a checkpoint is open in.
var notIdle = []Phase{PhasePreparing, PhasePrepared, PhaseCommitted, PhaseRestored}

// routes is the one table of the control routes, in a checkpoint's order
// (docs/gym.md lists them so). It is set in init: its rows call the
// Control methods, which look their phases up in it.
var routes []route

// routeOf is routes by op.
var routeOf map[string]*route

func init() {
	routes = []route{
		{op: OpStatus, method: http.MethodGet,
			serve: func(c *Control, _ context.Context, _ any) (any, error) { return c.Status(), nil }},
		{op: OpPrepare, method: http.MethodPost, serve: serveAs((*Control).Prepare),
			phases: []Phase{PhaseIdle, PhasePreparing}},
		{op: OpCommit, method: http.MethodPost, serve: serveAs((*Control).Commit),
			fields: []string{"checkpoint_dir", "episode_ids", "stop"}, decode: decodeCommit,
			phases: []Phase{PhasePrepared}},
		{op: OpRestore, method: http.MethodPost, serve: serveAs((*Control).Restore),
			fields: []string{"checkpoint_dir", "episode_ids"}, decode: decodeRestore,
			phases: []Phase{PhaseIdle}},
		{op: OpResume, method: http.MethodPost, serve: serveAs((*Control).Resume),
			phases: notIdle},
		{op: OpRenew, method: http.MethodPost, serve: serveAs((*Control).Renew),
			phases: notIdle},
		{op: OpRetire, method: http.MethodPost, serve: serveAs((*Control).Retire),
			fields: []string{"episode_ids"}, decode: decodeRetire,
			phases: []Phase{PhaseIdle, PhaseRestored}},
		{op: OpForget, method: http.MethodPost, serve: serveAs((*Control).Forget),
			fields: []string{"rollout_ids"}, decode: decodeForget,
			phases: []Phase{PhaseIdle, PhaseRestored}},
	}
	routeOf = map[string]*route{}
	for i := range routes {
		routeOf[routes[i].op] = &routes[i]
	}
}

// Ops lists the operations of the control routes, in the table's order:
// the names a caller may put after RoutePrefix.
func Ops() []string {
	ops := make([]string, len(routes))
	for i, r := range routes {
		ops[i] = r.op
	}
	return ops
}

// serveAs is the serve of a route whose Control method takes request type
// R: the decoded request (*R for a *Request that R is by value) is handed
// to it.
func serveAs[R, A any](m func(*Control, context.Context, R) (A, error)) func(*Control, context.Context, any) (any, error) {
	return func(c *Control, ctx context.Context, req any) (any, error) {
		if p, ok := req.(*R); ok {
			return m(c, ctx, *p)
		}
		return m(c, ctx, req.(R))
	}
}

// allows says whether the route is accepted in phase p.
func (r *route) allows(p Phase) bool {
	return r.phases == nil || slices.Contains(r.phases, p)
}
