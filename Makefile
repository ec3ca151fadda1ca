# seqpar: two commands do all of the set-up on a fresh Debian 12 machine.
#   make demo   install what is missing, build (Release), run a representative job (threads)
#   make test   install what is missing, build, run every test (MPI ones under mpirun)
#   make sanitize  the tests under ASan + UBSan, the threads-backend tests under TSan
#   make fuzz      the libFuzzer targets of fuzz/, FUZZ_SECONDS each (default 60; clang++)
BUILD ?= build
JOBS ?= 2
CMAKE_FLAGS ?= -DCMAKE_BUILD_TYPE=Release
# ccache, where the machine has it, keeps rebuilds of other checkouts cheap; nothing needs it.
ifneq ($(shell command -v ccache),)
  CMAKE_FLAGS += -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache
  export CCACHE_BASEDIR := $(CURDIR)
  # debug builds (sanitizers, fuzzing) hit the cache across checkouts too
  export CCACHE_NOHASHDIR := 1
  # the compiler known by its content, not its file's time: a root that installs the same g++
  # (scripts/fresh-machine-test.sh) hits the entries this machine made
  export CCACHE_COMPILERCHECK := content
endif
SEQPAR = $(BUILD)/seqpar

.PHONY: all deps build pyenv demo test bench clean sanitize fuzz

all: build

deps:
	@bash scripts/install-deps.sh

build: deps
	@cmake -S . -B $(BUILD) $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD) -j$(JOBS)

demo: build
	$(SEQPAR) info
	$(SEQPAR) run --strategy ring --layout zigzag --ranks 2 --seq 8192 --heads 8 \
	  --head-dim 128 --causal --verify

# The Python tests' references (PyTorch, transformers, diffusers) come from PyPI into $(BUILD)/pyenv.
pyenv: deps
	@bash scripts/python-env.sh $(BUILD)/pyenv >/dev/null

test: build pyenv
	cd $(BUILD) && ctest --output-on-failure --timeout 900 -j$(JOBS)

bench: build
	$(BUILD)/bench/kernel_bench
	$(BUILD)/bench/decode_bench

sanitize: deps
	JOBS=$(JOBS) bash scripts/sanitize.sh

FUZZ_SECONDS ?= 60
# Every target of fuzz/ (fuzz/fuzz_*.cc), or the subset FUZZ_TARGETS names.
FUZZ_TARGETS ?= $(sort $(basename $(notdir $(wildcard fuzz/fuzz_*.cc))))
fuzz:
	@bash scripts/install-deps.sh fuzz
	JOBS=$(JOBS) FUZZ_TARGETS="$(FUZZ_TARGETS)" bash scripts/fuzz.sh $(FUZZ_SECONDS)

clean:
	rm -rf $(BUILD)
