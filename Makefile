# ngx_omni -- build, test, run, bench.
#
#   make            build/omni-engine
#   make test       install test dependencies, build, run every test (prove)
#   make run        install what is missing, build, serve the default model
#   make bench      benchmarks against llama.cpp; JSON in build/bench/
#   make fuzz       build the libFuzzer targets (clang)
#   make deps       install the Debian packages the build needs
#   make ARCH=aarch64 all unit    cross-build the engine and its unit tests
#                   into build/aarch64 (make cross-deps installs the tools)
#   make BUILD=build/gpu SPEECH=0 all    the engine without speech out (no
#                   Flite, codecs, pocketsphinx), for machines without those
#                   libraries (bench/gpu.sh bundle)
#
# Everything builds into build/. The sanitizer build of the unit tests lives
# in build/asan/.

CC        ?= gcc
BUILD     := build
OPT       ?= -O2
CFLAGS    := -std=c11 $(OPT) -g -Wall -Wextra -Werror -Wshadow \
             -Wno-unused-parameter -D_GNU_SOURCE -pthread
LDLIBS    := -lpcre2-8 -lyajl -lhiredis -lxxhash -lm -pthread

# Per-ISA kernel files get their instruction set; the dispatcher picks one at
# run time, so the binary runs on any x86-64.
ISA_avx2   := -mavx2 -mfma -mf16c
ISA_avx512 := -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni \
              -mavx2 -mfma -mf16c

# The SIMD kernel sets exist for x86-64 (avx2, avx512) and aarch64 (neon);
# elsewhere only the scalar set is built. ARCH is the architecture built
# for: this machine's unless given (see "Cross builds" below).
HOST_ARCH   := $(shell uname -m)
ARCH        := $(HOST_ARCH)
# A set's files are kernels/cpu/SET.c and kernels/cpu/SET_*.c; each is
# compiled with ISA_SET ($(call isa_of,FILE) names the set).
ISA_x86_64  := $(wildcard kernels/cpu/avx*.c)
ISA_aarch64 := $(wildcard kernels/cpu/neon*.c)
ISA_SRCS    := $(ISA_$(ARCH))
isa_of       = $(firstword $(subst _, ,$(basename $(notdir $(1)))))
ISA_SETS    := $(sort $(foreach f,$(ISA_SRCS),$(call isa_of,$(f))))
ISA_DEFS    := $(foreach s,$(ISA_SETS),-DOMNI_HAVE_$(shell echo $(s) \
                   | tr a-z A-Z))
CFLAGS      += $(ISA_DEFS)

# neon.c holds the dot-product (SDOT) kernels: Armv8.2's, optional before
# Armv8.4, so the dispatcher checks for them (cpu_backend.c).
ISA_neon    := -march=armv8.2-a+dotprod

# Cross builds: `make ARCH=aarch64 [targets]` builds the engine and its unit
# tests for another architecture into build/aarch64 (or BUILD) with Debian's
# cross compiler (or CC), against Debian's builds of PCRE2, yajl, hiredis,
# xxhash and cmocka for it, which t/cross-libs unpacks into the cache; `make cross-deps`
# installs all of it. The C library is the cross compiler's
# (/usr/aarch64-linux-gnu); the libraries' folder is the binaries' run path,
# so `qemu-aarch64 -L /usr/aarch64-linux-gnu BINARY` runs them
# (t/engine/aarch64.t does). Only the engine and the plain unit tests:
# nginx's module is built for the machine nginx runs on, and the sanitizer
# builds stay native.
OMNI_CACHE  ?= $(HOME)/.cache/ngx_omni
ifneq ($(ARCH),$(HOST_ARCH))
CROSS       := $(ARCH)-linux-gnu
CROSS_LIBS  := $(OMNI_CACHE)/cross-libs-$(patsubst aarch64,arm64,$(ARCH))
ifeq ($(origin CC),default)
CC          := $(CROSS)-gcc
endif
ifeq ($(origin BUILD),file)
BUILD       := build/$(ARCH)
endif
CFLAGS      += -isystem $(CROSS_LIBS)/usr/include
LDLIBS      += -L$(CROSS_LIBS)/usr/lib/$(CROSS) \
               -Wl,-rpath,$(CROSS_LIBS)/usr/lib/$(CROSS)
