# tier0 — the few targets people expect; each is a thin call of the Go tool
# or a script.
GO       ?= go
PKGS     ?= ./...
BIN      := bin
TESTFLAGS ?= -race -timeout 28m
# Seeds of the in-process simulation (reliability/sim) that make test runs
# without the race detector (its -race pass runs 60); make soak runs
# SIM_SOAK_SEEDS more when set, or seeds for SIM_SOAK_FOR (a duration, e.g.
# 1h) with the table per fault kind and overlap (docs/RELIABILITY.md).
SIM_SEEDS ?= 1000
# Seeds per configuration of the RAID crash-with-loss model (daemon/raid,
# replayable) that make test runs without the race detector (go test: 1).
RAID_CRASHLOSS_SEEDS ?= 40
SIM_SOAK_SEEDS ?=
SIM_SOAK_FOR ?=
export GOFLAGS := -buildvcs=false

.PHONY: all build test test-short fuzz lint bench demo soak deps clean

all: build

build:
	$(GO) build -o $(BIN)/ ./cmd/...

deps:
	./scripts/install-deps.sh

# The README's test command: installs what the suite needs (as root), then
# runs the whole suite.
test: deps
	$(GO) vet $(PKGS)
	$(GO) test $(TESTFLAGS) $(PKGS)
	$(GO) test -count=1 -timeout 20m -run TestSimSeeds ./reliability/sim/ -sim.seeds=$(SIM_SEEDS)
	$(GO) test -count=1 -timeout 10m -run TestModelCrashWithMemberLoss ./daemon/raid/ -args -raid.crashloss.seeds=$(RAID_CRASHLOSS_SEEDS)
	./scripts/fuzz.sh

# A bounded run of every fuzz target (FUZZTIME per target, default 20000x).
fuzz:
	./scripts/fuzz.sh

test-short:
	$(GO) test -short $(PKGS)

lint:
	@test -z "$$(gofmt -l . | tee /dev/stderr)" || (echo "gofmt: files above need formatting" >&2; exit 1)
	$(GO) vet $(PKGS)
	$(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2 $(PKGS)

bench: deps build
	./scripts/bench.sh

# The whole story on this machine: five tier0d under the seed's drive model,
# a local Slurm for the hooks (--local-slurm; not run without Slurm's
# packages) and XFS through a failover in the Linux guest (not run without
# root and QEMU; docs/BENCH.md).
demo: build
	./$(BIN)/tier0 validate --site site-configs/local-5node.yaml --local --local-slurm --out tier0-report

soak: build
	if [ -n "$(SIM_SOAK_SEEDS)" ]; then $(GO) test -count=1 -timeout 0 -run TestSimSeeds ./reliability/sim/ -sim.first=100000 -sim.seeds=$(SIM_SOAK_SEEDS); fi
	if [ -n "$(SIM_SOAK_FOR)" ]; then $(GO) test -count=1 -timeout 0 -v -run TestSimSeeds ./reliability/sim/ -sim.first=100000 -sim.for=$(SIM_SOAK_FOR) -sim.table; fi
	./scripts/soak.sh

clean:
	rm -rf $(BIN) build tier0-report tier0-work
