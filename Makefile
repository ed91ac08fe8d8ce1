# ngharness: build, test, benchmark and demo targets.
# `make test` is what CI runs (.ci/run); `make demo` runs one rollout end to end.

GO        ?= go
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT    ?= $(shell git rev-parse HEAD 2>/dev/null)
LDFLAGS   := -s -w -X main.version=$(VERSION) -X main.commit=$(COMMIT)
BIN       := bin

.PHONY: all build ngsup ngresume ngdriver test test-packages test-short bench soak lint demo fuzz clean

all: build

build: ngsup ngresume ngdriver

# ngsup is uploaded into sandboxes: static (no cgo), stripped, per architecture.
ngsup:
	@mkdir -p $(BIN)
	CGO_ENABLED=0 GOOS=linux GOARCH=amd64 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/ngsup-linux-amd64 ./cmd/ngsup
	CGO_ENABLED=0 GOOS=linux GOARCH=arm64 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/ngsup-linux-arm64 ./cmd/ngsup
	cp $(BIN)/ngsup-linux-$(shell $(GO) env GOARCH) $(BIN)/ngsup

# ngresume continues a saved OpenCode session in a sandbox; uploaded only when
# a relaunch needs it (it carries an HTTP client, which ngsup does not).
ngresume:
	@mkdir -p $(BIN)
	CGO_ENABLED=0 GOOS=linux GOARCH=amd64 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/ngresume-linux-amd64 ./cmd/ngresume
	CGO_ENABLED=0 GOOS=linux GOARCH=arm64 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/ngresume-linux-arm64 ./cmd/ngresume

ngdriver:
	@mkdir -p $(BIN)
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/ngdriver ./cmd/ngdriver

# The whole suite: real processes, real signals, real /proc. Run as root for
# the cgroup and mount-namespace tests (they skip with a message otherwise).
# The driver's suite (pkg/driver) runs once per backend: through the local
# backend with every other package, and through each backend of
# DRIVER_BACKENDS (internal/drivertest's BackendEnv: the fake OpenSandbox,
# a real Docker engine, which skips saying why when none was started) beside them,
# each its own `go test` of the same package. test/gym_e2e runs on its own
# after the rest: in one CI run beside the other e2e packages, processes of
# one of its paused launches vanished. The likely cause (launch ids shared
# across deployments on one host) is fixed; it stays apart until CI runs
# show it (docs/gym.md "Left out, and why"). The timeouts are per package.
DRIVER_BACKENDS ?= opensandbox docker-real

test: build
	$(GO) vet ./...
	$(MAKE) --no-print-directory --output-sync=target -j $$(( 1 + $(words $(DRIVER_BACKENDS)) )) \
		test-packages $(addprefix test-driver-,$(DRIVER_BACKENDS))
	$(GO) test -race -count=1 -timeout 20m ./test/gym_e2e/

# Every package but test/gym_e2e, the driver's through the local backend.
test-packages:
	$(GO) test -race -count=1 -timeout 30m $$($(GO) list ./... | grep -v /test/gym_e2e$$)

# The driver's suite through one backend: make test-driver-opensandbox,
# test-driver-docker-real, or test-driver-docker or test-driver-kubectl (the
# fake docker or kubectl CLI).
test-driver-%:
	DRIVERTEST_BACKEND=$* $(GO) test -count=1 -timeout 20m ./pkg/driver/

test-short:
	$(GO) test -short -count=1 ./...

# Pause/continue benchmarks on real process trees (root), binary sizes and
# start time, the stop of a fork storm whose supervisor is gone and the idle
# supervisor's CPU, as a table of medians (docs/BENCHMARKS.md). The raw Go
# benchmark output is kept in $(BIN)/bench.txt.
bench: build
	GO=$(GO) BIN=$(BIN) ./scripts/bench.sh

# The scale benchmark of ngdriver serve (root): 512 rollouts, a checkpoint
# every 10 s for 2 minutes, a crash and restore in the middle.
soak: build
	$(GO) run ./test/soak -bin $(BIN) $(SOAK_FLAGS)

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...

fuzz:
	$(GO) test -run '^$$' -fuzz FuzzDecodeReceipt -fuzztime 30s ./pkg/proto/

demo: build
	$(BIN)/ngdriver run --steps 16 --step 500ms --checkpoint-at 2s --crash-at 6s

clean:
	rm -rf $(BIN)