endif

# Speech out (audio/, tts/, talker/, voicebox/) links Flite, soxr and the audio
# encoders' libraries; the aarch64 cross build leaves it out (it tests the
# kernels and the model under qemu, and Debian's arm64 builds of those
# libraries are not in its sysroot), and the engine says so if asked for
# speech (OMNI_HAVE_SPEECH). SPEECH=0 leaves it out of a native build too
# (with its tests, its benches and the nginx module, which a speech-less
# build is not for): the engine for a machine without those libraries, in
# a BUILD of its own (bench/gpu.sh bundle: BUILD=build/gpu).
SPEECH      ?= 1
ifneq ($(CROSS),)
override SPEECH := 0
endif
ifeq ($(SPEECH),1)
SPEECH_AUDIO  := audio tts
SPEECH_STAGES := talker voicebox listener
CFLAGS        += -DOMNI_HAVE_SPEECH -isystem /usr/include/opus \
                 -isystem /usr/include/pocketsphinx \
                 -isystem /usr/include/$(HOST_ARCH)-linux-gnu/sphinxbase
LDLIBS        += -lflite_cmu_us_rms -lflite_cmu_us_slt -lflite_cmu_us_awb \
                 -lflite_cmu_us_kal16 -lflite_usenglish -lflite_cmulex \
                 -lflite -lsoxr -lmp3lame -lopusenc -lopus -lFLAC \
                 -lavcodec -lavutil -lmpg123 -lopusfile -lpocketsphinx \
                 -lsphinxbase
endif

# The engine's folders, in the order of its layers (README, "Layout"). Each
# folder compiles with the include paths of the layers it may use and no
# others, so a layering mistake is a compile error: the frontend cannot
# include the model, a stage cannot include the frontend, nothing but the
# CLI, the thinker and main.c reach the kernels. nginx's module sees only
# engine/proto (config).
ENGINE_DIRS := base request $(SPEECH_AUDIO) llm stage frontend thinker \
               $(SPEECH_STAGES) cli
INC_proto    := proto
INC_base     := proto base
INC_request  := proto base request
INC_audio    := proto base request audio
INC_tts      := proto base request tts
INC_llm      := proto base request llm
INC_stage    := proto base stage
INC_frontend := proto base request stage frontend
INC_thinker  := proto base request llm stage thinker
INC_talker   := proto base request tts stage talker
INC_voicebox := proto base request audio tts stage voicebox
INC_listener := proto base request audio tts stage listener
INC_cli      := proto base request llm stage cli
INC_main     := proto $(ENGINE_DIRS)
KERNEL_INCS  := -Ikernels -Ikernels/cpu -Ikernels/cuda
ALL_INCS     := $(INC_main:%=-Iengine/%) $(KERNEL_INCS)

# $(call incs,SOURCE): the -I flags SOURCE compiles with.
incs = $(strip $(if $(filter kernels/%,$(1)),$(KERNEL_INCS), \
    $(if $(filter engine/main.c,$(1)),$(ALL_INCS), \
    $(patsubst %,-Iengine/%,$(INC_$(word 2,$(subst /, ,$(1))))) \
    $(if $(filter llm thinker cli,$(word 2,$(subst /, ,$(1)))),-Ikernels))))

