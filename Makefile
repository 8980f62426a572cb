# aned — one hand-written Makefile.
#   make            build bin/aned, bin/aneclient, bin/aned-http, bin/ane-template, bin/anebench, libaneclient
#   make run        build, start aned on the bundled model, print a story
#   make test       unit + integration tests; ends with "N passed, M failed"
#   make bench      benchmarks on real-size synthetic models
#   make cuda       build with the CUDA backend (CUDA_ARCH="80 86 89 90a 120", docs/cuda.md);
#                   test-cuda runs its tests;
#                   ktrace builds bin/ktrace.so, a kernel-timeline tracer
#   make fuzz       every libFuzzer target FUZZ_SECONDS (default 30) s each
#   make install    programs, libaneclient (+ headers, pkg-config), units, docs
#                   under PREFIX (/usr/local), staged into DESTDIR
#   make aarch64    t_qgemm, t_dequant cross-built for aarch64 into bin/aarch64
#                   (the NEON kernels); make test runs them under qemu-user
#   make help       this text
# Knobs: CC, OPT, CFLAGS, SANITIZER=address|undefined|address,undefined|thread, WERROR=1.

CC       ?= cc
OPT      ?= -O2
SANITIZER ?=
WERROR   ?=
PYTHON   ?= /usr/bin/python3

WARN := -Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes \
        -Wpointer-arith -Wformat=2 -Wno-unused-parameter
ifeq ($(WERROR),1)
WARN += -Werror
endif

SANFLAGS :=
ifneq ($(SANITIZER),)
SANFLAGS := -fsanitize=$(SANITIZER) -fno-omit-frame-pointer
ifneq ($(findstring undefined,$(SANITIZER)),)
SANFLAGS += -fno-sanitize-recover=undefined
endif
endif

# Dependencies come from Debian packages (see README "Dependencies").
DEB_PKGS := pkg-config libmsgpack-dev libev-dev libjansson-dev libpcre2-dev \
            libutf8proc-dev python3-msgpack xz-utils curl libmicrohttpd-dev \
            json-schema-test-suite python3-jsonschema
PC_PKGS  := msgpack jansson libpcre2-8 libutf8proc
# Recursive (=) so they are read after `deps` has run.
PC_CFLAGS = $(shell pkg-config --cflags $(PC_PKGS) 2>/dev/null)
PC_LIBS   = $(shell pkg-config --libs $(PC_PKGS) 2>/dev/null)
# Line editing for aneclient --chat: BSD libedit when present (optional: without
# it, plain lines are read); deps installs it when root.
OPT_DEB_PKGS := libedit-dev
EDIT_CFLAGS = $(shell pkg-config --exists libedit 2>/dev/null && echo -DANE_LIBEDIT $$(pkg-config --cflags libedit))
EDIT_LIBS   = $(shell pkg-config --libs libedit 2>/dev/null)
# The HTTP gateway's library is linked into bin/aned-http alone, never aned.
HTTP_PC_PKGS := libmicrohttpd
HTTP_LIBS = $(shell pkg-config --libs $(HTTP_PC_PKGS) 2>/dev/null)

CPPFLAGS += -I. -D_GNU_SOURCE
CFLAGS   ?=
ALL_CFLAGS = -std=c11 $(OPT) -g -pthread -fPIC $(WARN) $(SANFLAGS) $(CPPFLAGS) $(PC_CFLAGS) $(CFLAGS)
LDLIBS    = $(PC_LIBS) -lev -lm -lpthread $(CUDA_LIBS)
LDFLAGS  += $(SANFLAGS) -pthread

O := bin/obj

