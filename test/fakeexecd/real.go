package fakeexecd

import (
	"fmt"
	"os"
)

// The environment that points the OpenSandbox tests (the backend's
// conformance suite, the backends_e2e opensandbox tests) at a real
// OpenSandbox server instead of this fake.
const (
	// RealURLEnv is the lifecycle server's URL, e.g. http://opensandbox:8080.
	RealURLEnv = "NGHARNESS_OPENSANDBOX_URL"
	// RealAPIKeyEnv is its API key (OPEN-SANDBOX-API-KEY).
	RealAPIKeyEnv = "NGHARNESS_OPENSANDBOX_API_KEY"
	// RealImageEnv is the image the tests' sandboxes are made from: a GNU
	// userland with bash (coreutils, procps-free is fine).
	RealImageEnv = "NGHARNESS_OPENSANDBOX_IMAGE"
	// RealRootEnv and RealWorkdirEnv, if set, are the backend's root and
	// workdir in those sandboxes (default /var/lib/ngharness, /workspace).
	RealRootEnv    = "NGHARNESS_OPENSANDBOX_ROOT"
	RealWorkdirEnv = "NGHARNESS_OPENSANDBOX_WORKDIR"
)

// Real names a real OpenSandbox server.
type Real struct {
	URL, APIKey, Image, Root, Workdir string
}

// RealServer reads RealURLEnv, RealAPIKeyEnv and RealImageEnv: ok is
// false when no URL is set (the tests use the fake); a URL without an
// image is an error naming what is missing.
func RealServer() (r Real, ok bool, err error) {
	r = Real{URL: os.Getenv(RealURLEnv), APIKey: os.Getenv(RealAPIKeyEnv), Image: os.Getenv(RealImageEnv),
		Root: os.Getenv(RealRootEnv), Workdir: os.Getenv(RealWorkdirEnv)}
	if r.URL == "" {
		return r, false, nil
	}
	if r.Image == "" {
		return r, true, fmt.Errorf("%s is set but %s is not: name the image the test sandboxes are made from", RealURLEnv, RealImageEnv)
	}
	return r, true, nil
}

// SkipIfReal is the line a fake-only test skips with when the tests run
// against a real server.
func SkipIfReal() string {
	if os.Getenv(RealURLEnv) == "" {
		return ""
	}
	return fmt.Sprintf("%s is set: this test needs the fake OpenSandbox (its fault modes or its view of the sandboxes from this machine)", RealURLEnv)
}
