# Thin wrapper around CMake. `make run` and `make test` are the README's two
# commands; both install missing Debian packages first (scripts/deps.sh),
# each only its layers: run the build's, test the tests' too, bench the
# benchmarks' (docs/service.md). `make deps` installs every layer.
BUILD ?= build
JOBS ?= 2
CMAKE_FLAGS ?=
CTEST_FLAGS ?= --output-on-failure -j2 --no-tests=error

# the dependency layers a target installs (scripts/deps.sh); a target's
# layers hold for what it builds first (`build`) as well
DEPS_LAYERS = build
test test-asan test-tsan: DEPS_LAYERS = build test
bench: DEPS_LAYERS = build bench
fuzz: DEPS_LAYERS = build fuzz
deb: DEPS_LAYERS = build deb
image: DEPS_LAYERS = build deb image

.PHONY: all deps deps-layers build run test test-asan test-tsan fuzz bench deb image format clean

all: build

deps:
	@scripts/deps.sh all

deps-layers:
	@scripts/deps.sh $(DEPS_LAYERS)

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_FLAGS)

build: deps-layers $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j$(JOBS)

run: build
	BUILD=$(BUILD) scripts/run-demo.sh

test: build
	cd $(BUILD) && ctest $(CTEST_FLAGS)

# ASan+UBSan build of everything, unit and integration labels
test-asan: deps-layers
	cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DKVB_SANITIZE=address -DKVB_WERROR=ON
	cmake --build build-asan -j$(JOBS)
	cd build-asan && ctest $(CTEST_FLAGS) -L 'unit|integration' -LE 'stress|rdma|gpu|tsan'

# TSan on the rings: the tsan-labelled stress tests
test-tsan: build
	cd $(BUILD) && ctest $(CTEST_FLAGS) -L tsan

# libFuzzer targets (clang, docs/fuzzing.md): each runs FUZZ_SECONDS on one
# core from its checked-in seeds; new inputs go to build-fuzz/corpus/<t>/,
# crashes to build-fuzz/crashes/<t>-*. FUZZ_TARGETS picks some. A target
# named <x>_gpu starts from <x>'s seeds (the same source, GPU regions).
FUZZ_SECONDS ?= 60
FUZZ_TARGETS ?= zmsg hs tcp_serve tcp_serve_gpu tcp_dial tcp_dial_gpu validate
FUZZ_FLAGS ?= -jobs=1 -workers=1 -rss_limit_mb=2048
fuzz: deps-layers
	CC=clang cmake -S . -B build-fuzz -DKVB_FUZZ=ON -DBUILD_TESTING=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo
	cmake --build build-fuzz -j$(JOBS)
	@set -e; for t in $(FUZZ_TARGETS); do \
	  mkdir -p build-fuzz/corpus/$$t build-fuzz/crashes build-fuzz/log/$$t; \
	  echo "== fuzz_$$t, $(FUZZ_SECONDS) s"; \
	  (cd build-fuzz/log/$$t && ../../tests/fuzz/fuzz_$$t $(FUZZ_FLAGS) \
	    -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 \
	    -artifact_prefix=$(CURDIR)/build-fuzz/crashes/$$t- \
	    $(CURDIR)/build-fuzz/corpus/$$t $(CURDIR)/tests/fuzz/corpus/$${t%_gpu}) \
	    || { tail -40 build-fuzz/log/$$t/fuzz-0.log; exit 1; }; \
	  tail -12 build-fuzz/log/$$t/fuzz-0.log; \
	done

# a build configured before dpdk-dev was installed: look for it again
bench: build
	@if pkg-config --exists libdpdk && \
	  ! grep -q '^LIBDPDK_FOUND:INTERNAL=1' $(BUILD)/CMakeCache.txt; then \
	  cmake -U 'LIBDPDK*' -U __pkg_config_checked_LIBDPDK $(BUILD) && \
	  cmake --build $(BUILD) -j$(JOBS); fi
	@if [ -x scripts/bench.sh ]; then scripts/bench.sh; else echo "no bench yet"; exit 1; fi

# The Debian package (docs/service.md): a build for /usr with the config in
# /etc, man pages gzipped, no RPATH, no DPDK (kvbench ring: kvbroker's ring
# only), no tests; then lintian when installed.
DEB_BUILD ?= build-deb
# Debian's hardening flags (all: fortify, bindnow, PIE, ...) from
# dpkg-buildflags.
deb: export DEB_BUILD_MAINT_OPTIONS = hardening=+all
deb: deps-layers
	cmake -S . -B $(DEB_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DCMAKE_C_FLAGS="$$(dpkg-buildflags --get CPPFLAGS) $$(dpkg-buildflags --get CFLAGS)" \
	  -DCMAKE_EXE_LINKER_FLAGS="$$(dpkg-buildflags --get LDFLAGS)" \
	  -DCMAKE_SHARED_LINKER_FLAGS="$$(dpkg-buildflags --get LDFLAGS)" \
	  -DCMAKE_INSTALL_PREFIX=/usr -DKVB_CONF_DIR=/etc -DKVB_MAN_GZIP=ON \
	  -DKVB_INSTALL_RPATH=OFF -DKVB_DPDK=OFF -DBUILD_TESTING=OFF $(CMAKE_FLAGS)
	cmake --build $(DEB_BUILD) -j$(JOBS)
	cd $(DEB_BUILD) && cpack -G DEB
	@if command -v lintian >/dev/null; then \
	  lintian $(DEB_BUILD)/kvbroker_*.deb || exit 1; fi

# The container image (docs/deploy.md): a Debian root filesystem with the
# package of `make deb` (mmdebstrap), one OCI layer and its configuration
# (umoci), written as an OCI layout, an OCI archive and a docker archive
# (skopeo) into $(IMAGE_OUT), then checked (deploy/image/check-image.sh).
# Needs root (mmdebstrap's root mode, chroot).
IMAGE_OUT ?= build-image
image: deb
	deploy/image/build-image.sh "$$(ls -t $(DEB_BUILD)/kvbroker_*.deb | head -1)" $(IMAGE_OUT)

format:
	clang-format -i $$(git ls-files '*.c' '*.h')

clean:
	rm -rf $(BUILD) build-asan $(DEB_BUILD)