# CUDA=1 (set by `make cuda`): the same programs with the CUDA backend, objects
# under bin/obj-cuda. Plain builds never need nvcc.
CUDA      ?=
CUDA_HOME ?= /usr/local/cuda
NVCC      ?= $(CUDA_HOME)/bin/nvcc
CUDA_OBJ  :=
ifeq ($(CUDA),1)
O := bin/obj-cuda
CPPFLAGS += -DANE_CUDA -isystem $(CUDA_HOME)/include
CUDA_OBJ := $(patsubst %.cu,$(O)/%.o,$(wildcard shaders/*.cu))
CUDA_LIBS := -L$(CUDA_HOME)/lib64 -lcublas -lcublasLt -lcudart_static -ldl -lrt -lstdc++
NVCCFLAGS ?= -O3 -std=c++17 -lineinfo
# NCCL for tensor parallelism over several GPUs (aned --gpus): its header
# from the toolkit, the system or a pip-installed nvidia-nccl-*; the library
# is loaded at run time, so a machine without it still runs on one GPU.
NCCL_PIP  := $(shell python3 -c 'import nvidia.nccl as n, os; print(os.path.dirname(n.__file__) if n.__file__ else list(n.__path__)[0])' 2>/dev/null)
NCCL_HOME ?= $(firstword $(foreach d,$(CUDA_HOME) /usr $(NCCL_PIP),$(if $(wildcard $(d)/include/nccl.h),$(d))))
ifneq ($(NCCL_HOME),)
NCCL_LIB  := $(firstword $(wildcard $(NCCL_HOME)/lib64/libnccl.so.2 $(NCCL_HOME)/lib/libnccl.so.2 \
                                    /usr/lib/$(shell $(CC) -dumpmachine)/libnccl.so.2))
CPPFLAGS  += -DANE_NCCL -isystem $(NCCL_HOME)/include $(if $(NCCL_LIB),-DANE_NCCL_LIB='"$(NCCL_LIB)"')
endif
# The GPU architectures compiled into one fat binary (docs/cuda.md): Ampere
# (80 A100, 86 RTX 30xx), Ada (89 RTX 40xx, L4, L40), Hopper as sm_90a (the
# warpgroup MMAs; "90" means 90a too), and Blackwell's 120 (RTX 50xx) where
# the toolkit has it; PTX of the newest for later GPUs. The device's
# compute capability picks the code and the kernels' path at run time.
CUDA_HAS_120 := $(shell $(NVCC) --list-gpu-arch 2>/dev/null | grep -qx compute_120 && echo 120)
CUDA_ARCH ?= 80 86 89 90a $(CUDA_HAS_120)
CUDA_SMS  := $(patsubst 90,90a,$(strip $(CUDA_ARCH)))
CUDA_PTX  := $(lastword $(filter-out 90a,$(CUDA_SMS)))
comma     := ,
CUDA_GENCODE := $(foreach a,$(CUDA_SMS),-gencode arch=compute_$(a)$(comma)code=sm_$(a)) \
                $(if $(CUDA_PTX),-gencode arch=compute_$(CUDA_PTX)$(comma)code=compute_$(CUDA_PTX))
# objects rebuild when the list changes ($(O)/.cuda_arch holds the last one)
$(shell mkdir -p $(O); [ "$$(cat $(O)/.cuda_arch 2>/dev/null)" = "$(CUDA_SMS)" ] || echo "$(CUDA_SMS)" > $(O)/.cuda_arch)
endif
BUILD_KIND := $(if $(filter 1,$(CUDA)),cuda,cpu)
# programs relink when the build kind changes (bin/.kind holds the last one)
$(shell mkdir -p bin; [ "$$(cat bin/.kind 2>/dev/null)" = "$(BUILD_KIND)" ] || echo $(BUILD_KIND) > bin/.kind)

COMMON_SRC := $(wildcard common/*.c)
PROTO_SRC  := $(wildcard proto/*.c)
# engine sources sit in subfolders (engine/README.md): object paths mirror them
ENGINE_SRC := $(sort $(shell find engine -name '*.c'))
CLIENT_LIB_SRC := $(wildcard client/libaneclient.c)
HTTP_SRC   := $(wildcard http/*.c)
DAEMON_SRC := $(wildcard daemon/*.c)
# t_backend's CUDA part (tests/unit/t_cuda_*.c): linked into it in CUDA builds
CUDA_TEST_SRC := $(wildcard tests/unit/t_cuda_*.c)
UNIT_SRC   := $(filter-out $(CUDA_TEST_SRC),$(wildcard tests/unit/t_*.c))
BENCH_SRC  := $(wildcard tests/bench/*.c)
BENCH_BIN  := $(BENCH_SRC:tests/bench/%.c=bin/%)
TEST_HELP_SRC := $(filter-out tests/unit/t_%.c,$(wildcard tests/unit/*.c))

COMMON_OBJ := $(COMMON_SRC:%.c=$(O)/%.o)
PROTO_OBJ  := $(PROTO_SRC:%.c=$(O)/%.o)
ENGINE_OBJ := $(ENGINE_SRC:%.c=$(O)/%.o)
CLIENT_LIB_OBJ := $(CLIENT_LIB_SRC:%.c=$(O)/%.o)
DAEMON_OBJ := $(DAEMON_SRC:%.c=$(O)/%.o)
HTTP_OBJ   := $(HTTP_SRC:%.c=$(O)/%.o)
TEST_HELP_OBJ := $(TEST_HELP_SRC:%.c=$(O)/%.o)
UNIT_BIN   := $(UNIT_SRC:tests/unit/%.c=bin/tests/%)
CUDA_TEST_OBJ := $(CUDA_TEST_SRC:%.c=$(O)/%.o)

# (CUDA builds keep their libraries under bin/obj-cuda)
LIBDIR    := $(if $(filter 1,$(CUDA)),$(O),bin)
LIBPROTO  := $(LIBDIR)/libaneproto.a
LIBENGINE := $(LIBDIR)/libaneengine.a
LIBCLIENT := $(LIBDIR)/libaneclient.a

PROGS := $(if $(DAEMON_SRC),bin/aned) $(if $(wildcard client/aneclient.c),bin/aneclient) \
         $(if $(HTTP_SRC),bin/aned-http) bin/ane-template $(BENCH_BIN)

.PHONY: all deps run test bench cuda test-cuda ktrace sprof help clean fixtures fuzz install aarch64
all: $(PROGS) $(LIBCLIENT) $(UNIT_BIN)

help:
	@sed -n '2,15p' Makefile | sed 's/^# \{0,1\}//'

# Install what is missing when root; otherwise print the exact command.
# SKIP_DEPS=1: the libraries come from elsewhere (PC_CFLAGS/PC_LIBS given).
# The aarch64 test tools are optional: without them make test says so and
# skips the NEON tests.
# $(call DEPS_MISSING,PKGS): sets $$missing to those of PKGS not installed
DEPS_MISSING = missing=""; \
	for p in $(1); do dpkg-query -W -f='$${db:Status-Abbrev}\n' $$p 2>/dev/null | grep -q '^ii' || missing="$$missing $$p"; done
# installs $$missing, with an apt-get update when the first try fails
DEPS_INSTALL = (apt-get install -y -qq $$missing >/dev/null 2>&1 || \
	(apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq $$missing >/dev/null 2>&1))
# $(call DEPS_OPTIONAL,PKGS,WHAT,WITHOUT): installs PKGS for WHAT when root,
# else says so; WITHOUT: what happens while they are missing
DEPS_OPTIONAL = $(call DEPS_MISSING,$(1)); \
	if [ -n "$$missing" ] && [ "$$(id -u)" = 0 ]; then \
	  echo "installing ($(2)):$$missing"; \
	  $(DEPS_INSTALL) || echo "apt-get install failed:$$missing: $(3)" >&2; \
	elif [ -n "$$missing" ]; then \
	  echo "missing for $(2):$$missing (sudo apt-get install$$missing); $(3)" >&2; \
	fi
deps:
	@[ -n "$(SKIP_DEPS)" ] && exit 0; $(call DEPS_MISSING,$(DEB_PKGS)); \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing:$$missing"; \
	    $(DEPS_INSTALL) || { echo "apt-get install failed:$$missing" >&2; exit 1; }; \
	  else \
	    echo "missing packages; run: sudo apt-get install$$missing" >&2; exit 1; \
	  fi; \
	fi
	@[ -n "$(SKIP_DEPS)" ] && exit 0; \
	$(call DEPS_OPTIONAL,$(OPT_DEB_PKGS),line editing in aneclient --chat,aneclient --chat reads plain lines)
	@[ -n "$(SKIP_DEPS)$(filter 1,$(CUDA))" ] && exit 0; \
	$(call DEPS_OPTIONAL,$(AA_DEB_PKGS),the aarch64 tests,they are skipped)
	@[ -n "$(SKIP_DEPS)$(filter 1,$(CUDA))" ] && exit 0; $(AA_FETCH_JANSSON)

# --- aarch64: the NEON kernels (engine/quant/arm/neon.c) are compiled and checked
# only on aarch64. t_qgemm and t_dequant are cross-built with the objects they
# need alone (quant types, NEON kernels, GGUF reader and its file mapping),
# linked statically and run under qemu-user. t_dequant reads its reference with jansson: the arm64
# libjansson.a comes from Debian's libjansson-dev:arm64, unpacked into
# bin/aarch64/sysroot (apt-get download, not installed, so the system keeps
# one libjansson-dev).
AA_CC       ?= aarch64-linux-gnu-gcc
AA_QEMU     ?= qemu-aarch64-static
AA_DEB_PKGS := gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user-static
AA_DIR      := bin/aarch64
AA_SYSROOT  := $(AA_DIR)/sysroot
AA_JANSSON  := $(AA_SYSROOT)/usr/lib/aarch64-linux-gnu/libjansson.a
AA_ENG_SRC  := $(filter %/qtypes.c %/iq.c %/arm/neon.c %/quant/x8.c %/gguf.c %/mfile.c,$(ENGINE_SRC)) $(COMMON_SRC)
AA_OBJ      := $(AA_ENG_SRC:%.c=$(AA_DIR)/obj/%.o)
AA_TESTS    := $(AA_DIR)/t_qgemm $(AA_DIR)/t_dequant
AA_CFLAGS    = -std=c11 $(OPT) -g -pthread $(WARN) -I. -D_GNU_SOURCE -idirafter $(AA_SYSROOT)/usr/include
# gcc 12's aarch64 loop vectorizer crashes on t_dequant.c (vect_transform_reduction)
AA_TEST_CFLAGS := -fno-tree-loop-vectorize
AA_FETCH_JANSSON = [ -f $(AA_JANSSON) ] && exit 0; command -v $(AA_CC) >/dev/null || exit 0; \
	if ! dpkg --print-foreign-architectures | grep -qx arm64; then \
	  [ "$$(id -u)" = 0 ] || { echo "aarch64 tests: arm64 is not a dpkg architecture (sudo dpkg --add-architecture arm64)" >&2; exit 0; }; \
	  dpkg --add-architecture arm64 && apt-get update -qq >/dev/null 2>&1; \
	fi; \
	mkdir -p $(AA_DIR)/deb && rm -f $(AA_DIR)/deb/*.deb && \
	( (cd $(AA_DIR)/deb && apt-get download -qq libjansson-dev:arm64 >/dev/null 2>&1) || \
	  ([ "$$(id -u)" = 0 ] && apt-get update -qq >/dev/null 2>&1 && \
	   cd $(AA_DIR)/deb && apt-get download -qq libjansson-dev:arm64 >/dev/null 2>&1) ) && \
	dpkg-deb -x $(AA_DIR)/deb/libjansson-dev_*_arm64.deb $(AA_SYSROOT) && [ -f $(AA_JANSSON) ] || \
	echo "aarch64 tests: could not fetch libjansson-dev:arm64; they will be skipped" >&2

$(AA_DIR)/obj/%.o: %.c | bin/.deps-ok
	@mkdir -p $(dir $@)
	$(AA_CC) $(AA_CFLAGS) $(if $(filter tests/%,$<),$(AA_TEST_CFLAGS)) -MMD -MP -c $< -o $@
# kept, so that a second make finds them up to date
.SECONDARY: $(AA_OBJ) $(AA_TESTS:$(AA_DIR)/%=$(AA_DIR)/obj/tests/unit/%.o)
$(AA_DIR)/t_%: $(AA_DIR)/obj/tests/unit/t_%.o $(AA_OBJ)
	$(AA_CC) -static -pthread -o $@ $^ -L$(dir $(AA_JANSSON)) -ljansson -lm

# Builds them where the cross compiler, qemu and the arm64 jansson are
# there; otherwise says what is missing (make test then skips them).
aarch64: | bin/.deps-ok
	@if command -v $(AA_CC) >/dev/null 2>&1 && command -v $(AA_QEMU) >/dev/null 2>&1 && \
	    [ -f $(AA_JANSSON) ]; then \
	  $(MAKE) --no-print-directory $(AA_TESTS); \
	else \
	  echo "aarch64 tests not built: need $(AA_CC), $(AA_QEMU) (packages $(AA_DEB_PKGS)) and $(AA_JANSSON)"; \
	fi

bin/.deps-ok: | deps
	@mkdir -p bin && touch $@

$(O)/%.o: %.c | bin/.deps-ok
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -MMD -MP -c $< -o $@

# common/ (UTF-8, error messages) goes into every library that needs it
$(LIBPROTO): $(PROTO_OBJ) $(COMMON_OBJ)
	@mkdir -p $(dir $@); rm -f $@; ar rcs $@ $^
$(LIBENGINE): $(ENGINE_OBJ) $(COMMON_OBJ) $(CUDA_OBJ)
	@mkdir -p $(dir $@); rm -f $@; ar rcs $@ $^

$(O)/shaders/%.o: shaders/%.cu $(wildcard shaders/*.h shaders/*.cuh) engine/quant/qtypes.h $(O)/.cuda_arch
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -I. $(CUDA_GENCODE) -Xcompiler -fPIC -c $< -o $@

cuda:
	$(MAKE) CUDA=1 all

# the kernel timeline of a CUDA program (CUPTI): tests/bench/ktrace/ktrace.c says how
ktrace: bin/ktrace.so
bin/ktrace.so: tests/bench/ktrace/ktrace.c
	@mkdir -p bin
	$(CC) -shared -fPIC -O2 -Wall -Wextra -isystem $(CUDA_HOME)/include $< -o $@ -L$(CUDA_HOME)/lib64 -lcupti

# where a CPU program's time goes, without perf: tests/bench/sprof/sprof.c says how
sprof: bin/sprof.so
bin/sprof.so: tests/bench/sprof/sprof.c
	@mkdir -p bin
	$(CC) -shared -fPIC -O2 -Wall -Wextra $< -o $@ -ldl -pthread

# kernels against the CPU reference, then the model references through CUDA;
# on a machine of two GPUs or more, the models split over the first two
test-cuda: fixtures
	$(MAKE) CUDA=1 all
	@bin/tests/t_backend && ANE_BACKEND=cuda bin/tests/t_models && ANE_BACKEND=cuda bin/tests/t_embed
	@if [ "$$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')" -ge 2 ]; then \
	  ANE_BACKEND=cuda ANE_GPUS=0,1 bin/tests/t_split && ANE_BACKEND=cuda ANE_GPUS=0,1 bin/tests/t_models test_gpus; fi
$(LIBCLIENT): $(CLIENT_LIB_OBJ) $(PROTO_OBJ) $(COMMON_OBJ)
	@mkdir -p $(dir $@); rm -f $@; ar rcs $@ $^

bin/aned: $(DAEMON_OBJ) $(LIBENGINE) $(LIBPROTO) bin/.kind
	$(CC) $(LDFLAGS) -o $@ $(DAEMON_OBJ) $(LIBENGINE) $(LIBPROTO) $(LDLIBS)
$(O)/client/aneclient.o: CPPFLAGS += $(EDIT_CFLAGS)
bin/aneclient: $(O)/client/aneclient.o $(LIBCLIENT)
	$(CC) $(LDFLAGS) -o $@ $< $(LIBCLIENT) $(LDLIBS) $(EDIT_LIBS)
# renders a chat template with JSON variables (engine/text/jinja.h)
bin/ane-template: $(O)/client/ane-template.o $(LIBENGINE) bin/.kind
	$(CC) $(LDFLAGS) -o $@ $< $(LIBENGINE) $(LDLIBS)
bin/aned-http: $(HTTP_OBJ) $(LIBCLIENT)
	$(CC) $(LDFLAGS) -o $@ $(HTTP_OBJ) $(LIBCLIENT) $(HTTP_LIBS) $(LDLIBS)
# Every tests/bench/NAME.c is a program bin/NAME (anebench, ...).
$(BENCH_BIN): bin/%: $(O)/tests/bench/%.o $(LIBENGINE) $(LIBCLIENT) $(LIBPROTO) bin/.kind
	$(CC) $(LDFLAGS) -o $@ $< $(LIBENGINE) $(LIBCLIENT) $(LIBPROTO) $(LDLIBS)

bin/tests/%: $(O)/tests/unit/%.o $(TEST_HELP_OBJ) $(LIBENGINE) $(LIBCLIENT) $(LIBPROTO) bin/.kind
	@mkdir -p bin/tests
	$(CC) $(LDFLAGS) -o $@ $< $(TEST_HELP_OBJ) $(LIBENGINE) $(LIBCLIENT) $(LIBPROTO) $(LDLIBS)
T_BACKEND_CUDA := $(if $(filter 1,$(CUDA)),$(CUDA_TEST_OBJ))
bin/tests/t_backend: $(O)/tests/unit/t_backend.o $(T_BACKEND_CUDA) $(TEST_HELP_OBJ) $(LIBENGINE) $(LIBCLIENT) $(LIBPROTO) bin/.kind
	@mkdir -p bin/tests
	$(CC) $(LDFLAGS) -o $@ $< $(T_BACKEND_CUDA) $(TEST_HELP_OBJ) $(LIBENGINE) $(LIBCLIENT) $(LIBPROTO) $(LDLIBS)

# Fixtures that are stored compressed are unpacked at build time.
XZ_FIX := $(patsubst %.xz,%,$(wildcard tests/fixtures/tokenizers/*.xz tests/fixtures/tokenizers/hf/*.xz))
bin/fixtures/%: tests/fixtures/tokenizers/%.xz
	@mkdir -p $(dir $@)
	xz -dc $< > $@.tmp && mv $@.tmp $@
bin/fixtures/hf/%: tests/fixtures/tokenizers/hf/%.xz
	@mkdir -p $(dir $@)
	xz -dc $< > $@.tmp && mv $@.tmp $@
CHAT_FIX := $(patsubst tests/fixtures/chat/%.xz,bin/fixtures/chat/%,$(wildcard tests/fixtures/chat/*.xz))
bin/fixtures/chat/%: tests/fixtures/chat/%.xz
	@mkdir -p $(dir $@)
	xz -dc $< > $@.tmp && mv $@.tmp $@
fixtures: $(patsubst tests/fixtures/tokenizers/%,bin/fixtures/%,$(XZ_FIX)) $(CHAT_FIX)

MODEL ?= tests/fixtures/models/stories260K.gguf
PROMPT ?= Once upon a time
# tests/run_demo.sh: aned's log to bin/aned-run.log, chat when the model has a
# template, the daemon stopped on every exit (make run | head too)
run: export MODEL := $(MODEL)
run: export PROMPT := $(PROMPT)
run: all
	@sh tests/run_demo.sh "$$MODEL" "$$PROMPT"

test: all fixtures $(if $(filter 1,$(CUDA)),,aarch64)
	@PYTHON=$(PYTHON) SANITIZER=$(SANITIZER) AA_QEMU=$(AA_QEMU) sh tests/run.sh

bench: all
	@PYTHON=$(PYTHON) sh tests/bench/bench.sh

# Fuzzing: tests/fuzz/fuzz_*.c are libFuzzer targets built with clang and
# ASan+UBSan into bin/fuzz/; each runs FUZZ_SECONDS from its seed corpus
# (tests/fuzz/corpus/<target>, read-only; new inputs go to bin/fuzz/work).
# Any crash, leak or timeout fails; reproducers land in bin/fuzz/.
FUZZ_CC      ?= clang
FUZZ_SECONDS ?= 30
FUZZ_FLAGS   ?= -timeout=10 -rss_limit_mb=2048 -max_len=65536 -print_final_stats=0
FUZZ_SRC  := $(wildcard tests/fuzz/fuzz_*.c)
FUZZ_BIN  := $(FUZZ_SRC:tests/fuzz/%.c=bin/fuzz/%)
FUZZ_LIB_OBJ := $(patsubst %.c,bin/fuzz/obj/%.o,$(ENGINE_SRC) $(PROTO_SRC) $(COMMON_SRC))
FUZZ_CFLAGS = -std=c11 -O1 -g -pthread -fno-omit-frame-pointer -fsanitize=address,undefined \
              -fno-sanitize-recover=undefined -fsanitize=fuzzer-no-link $(CPPFLAGS) $(PC_CFLAGS)

bin/fuzz/obj/%.o: %.c | bin/.deps-ok
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -MMD -MP -c $< -o $@
# kept: as prerequisites of a pattern rule they would be deleted after each link
.SECONDARY: $(FUZZ_LIB_OBJ) $(FUZZ_SRC:tests/fuzz/%.c=bin/fuzz/obj/tests/fuzz/%.o)
bin/fuzz/%: bin/fuzz/obj/tests/fuzz/%.o $(FUZZ_LIB_OBJ)
	$(FUZZ_CC) -fsanitize=fuzzer,address,undefined -pthread -o $@ $^ $(LDLIBS)

fuzz: $(FUZZ_BIN) fixtures
	@fail=0; for b in $(FUZZ_BIN); do t=$${b##*/}; w=bin/fuzz/work/$$t; mkdir -p $$w; \
	  echo "== $$t ($(FUZZ_SECONDS) s)"; \
	  $$b $(FUZZ_FLAGS) -max_total_time=$(FUZZ_SECONDS) -artifact_prefix=bin/fuzz/$$t- \
	      $$w tests/fuzz/corpus/$$t > bin/fuzz/$$t.log 2>&1; rc=$$?; \
	  grep -E '^Done [0-9]+ runs' bin/fuzz/$$t.log || true; \
	  if [ $$rc -ne 0 ]; then fail=1; echo "$$t FAILED (exit $$rc):"; tail -n 40 bin/fuzz/$$t.log; fi; \
	done; exit $$fail

# Installation. The units name /usr/local/bin; another PREFIX rewrites them.
PREFIX  ?= /usr/local
DESTDIR ?=
INST    := $(DESTDIR)$(PREFIX)
install: all
	install -d $(INST)/bin $(INST)/lib/pkgconfig $(INST)/include/aned/proto $(INST)/include/aned/common \
	    $(INST)/lib/systemd/system $(INST)/share/doc/aned
	install -m 0755 bin/aned bin/aneclient bin/aned-http bin/ane-template $(INST)/bin/
	install -m 0644 $(LIBCLIENT) $(INST)/lib/
	install -m 0644 client/aneclient.h $(INST)/include/aned/
	install -m 0644 proto/proto.h $(INST)/include/aned/proto/
	install -m 0644 common/msg.h $(INST)/include/aned/common/
	printf '%s\n' 'prefix=$(PREFIX)' 'libdir=$${prefix}/lib' 'includedir=$${prefix}/include/aned' '' \
	    'Name: aneclient' 'Description: client library for the aned LLM daemon' 'Version: 0.1.0' \
	    'Cflags: -I$${includedir}' 'Libs: -L$${libdir} -laneclient -lmsgpackc -ljansson' \
	    > $(INST)/lib/pkgconfig/aneclient.pc
	for u in daemon/aned.service daemon/aned.socket daemon/aned-http.service; do \
	    sed 's,/usr/local/,$(PREFIX)/,g' $$u > $(INST)/lib/systemd/system/$${u##*/}; \
	    chmod 0644 $(INST)/lib/systemd/system/$${u##*/}; done
	install -m 0644 README.md docs/*.md proto/PROTOCOL.md $(INST)/share/doc/aned/

clean:
	rm -rf bin

-include $(shell find $(O) $(AA_DIR)/obj -name '*.d' 2>/dev/null)
