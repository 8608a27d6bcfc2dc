# Thin wrapper: the real build is CMake. `make demo` and `make test` each work alone on a fresh
# Debian machine (both run scripts/setup first, which is quick when everything is present).
BUILD     ?= build
WITH_CUDA ?= AUTO
JOBS      ?= $(shell nproc)
CMAKE_ARGS ?=
export OMP_WAIT_POLICY ?= PASSIVE

.PHONY: all setup configure build test test-sanitize fuzz demo bench clean format

all: build

setup:
	@scripts/setup

configure:
	@cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release -DWITH_CUDA=$(WITH_CUDA) $(CMAKE_ARGS) >/dev/null

build: configure
	@cmake --build $(BUILD) -j $(JOBS)

test: setup
	@$(MAKE) --no-print-directory build
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# ASan + UBSan build (clang) of the library, the binary and the tests; runs the unit and CLI tests.
test-sanitize: setup
	@scripts/test-sanitize

# Every libFuzzer target for FUZZ_SECONDS each (in the sanitizer build).
FUZZ_SECONDS ?= 60
fuzz: setup
	@scripts/fuzz $(FUZZ_SECONDS)

demo: setup
	@$(MAKE) --no-print-directory build
	@scripts/demo $(BUILD)/tessera

bench: setup
	@$(MAKE) --no-print-directory build
	@scripts/bench $(BUILD)

format:
	@find src apps tests bench -name '*.cpp' -o -name '*.hpp' -o -name '*.cu' | xargs clang-format -i

clean:
	rm -rf $(BUILD)
