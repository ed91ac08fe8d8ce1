package gym_test

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/ngharness/ngharness/pkg/gym"
)

// nothing is the smallest participant: it holds no state, so it is always
// ready and exports nothing.
type nothing struct{}

func (nothing) Kind() string                                                  { return gym.KindAgent }
func (nothing) CloseAdmission(context.Context, gym.Request) error             { return nil }
func (nothing) OpenAdmission(context.Context) error                           { return nil }
func (nothing) Readiness() gym.Report                                         { return gym.NewReport(true, nil, nil, nil) }
func (nothing) Export(context.Context, []gym.EpisodeID) ([]gym.Record, error) { return nil, nil }
func (nothing) Install(context.Context, []gym.Record, []gym.EpisodeID) error  { return nil }
func (nothing) Retire(context.Context, gym.EpisodeID) error                   { return nil }
func (nothing) ParkExported(context.Context, []gym.Record) error              { return nil }

// A server plugs its participant into a Control and mounts the routes.
func Example() {
	control, err := gym.NewControl(nothing{}, gym.Config{Instance: "my_agent", LeaseGrace: 600 * time.Second})
	if err != nil {
		panic(err)
	}
	routes, err := gym.NewHandler(control, "the control_auth_token")
	if err != nil {
		panic(err)
	}
	mux := http.NewServeMux()
	mux.Handle(gym.RoutePrefix+"/", routes)

	id, _ := gym.ParseCaptureKey("task7-0-a2")
	fmt.Println(id.RolloutID, id.Attempt, id.Next().CaptureKey())
	// Output: task7-0 2 task7-0-a3
}
