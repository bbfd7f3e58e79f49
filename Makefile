# Thin wrapper around CMake. `make run` and `make test` are the README's two
# commands; both install missing Debian packages first (scripts/deps.sh).
BUILD ?= build
JOBS ?= 2
CMAKE_FLAGS ?=
CTEST_FLAGS ?= --output-on-failure -j2 --no-tests=error

.PHONY: all deps build run test test-asan test-tsan bench format clean

all: build

deps:
	@scripts/deps.sh

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_FLAGS)

build: deps $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j$(JOBS)

run: build
	BUILD=$(BUILD) scripts/run-demo.sh

test: build
	cd $(BUILD) && ctest $(CTEST_FLAGS)

# ASan+UBSan build of everything, unit and integration labels
test-asan: deps
	cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DKVB_SANITIZE=address -DKVB_WERROR=ON
	cmake --build build-asan -j$(JOBS)
	cd build-asan && ctest $(CTEST_FLAGS) -L 'unit|integration' -LE 'stress|rdma|gpu|tsan'

# TSan on the rings: the tsan-labelled stress tests
test-tsan: deps build
	cd $(BUILD) && ctest $(CTEST_FLAGS) -L tsan

bench: build
	@if [ -x scripts/bench.sh ]; then scripts/bench.sh; else echo "no bench yet"; exit 1; fi

format:
	clang-format -i $$(git ls-files '*.c' '*.h')

clean:
	rm -rf $(BUILD) build-asan