ENGINE_SRCS := $(wildcard $(ENGINE_DIRS:%=engine/%/*.c))
KERNEL_SRCS := $(wildcard kernels/*.c) $(wildcard kernels/cuda/*.c) \
               $(filter-out $(ISA_x86_64) $(ISA_aarch64), \
                   $(wildcard kernels/cpu/*.c)) \
               $(ISA_SRCS)
LIB_SRCS    := $(ENGINE_SRCS) $(KERNEL_SRCS)
UNIT_SRCS   := $(wildcard t/unit/test_*.c)

LIB_OBJS    := $(LIB_SRCS:%.c=$(BUILD)/obj/%.o)
ASAN_OBJS   := $(LIB_SRCS:%.c=$(BUILD)/asan/obj/%.o)
UNIT_BINS   := $(UNIT_SRCS:t/unit/%.c=$(BUILD)/t/%)
ASAN_BINS   := $(UNIT_SRCS:t/unit/%.c=$(BUILD)/asan/t/%)

ASAN_FLAGS  := -fsanitize=address,undefined -fno-sanitize-recover=all \
               -fno-omit-frame-pointer

.PHONY: all test unit run bench fuzz deps test-deps cross-deps clean FORCE
.DELETE_ON_ERROR:

# The nginx module is built with the engine when nginx-dev is installed.
NGX_SRC   := /usr/share/nginx/src
NGX_BUILD := $(BUILD)/nginx

# The CUDA backend: a plugin beside the engine (kernels/backend.c loads it
# at run time, so omni-engine itself links nothing of CUDA and runs on any
# machine), built whenever nvcc is found: sm_80 (A100) and sm_90
# (H100/H200) code, plus sm_90 PTX for newer devices to compile at load.
# cudart is linked statically; cuBLASLt is found through the rpath. plan.c
# is in libomni.a too, but the plugin gets its own position-independent
# copy.
NVCC        ?= $(firstword $(shell command -v nvcc 2>/dev/null) \
                           $(wildcard /usr/local/cuda/bin/nvcc))
CUDA_HOME   ?= $(patsubst %/bin/nvcc,%,$(NVCC))
CUDA_ARCHS  ?= 80 90
CUDA_GENCODE = $(foreach a,$(CUDA_ARCHS),-gencode arch=compute_$(a),code=sm_$(a)) \
               -gencode arch=compute_$(lastword $(CUDA_ARCHS)),code=compute_$(lastword $(CUDA_ARCHS))
CUDA_SRCS   := $(wildcard kernels/cuda/*.cu)
CUDA_OBJS   := $(CUDA_SRCS:%.cu=$(BUILD)/cuda/%.o) \
               $(BUILD)/cuda/kernels/cuda/plan.o $(BUILD)/cuda/kernels/dtype.o
# nvcc compiles host code with g++: without it there is no plugin either
CUDA_PLUGIN := $(if $(CROSS),,$(if $(NVCC),$(if $(shell command -v g++ \
                   2>/dev/null),$(BUILD)/omni-cuda.so)))

all: $(BUILD)/omni-engine $(CUDA_PLUGIN) \
     $(if $(filter 0,$(SPEECH)),,$(if $(wildcard $(NGX_SRC)/configure), \
         $(BUILD)/ngx_omni_module.so))

$(BUILD)/cuda/%.o: %.cu $(wildcard kernels/*.h kernels/cuda/*.h)
	@mkdir -p $(@D)
	$(NVCC) -std=c++17 -O3 -Xcompiler -fPIC,-fvisibility=hidden,-Wall,-Wextra \
	    $(CUDA_GENCODE) \
	    $(KERNEL_INCS) -c $< -o $@

$(BUILD)/cuda/%.o: %.c $(wildcard kernels/*.h kernels/cuda/*.h)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -fPIC -fvisibility=hidden $(KERNEL_INCS) -c $< -o $@

$(BUILD)/omni-cuda.so: $(CUDA_OBJS)
	$(NVCC) -shared $(CUDA_GENCODE) -o $@ $^ -lcublasLt \
	    -Xlinker -rpath,$(CUDA_HOME)/lib64

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(call incs,$<) $(ISA_$(call isa_of,$<)) \
	    -MMD -MP -c $< -o $@

$(BUILD)/asan/obj/%.o: %.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(call incs,$<) $(ASAN_FLAGS) \
	    $(ISA_$(call isa_of,$<)) -MMD -MP -c $< -o $@

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

# ngx_omni_module: configured once into build/nginx the way Debian builds
# its module packages (Debian's configure flags, --with-compat, so the .so
# loads into Debian's nginx), again only when `config` changes; nginx's own
# flags make warnings errors (-Werror). nginx names the .so after the first
# module in it; it is installed as build/ngx_omni_module.so.
NGX_MODULE_SRCS := $(wildcard ngx_omni_module/*.c ngx_omni_module/*.h) \
                   engine/proto/omni_proto.h engine/proto/prefix_key.h

$(NGX_BUILD)/Makefile: config
	@mkdir -p $(@D)
	@echo "configuring nginx for the module (log: $(NGX_BUILD)/configure.log)"
	cd $(NGX_SRC) && bash -c '. ./conf_flags && ./configure \
	    --with-cc-opt="$$(dpkg-buildflags --get CFLAGS) -fPIC \
	        $$(dpkg-buildflags --get CPPFLAGS)" \
	    --with-ld-opt="$$(dpkg-buildflags --get LDFLAGS) -fPIC" \
	    "$${NGX_CONF_FLAGS[@]}" \
	    --add-dynamic-module=$(CURDIR) \
	    --builddir=$(CURDIR)/$(NGX_BUILD)' \
	    > $(CURDIR)/$(NGX_BUILD)/configure.log 2>&1 \
	    || { tail -20 $(CURDIR)/$(NGX_BUILD)/configure.log; exit 1; }

$(BUILD)/ngx_omni_module.so: $(NGX_BUILD)/Makefile $(NGX_MODULE_SRCS)
	$(MAKE) -f $(CURDIR)/$(NGX_BUILD)/Makefile -C $(NGX_SRC) modules
	cp $(NGX_BUILD)/ngx_http_omni_module.so $@.tmp && mv -f $@.tmp $@

$(BUILD)/t/%: t/unit/%.c $(BUILD)/libomni.a
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(ALL_INCS) -It/unit -MMD -MP -o $@ $< $(BUILD)/libomni.a \
	    -lcmocka $(LDLIBS)

$(BUILD)/asan/t/%: t/unit/%.c $(BUILD)/asan/libomni.a
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(ALL_INCS) $(ASAN_FLAGS) -It/unit -MMD -MP -o $@ $< \
	    $(BUILD)/asan/libomni.a -lcmocka $(LDLIBS)

# The thread pool's lock-free protocol, the helper thread's queue, the
# shared-memory pool's threads and the prefix publisher's queue also run
# under ThreadSanitizer.
TSAN_BINS := $(BUILD)/tsan/t/test_threadpool $(BUILD)/tsan/t/test_workq \
             $(BUILD)/tsan/t/test_pool

$(BUILD)/tsan/t/test_workq: engine/base/workq.c
$(BUILD)/tsan/t/test_pool:  engine/base/pool.c
$(BUILD)/tsan/t/test_workq $(BUILD)/tsan/t/test_pool: $(BUILD)/tsan/t/%: \
        t/unit/%.c engine/base/log.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(ALL_INCS) -O1 -fsanitize=thread -o $@ $^ -lcmocka \
	    -pthread

# The prefix publisher's queue between the thinker's loop and its thread.
TSAN_BINS += $(BUILD)/tsan/t/test_prefix_pub
$(BUILD)/tsan/t/test_prefix_pub: t/unit/test_prefix_pub.c \
                                 engine/thinker/prefix_pub.c engine/base/log.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(ALL_INCS) -O1 -fsanitize=thread -o $@ $^ -lcmocka \
	    -lhiredis -lxxhash -pthread

$(BUILD)/tsan/t/test_threadpool: t/unit/test_threadpool.c \
                                 kernels/cpu/threadpool.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(ALL_INCS) -O1 -fsanitize=thread -o $@ $^ -lcmocka \
	    -pthread

# The audio encoders' test and build/tools/audio_probe (which the t/*.t
# suites run on what nginx returns) decode with libraries that share no code
# with the encoders: t/tools/audio_decode.c. test_audio links it through its
# own LDLIBS; neither exists without speech (SPEECH=0, cross builds).
DECODE_LIBS := -lsndfile -lmpg123 -lopusfile -lfaad -lm
ifeq ($(SPEECH),1)
$(BUILD)/tools/audio_probe: t/tools/audio_probe.c t/tools/audio_decode.c \
                            t/tools/audio_decode.h
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -o $@ t/tools/audio_probe.c t/tools/audio_decode.c \
	    $(DECODE_LIBS)

DECODE_TESTS := $(foreach t,test_audio test_audio_in test_voicebox, \
                    $(BUILD)/t/$(t) $(BUILD)/asan/t/$(t))
$(DECODE_TESTS): t/tools/audio_decode.c t/tools/audio_decode.h
$(DECODE_TESTS): LDLIBS += t/tools/audio_decode.c $(DECODE_LIBS)

unit: $(BUILD)/tools/audio_probe

# The voicebox's workers and its loop share requests and queues: its test
# also runs under ThreadSanitizer, with the speech libraries it drives.
VOICEBOX_TSAN_SRCS := engine/voicebox/vbcore.c engine/voicebox/vbpipe.c \
                      $(wildcard engine/tts/*.c engine/audio/*.c) \
                      engine/base/pool.c engine/base/log.c \
                      engine/request/speech.c t/tools/audio_decode.c
TSAN_BINS += $(BUILD)/tsan/t/test_voicebox
$(BUILD)/tsan/t/test_voicebox: t/unit/test_voicebox.c $(VOICEBOX_TSAN_SRCS)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(ALL_INCS) -O1 -fsanitize=thread -o $@ $^ -lcmocka \
	    $(LDLIBS) $(DECODE_LIBS)

# The listener's workers and its loop share requests and the outbox: its
# test also runs under ThreadSanitizer, with the decoders and pocketsphinx.
LISTENER_TSAN_SRCS := $(wildcard engine/listener/ls*.c) \
                      engine/listener/asr_ps.c \
                      $(wildcard engine/tts/*.c engine/audio/*.c \
                                 engine/request/*.c) \
                      engine/base/pool.c engine/base/log.c
TSAN_BINS += $(BUILD)/tsan/t/test_listener
$(BUILD)/tsan/t/test_listener: t/unit/test_listener.c $(LISTENER_TSAN_SRCS)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(ALL_INCS) -O1 -fsanitize=thread -o $@ $^ -lcmocka \
	    $(LDLIBS)

$(BUILD)/bench/bench_audio $(BUILD)/bench/bench_audio_in \
$(BUILD)/bench/bench_voicebox: \
        $(BUILD)/bench/%: bench/%.c $(BUILD)/libomni.a
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(ALL_INCS) -MMD -MP -o $@ $< $(BUILD)/libomni.a \
	    $(LDLIBS)
else
SPEECH_TESTS := test_audio test_audio_in test_tts test_tts_synth test_talker \
                test_listener test_voicebox test_voicebox_stage
UNIT_BINS := $(filter-out $(SPEECH_TESTS:%=$(BUILD)/t/%),$(UNIT_BINS))
ASAN_BINS := $(filter-out $(SPEECH_TESTS:%=$(BUILD)/asan/t/%),$(ASAN_BINS))
endif

unit: $(UNIT_BINS) $(if $(CROSS),,$(ASAN_BINS) $(TSAN_BINS))

# Stand-ins for the CUDA plugin that test_cuda_plan loads through
# backend_new (t/unit/fake_cuda_plugin.c).
unit: $(BUILD)/t/fake-cuda.so $(BUILD)/t/fake-noentry.so
$(BUILD)/t/fake-cuda.so: t/unit/fake_cuda_plugin.c kernels/kernels.h
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -fPIC -shared $(KERNEL_INCS) -o $@ $<
$(BUILD)/t/fake-noentry.so: t/unit/fake_cuda_plugin.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -fPIC -shared -DFAKE_NO_ENTRY $(KERNEL_INCS) -o $@ $<

$(BUILD)/bench/bench_kernels: bench/bench_kernels.c $(BUILD)/libomni.a
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(KERNEL_INCS) -MMD -MP -o $@ $< $(BUILD)/libomni.a \
	    $(LDLIBS)

LOADGEN_SRCS := $(wildcard bench/loadgen*.c)

$(BUILD)/bench/loadgen: $(LOADGEN_SRCS) bench/loadgen.h
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -Iengine/proto -MMD -MP -o $@ $(LOADGEN_SRCS) -lyajl -lm

# pocketsphinx for the word error rate of the voices (bench/asr.c).
$(BUILD)/bench/asr: bench/asr.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $$(pkg-config --cflags pocketsphinx) \
	    -o $@ $< $$(pkg-config --libs pocketsphinx) -lsoxr -lm

# Flite's own synthesis, the baseline of that word error rate.
$(BUILD)/bench/flite_say: bench/flite_say.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -o $@ $< -lflite_cmu_us_rms -lflite_cmu_us_slt \
	    -lflite_cmu_us_awb -lflite_cmu_us_kal16 -lflite_usenglish \
	    -lflite_cmulex -lflite -lm

# Debian packages: build, then tests. `make deps` installs only what is
# missing, so it is quick on a machine that has them.
BUILD_PKGS := gcc make libpcre2-dev libyajl-dev libhiredis-dev libxxhash-dev \
              nginx nginx-dev \
              flite1-dev libsoxr-dev libmp3lame-dev libopusenc-dev \
              libopus-dev libflac-dev libavcodec-dev libmpg123-dev \
              libopusfile-dev libpocketsphinx-dev libsphinxbase-dev \
              pocketsphinx-en-us
# Independent decoders for the audio the engine writes (t/tools/).
TEST_PKGS  := libsndfile1-dev libmpg123-dev libopusfile-dev libfaad-dev \
              libcmocka-dev clang libclang-rt-14-dev perl git ca-certificates curl \
              nginx nginx-dev nodejs $(if $(shell command -v npm),,npm) \
              pocketsphinx-testdata lame flac opus-tools redis-server \
              cmake g++
BENCH_PKGS := cmake g++ git ca-certificates $(if $(shell command -v npm),,npm) \
              pocketsphinx pocketsphinx-en-us libpocketsphinx-dev nodejs \
              redis-server

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

# The aarch64 cross compiler, qemu-user and the arm64 libraries (see
# "Cross builds" above): t/engine/aarch64.t runs the engine's unit tests and
# reference.t for aarch64 under qemu when they are present, which `make
# test` sees to on x86-64: about 20 s to install 24 packages (56 MB to
# fetch, 261 MB installed), 3 s for the libraries (1 MB).
CROSS_PKGS := gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user

cross-deps:
	$(call apt_ensure,$(CROSS_PKGS))
	@t/cross-libs arm64 >/dev/null

# Test::Nginx comes from Debian sid (t/install-test-nginx); the official
# openai npm package (t/e2e/), pinned, into a cache outside the repo.
OPENAI_NPM := 5.23.2

test-deps: $(if $(filter x86_64,$(HOST_ARCH)),cross-deps)
	$(call apt_ensure,$(BUILD_PKGS) $(TEST_PKGS))
	@perl -MTest::Nginx::Socket -e1 2>/dev/null || t/install-test-nginx
	@v=$$(node -p 'require("$(OMNI_CACHE)/npm/node_modules/openai/package.json").version' 2>/dev/null); \
	[ "$$v" = "$(OPENAI_NPM)" ] || { mkdir -p $(OMNI_CACHE)/npm && \
	    npm install --prefix $(OMNI_CACHE)/npm --no-audit --no-fund \
	        --loglevel=error openai@$(OPENAI_NPM); }

# t/*.t and t/e2e/*.t: Test::Nginx suites and real clients against nginx
# with the module (t/lib/ sets their environment: Debian's nginx, a free
# port, a server root under build/t/).
test: test-deps
	$(MAKE) all unit $(BUILD)/ngx_omni_module.so $(BUILD)/bench/loadgen
	t/fetch-llama-src
	t/build-llama-tools
	prove $(UNIT_BINS) $(ASAN_BINS) $(TSAN_BINS) t/engine/*.t t/*.t t/e2e/*.t

# `make run`: nginx with the module in the foreground on 127.0.0.1:$OMNI_PORT,
# its master running the engine (omni_engine) on $OMNI_MODEL, from the
# private prefix build/run/. conf/nginx.conf is a template (nginx.conf has no
# environment variables): its @NAME@ placeholders are filled in with sed.
# Ctrl-C stops nginx, whose master stops the engine on its way out.
# As root, nginx's workers and the engine run as the system user $OMNI_USER
# (created when missing): the engine's socket, lock and log are theirs and
# no one else's. Not as root, everything runs as the invoking user. Log
# files are created under umask 027 (not world-readable).
RUN_PKGS         := $(BUILD_PKGS) nginx nginx-dev
RUN_DIR          := $(abspath $(BUILD)/run)
OMNI_PORT        := $(or $(OMNI_PORT),8080)
OMNI_MODEL       := $(or $(OMNI_MODEL),../shared/models/stories260K.gguf)
OMNI_ENGINE_ARGS ?=
OMNI_USER        ?= omni
RUN_AS_ROOT      := $(filter 0,$(shell id -u))

run:
	$(call apt_ensure,$(RUN_PKGS))
	$(MAKE) all $(BUILD)/ngx_omni_module.so
	@test -f "$(OMNI_MODEL)" || { echo "make run: no model at" \
	    "$(OMNI_MODEL) (set OMNI_MODEL)" >&2; exit 1; }
	@mkdir -p $(RUN_DIR)/conf $(RUN_DIR)/logs $(RUN_DIR)/temp
	$(if $(RUN_AS_ROOT),@id -u $(OMNI_USER) >/dev/null 2>&1 || \
	    useradd --system --no-create-home --home-dir /nonexistent \
	        --shell /usr/sbin/nologin $(OMNI_USER))
	sed -e 's|@ROOT@|$(CURDIR)|g' -e 's|@PREFIX@|$(RUN_DIR)|g' \
	    -e 's|@OMNI_PORT@|$(OMNI_PORT)|g' \
	    -e 's|@OMNI_MODEL@|$(abspath $(OMNI_MODEL))|g' \
	    -e 's|@OMNI_ENGINE_ARGS@|$(OMNI_ENGINE_ARGS)|g' \
	    conf/nginx.conf > $(RUN_DIR)/conf/nginx.conf
	@echo "make run: http://127.0.0.1:$(OMNI_PORT)/v1/ (engine log:" \
	    "$(RUN_DIR)/omni/engine.log); Ctrl-C stops nginx and the engine"
	umask 027 && exec /usr/sbin/nginx -p $(RUN_DIR)/ -c conf/nginx.conf \
	    -g 'daemon off;$(if $(RUN_AS_ROOT), user $(OMNI_USER);)'

# Each fuzz target links only the sources it exercises (no kernels, no
# threads), so it builds with clang alone and stays fast per input.
FUZZ_TARGETS    := gguf proto audio
FUZZ_SRCS_gguf  := engine/llm/gguf.c engine/llm/tokenizer.c \
                   engine/llm/tokenizer_encode.c engine/llm/tokenizer_pre.c \
                   engine/llm/detok.c engine/base/log.c \
                   kernels/dtype.c
FUZZ_SRCS_proto := engine/base/frame.c $(wildcard engine/request/*.c) \
                   engine/llm/sampler.c engine/llm/stop.c engine/base/log.c
# The audio-input decoders: our code is instrumented, the codec libraries
# (Debian's builds, fuzzed upstream by OSS-Fuzz) are called as they are.
FUZZ_SRCS_audio := engine/audio/decode.c $(wildcard engine/audio/dec_*.c) \
                   engine/audio/resample.c engine/base/log.c
FUZZ_LIBS_audio := -isystem /usr/include/opus -pthread -lmpg123 -lopusfile \
                   -lFLAC -lsoxr

fuzz: $(FUZZ_TARGETS:%=$(BUILD)/fuzz/fuzz_%)

$(BUILD)/fuzz/fuzz_gguf: $(FUZZ_SRCS_gguf)
$(BUILD)/fuzz/fuzz_proto: $(FUZZ_SRCS_proto)
$(BUILD)/fuzz/fuzz_audio: $(FUZZ_SRCS_audio)

$(BUILD)/fuzz/fuzz_%: t/fuzz/fuzz_%.c $(wildcard engine/*/*.h kernels/*.h)
	@mkdir -p $(@D)
	clang -std=c11 -O1 -g -D_GNU_SOURCE $(ALL_INCS) \
	    -fsanitize=fuzzer,address,undefined -o $@ $< $(FUZZ_SRCS_$*) \
	    $(FUZZ_LIBS_$*) -lpcre2-8 -lyajl -lm

# The CPU benchmarks run on the CPU whatever the machine has (their peer is
# llama.cpp on the CPU); bench/gpu.sh is the GPU's.
bench: all $(BUILD)/bench/bench_kernels $(BUILD)/bench/loadgen \
       $(BUILD)/ngx_omni_module.so
	$(call apt_ensure,$(BENCH_PKGS) nginx)
	$(MAKE) $(BUILD)/bench/asr $(BUILD)/bench/flite_say
	OMNI_BACKEND=cpu bench/run
	OMNI_BACKEND=cpu bench/nginx
	OMNI_BACKEND=cpu bench/speech
	OMNI_BACKEND=cpu bench/listen
	OMNI_BACKEND=cpu bench/route

clean:
	rm -rf $(BUILD)

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
