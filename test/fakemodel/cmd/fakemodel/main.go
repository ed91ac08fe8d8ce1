// Command fakemodel runs the fake model server of package fakemodel by hand
// (chat completions, Responses and Messages APIs, scripted by
// fakemodel.DefaultScript), for trying a harness against it: it prints the
// server's URL, logs every request to stderr, and on SIGINT or SIGTERM
// writes the requests it saw (one JSON object a line) to the -requests file
// if given.
//
//	fakemodel [-cmd 'echo hi'] [-requests FILE]
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

	"github.com/ngharness/ngharness/test/fakemodel"
)

func main() {
	cmd := flag.String("cmd", "echo hello-from-fakemodel", "the command the scripted shell tool call runs")
	out := flag.String("requests", "", "write the requests seen to this file (JSON lines) on exit")
	flag.Parse()
	logger := log.New(os.Stderr, "", log.Ltime|log.Lmicroseconds)
	s := fakemodel.New(fakemodel.Options{Script: fakemodel.DefaultScript(*cmd), Logf: logger.Printf})
	if err := s.Start(); err != nil {
		logger.Fatal(err)
	}
	fmt.Println(s.URL())
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
