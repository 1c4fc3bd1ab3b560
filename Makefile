# qmm — the two commands of the quick start:
#   make run    builds qmm and runs the main job (`qmm run` on the embedded real-model fixture)
#   make test   builds everything and runs every test: unit + kernels + CLI + the MLX cross-check,
#               the unit tests again under ASan+UBSan, and the fuzzers for a bounded time
# Both install what is missing first (scripts/setup.sh). Other targets: build, install, clean; test-asan and
# test-fuzz (parts of test), test-gpu (on a GPU machine, README "GPU"), setup-build/-test/-bench (the set-up alone).
PREFIX ?= /usr/local
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
FUZZ_SECONDS ?= 30
CMAKE_FLAGS ?=
# cmake --build runs its own make: without this it would inherit our make's level and print "Entering directory"
# around every step (the -j count is passed explicitly)
SUBBUILD = MAKEFLAGS= MAKELEVEL=

.PHONY: all build run test test-asan test-fuzz test-gpu install clean setup-build setup-test setup-bench

all: build

setup-build:
	@scripts/setup.sh build

setup-test:
	@scripts/setup.sh test

# The bench peers `make test` does not need (ggml-python builds ggml from source, ~2 minutes).
setup-bench:
	@scripts/setup.sh bench

build: setup-build
	cmake -S . -B build $(CMAKE_FLAGS) >/dev/null
	$(SUBBUILD) cmake --build build -j $(JOBS)

run: build
	./build/qmm run

test: setup-test build
	ctest --test-dir build --output-on-failure -j $(JOBS)
	$(MAKE) --no-print-directory test-asan test-fuzz

# The sanitizer and fuzzer builds leave the CUDA backend out: their flags are gcc/clang flags, and
# without a GPU its host code cannot run here anyway (make test-gpu covers it under compute-sanitizer).
test-asan:
	cmake -S . -B build-asan -DQMM_SANITIZE=ON -DQMM_WITH_CUDA=OFF -DCMAKE_BUILD_TYPE=Debug >/dev/null
	$(SUBBUILD) cmake --build build-asan -j $(JOBS)
	ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  ctest --test-dir build-asan --output-on-failure -j $(JOBS) -L 'unit|kernels|cli'

test-fuzz:
	CC=clang cmake -S . -B build-fuzz -DQMM_FUZZ=ON -DQMM_WITH_CUDA=OFF -DCMAKE_BUILD_TYPE=Debug -DQMM_FUZZ_SECONDS=$(FUZZ_SECONDS) >/dev/null
	$(SUBBUILD) cmake --build build-fuzz -j $(JOBS)
	ctest --test-dir build-fuzz --output-on-failure -L fuzz

# On a machine with an NVIDIA GPU and nvcc (see README, "GPU"): every CUDA kernel against the oracle, chains,
# the fixture on the GPU, and compute-sanitizer. Needs cmake, a C compiler and cJSON (or .deps/cjson).
test-gpu:
	scripts/gpu_test.sh $(GPU_TEST_PARTS)

# The prefix is given at configure time too, so that the installed qmm.pc and the fixture path are right.
install: setup-build
	cmake -S . -B build -DCMAKE_INSTALL_PREFIX=$(PREFIX) $(CMAKE_FLAGS) >/dev/null
	$(SUBBUILD) cmake --build build -j $(JOBS)
	cmake --install build

clean:
	rm -rf build build-asan build-fuzz build-gpu build-ab build-gpu-pack build-ab-pack
