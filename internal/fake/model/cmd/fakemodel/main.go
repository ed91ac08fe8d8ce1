// Command fakemodel runs the fake model server of internal/fake/model by
// hand (chat completions, Responses and Messages APIs, scripted by its
// DefaultScript), for trying a harness against it, or as the
// policy model of a NeMo Gym deployment in tests: it prints
// "fakemodel listening on <URL>", logs every request to stderr, and on
// SIGINT or SIGTERM writes the requests it saw (one JSON object a line) to
// the -requests file if given.
//
//	fakemodel [-cmd 'echo hi'] [-requests FILE] [-listen ADDR]
//	          [-checkpoint-token-env NAME [-instance NAME] [-lease-grace D]]
//
// With -checkpoint-token-env naming a variable that holds a token, the
// server takes part in Gym's checkpoints as the policy model (kind
// "model", instance -instance): Gym's control routes under
// /ng-control/v1/checkpoint need "Authorization: Bearer <token>". Without
// it the server takes part in none (the control routes answer 404).
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"
	"time"

	fakemodel "github.com/ngharness/ngharness/internal/fake/model"
)

func main() {
	cmd := flag.String("cmd", "echo hello-from-fakemodel", "the command the scripted shell tool call runs")
	out := flag.String("requests", "", "write the requests seen to this file (JSON lines) on exit")
	listen := flag.String("listen", "127.0.0.1:0", "the address to listen on")
	tokenEnv := flag.String("checkpoint-token-env", "", "take part in NeMo Gym's checkpoints as the policy model, with the control token in this environment variable")
	instance := flag.String("instance", fakemodel.DefaultInstance, "the participant instance (with -checkpoint-token-env)")
	grace := flag.Duration("lease-grace", fakemodel.DefaultLeaseGrace, "Gym's lease_grace_seconds (with -checkpoint-token-env)")
	flag.Parse()
	logger := log.New(os.Stderr, "", log.Ltime|log.Lmicroseconds)
	opt := fakemodel.Options{Script: fakemodel.DefaultScript(*cmd), Logf: logger.Printf, Addr: *listen}
	if *tokenEnv != "" {
		token := os.Getenv(*tokenEnv)
		if token == "" {
			fmt.Fprintf(os.Stderr, "fakemodel: -checkpoint-token-env %s: the variable is empty or unset\n", *tokenEnv)
			os.Exit(2)
		}
		opt.Checkpoint = &fakemodel.Checkpoint{Token: token, Instance: *instance, LeaseGrace: *grace}
	}
	s := fakemodel.New(opt)
	if err := s.Start(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if opt.Checkpoint != nil {
		logger.Printf("fakemodel: checkpoint participant kind model instance %s lease grace %s", *instance, grace.Round(time.Second))
	}
	fmt.Println("fakemodel listening on", s.URL())
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	<-sig
	s.Close()
	if *out != "" {
		if err := writeRequests(*out, s.Requests()); err != nil {
			logger.Fatal(err)
		}
	}
}

func writeRequests(path string, reqs []fakemodel.Request) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(f)
	enc := json.NewEncoder(w)
	for _, r := range reqs {
		if err := enc.Encode(r); err != nil {
			f.Close()
			return err
		}
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
