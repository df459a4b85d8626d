# Airlock build and test entry points. Everything runs as root on Debian 12.
GO        ?= $(shell command -v go 2>/dev/null || echo /usr/local/go/bin/go)
DATA_DIR  ?= /var/lib/airlock
# make run serves https://api.$(DOMAIN) and https://<port>-<id>.$(DOMAIN) on :443
# (*.localhost is loopback: no DNS set-up); DOMAIN= serves plain HTTP only.
DOMAIN    ?= airlock.localhost
TEST_DATA ?= /var/lib/airlock-test

.PHONY: build setup setup-test run test test-go test-sdk bench proto clean

build: bin/airlock bin/envd

# envd runs inside arbitrary root filesystems: linked statically. cgo only for
# its pid 1, C that runs before Go (cmd/envd/pid1.c); Go's own DNS resolver and
# user lookup (netgo, osusergo), not glibc's, which a static binary cannot load.
bin/envd: FORCE
	CGO_ENABLED=1 $(GO) build -tags netgo,osusergo -trimpath -ldflags "-s -w" -o bin/envd ./cmd/envd

# airlock links runc's libcontainer (cgo) with seccomp support (libseccomp-dev);
# without the tag the linux runtime refuses to compile.
GO_TAGS ?= seccomp

bin/airlock: FORCE
	CGO_ENABLED=1 $(GO) build -tags $(GO_TAGS) -trimpath -o bin/airlock ./cmd/airlock

# What serving needs (make run).
setup:
	scripts/setup.sh

# What the tests need besides: host Python packages, Node.js, protoc, gVisor's runsc.
setup-test: setup
	scripts/setup-test.sh

# One command: install what serving needs, build, build the base template (with
# progress), serve; the other built-ins build in the background while it serves.
run: setup build
	bin/airlock serve --data-dir $(DATA_DIR) --domain "$(DOMAIN)"

# The whole suite; .ci/run calls exactly this.
test: setup-test build
	scripts/test.sh

bench: build
	bin/airlock bench --data-dir $(TEST_DATA)
	bin/airlock bench templates --data-dir $(TEST_DATA)
	bin/airlock bench interp --data-dir $(TEST_DATA)
	bin/airlock bench persist --data-dir $(TEST_DATA)
	bin/airlock bench egress --data-dir $(TEST_DATA)

proto:
	scripts/gen-proto.sh

clean:
	rm -rf bin

FORCE:
