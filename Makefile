# ngx_omni -- build, test, run, bench.
#
#   make            build/omni-engine
#   make test       install test dependencies, build, run every test (prove)
#   make run        install what is missing, build, serve the default model
#   make bench      benchmarks against llama.cpp; JSON in build/bench/
#   make fuzz       build the libFuzzer targets (clang)
#   make deps       install the Debian packages the build needs
#
# Everything builds into build/. The sanitizer build of the unit tests lives
# in build/asan/.

CC        ?= gcc
BUILD     := build
OPT       ?= -O2
CFLAGS    := -std=c11 $(OPT) -g -Wall -Wextra -Werror -Wshadow \
             -Wno-unused-parameter -D_GNU_SOURCE -pthread \
             -Iengine -Ikernels -Ikernels/cpu
LDLIBS    := -lpcre2-8 -lyajl -lm -pthread

# Per-ISA kernel files get their instruction set; the dispatcher picks one at
# run time, so the binary runs on any x86-64.
ISA_avx2   := -mavx2 -mfma -mf16c
ISA_avx512 := -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni \
              -mavx2 -mfma -mf16c

# The SIMD kernel sets exist for x86-64 only; elsewhere the scalar set runs.
ARCH        := $(shell uname -m)
ISA_SRCS    := $(if $(filter x86_64,$(ARCH)),$(wildcard kernels/cpu/avx*.c))
ISA_DEFS    := $(foreach f,$(ISA_SRCS),-DOMNI_HAVE_$(shell echo $(basename \
                   $(notdir $(f))) | tr a-z A-Z))
CFLAGS      += $(ISA_DEFS)

ENGINE_SRCS := $(filter-out engine/main.c,$(wildcard engine/*.c))
KERNEL_SRCS := $(wildcard kernels/*.c) \
               $(filter-out kernels/cpu/avx%.c,$(wildcard kernels/cpu/*.c)) \
               $(ISA_SRCS)
LIB_SRCS    := $(ENGINE_SRCS) $(KERNEL_SRCS)
UNIT_SRCS   := $(wildcard t/unit/test_*.c)

LIB_OBJS    := $(LIB_SRCS:%.c=$(BUILD)/obj/%.o)
ASAN_OBJS   := $(LIB_SRCS:%.c=$(BUILD)/asan/obj/%.o)
UNIT_BINS   := $(UNIT_SRCS:t/unit/%.c=$(BUILD)/t/%)
ASAN_BINS   := $(UNIT_SRCS:t/unit/%.c=$(BUILD)/asan/t/%)

ASAN_FLAGS  := -fsanitize=address,undefined -fno-sanitize-recover=all \
               -fno-omit-frame-pointer

.PHONY: all test unit run bench fuzz deps test-deps clean FORCE
.DELETE_ON_ERROR:

all: $(BUILD)/omni-engine

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(ISA_$(basename $(notdir $<))) -MMD -MP -c $< -o $@

$(BUILD)/asan/obj/%.o: %.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(ASAN_FLAGS) $(ISA_$(basename $(notdir $<))) -MMD -MP \
	    -c $< -o $@

# Objects depend on which kernel sets exist (OMNI_HAVE_*): a stamp that
# changes only when that set changes rebuilds them.
$(BUILD)/.isa: FORCE
	@mkdir -p $(@D)
	@echo '$(ISA_DEFS)' | cmp -s - $@ || echo '$(ISA_DEFS)' > $@

$(LIB_OBJS) $(ASAN_OBJS) $(BUILD)/obj/engine/main.o: $(BUILD)/.isa

$(BUILD)/libomni.a: $(LIB_OBJS)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/asan/libomni.a: $(ASAN_OBJS)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/omni-engine: $(BUILD)/obj/engine/main.o $(BUILD)/libomni.a
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/t/%: t/unit/%.c $(BUILD)/libomni.a
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -It/unit -MMD -MP -o $@ $< $(BUILD)/libomni.a \
	    -lcmocka $(LDLIBS)

$(BUILD)/asan/t/%: t/unit/%.c $(BUILD)/asan/libomni.a
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(ASAN_FLAGS) -It/unit -MMD -MP -o $@ $< \
	    $(BUILD)/asan/libomni.a -lcmocka $(LDLIBS)

# The thread pool's lock-free protocol also runs under ThreadSanitizer.
TSAN_BINS := $(BUILD)/tsan/t/test_threadpool

$(BUILD)/tsan/t/test_threadpool: t/unit/test_threadpool.c \
                                 kernels/cpu/threadpool.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -O1 -fsanitize=thread -o $@ $^ -lcmocka -pthread

unit: $(UNIT_BINS) $(ASAN_BINS) $(TSAN_BINS)

$(BUILD)/bench/bench_kernels: bench/bench_kernels.c $(BUILD)/libomni.a
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -MMD -MP -o $@ $< $(BUILD)/libomni.a $(LDLIBS)

$(BUILD)/bench/loadgen: bench/loadgen.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -MMD -MP -o $@ $< -lyajl -lm

# Debian packages: build, then tests. `make deps` installs only what is
# missing, so it is quick on a machine that has them.
BUILD_PKGS := gcc make libpcre2-dev libyajl-dev
TEST_PKGS  := libcmocka-dev clang libclang-rt-14-dev perl git ca-certificates \
              $(if $(shell command -v npm),,npm)
BENCH_PKGS := cmake g++ git ca-certificates $(if $(shell command -v npm),,npm)

SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

# $(call apt_ensure,PKGS): apt-get update + install only when one is missing
define apt_ensure
@missing=$$(for p in $(1); do \
    dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'ok installed' \
    || echo $$p; done); \
if [ -n "$$missing" ]; then \
    echo "installing:" $$missing; \
    $(SUDO) apt-get update -qq && \
    DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq \
        --no-install-recommends $$missing; \
fi
endef

deps:
	$(call apt_ensure,$(BUILD_PKGS))

test-deps:
	$(call apt_ensure,$(BUILD_PKGS) $(TEST_PKGS))

test: test-deps
	$(MAKE) all unit
	t/fetch-llama-src
	prove $(UNIT_BINS) $(ASAN_BINS) $(TSAN_BINS) t/engine/*.t

# Until the nginx module lands (serving on 127.0.0.1:8080), `make run` says so
# and runs the engine once on the default model instead.
OMNI_MODEL ?= ../shared/models/stories260K.gguf

run: deps all
	@echo "make run: HTTP serving (ngx_omni_module + omni-engine sidecar) is" \
	    "not built yet; generating once with $(OMNI_MODEL) instead." >&2
	$(BUILD)/omni-engine generate --model $(OMNI_MODEL) \
	    --prompt "$${OMNI_PROMPT:-Once upon a time}" --max-tokens 128 --stats

# Each fuzz target links only the sources it exercises (no kernels, no
# threads), so it builds with clang alone and stays fast per input.
FUZZ_TARGETS    := gguf proto
FUZZ_SRCS_gguf  := engine/gguf.c engine/tokenizer.c engine/tokenizer_encode.c \
                   engine/tokenizer_pre.c engine/detok.c engine/log.c \
                   kernels/dtype.c
FUZZ_SRCS_proto := engine/frame.c engine/request.c engine/sampler.c \
                   engine/stop.c engine/log.c

fuzz: $(FUZZ_TARGETS:%=$(BUILD)/fuzz/fuzz_%)

$(BUILD)/fuzz/fuzz_gguf: $(FUZZ_SRCS_gguf)
$(BUILD)/fuzz/fuzz_proto: $(FUZZ_SRCS_proto)

$(BUILD)/fuzz/fuzz_%: t/fuzz/fuzz_%.c $(wildcard engine/*.h kernels/*.h)
	@mkdir -p $(@D)
	clang -std=c11 -O1 -g -D_GNU_SOURCE -Iengine -Ikernels -Ikernels/cpu \
	    -fsanitize=fuzzer,address,undefined -o $@ $< $(FUZZ_SRCS_$*) \
	    -lpcre2-8 -lyajl -lm

bench: all $(BUILD)/bench/bench_kernels $(BUILD)/bench/loadgen
	$(call apt_ensure,$(BENCH_PKGS))
	bench/run

clean:
	rm -rf $(BUILD)

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
