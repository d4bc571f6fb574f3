# heapd - build, check, install, demo, bench.
#
#   make                  build everything (installs missing Debian packages first)
#   make check            build and run every test that needs no GPU
#   make demo             heapd + a 4-rank example trainer on the host backend
#   make bench            benchmarks (CPU); see docs/benchmarks.md
#   make install          PREFIX=/usr/local DESTDIR=
#
# Switches: V=1 (full command lines), WERROR=0 (no -Werror, for packagers),
# SANITIZE=address,undefined (build and test under sanitizers), DEBUG=1
# (debug build: invariant validator on every allocator call), BUILD=dir,
# HEAPD_NO_DEPS=1 (skip the dependency step), STATIC=1 (link the dependencies'
# static archives: binaries for the GPU machine).

ifndef HEAPD_INNER
# Outer make: run the dependency step once, then the real build in a sub-make
# so that pkg-config sees the packages the step installed.
GOALS := $(or $(MAKECMDGOALS),all)
NODEPS_GOALS := clean distclean help
.PHONY: $(GOALS) _outer
$(firstword $(GOALS)): _outer
$(filter-out $(firstword $(GOALS)),$(GOALS)): _outer ; @:
_outer:
	@$(if $(filter-out $(NODEPS_GOALS),$(GOALS)),sh scripts/deps.sh)
	@$(MAKE) --no-print-directory HEAPD_INNER=1 $(MAKECMDGOALS)
Makefile: ;
else

BUILD    ?= build
PREFIX   ?= /usr/local
DESTDIR  ?=
BINDIR   ?= $(PREFIX)/bin
SBINDIR  ?= $(PREFIX)/sbin
LIBDIR   ?= $(PREFIX)/lib
INCDIR   ?= $(PREFIX)/include
MANDIR   ?= $(PREFIX)/share/man
SYSCONFDIR ?= /etc
CUDA_HOME ?= /usr/local/cuda
VERSION  := 0.1.0

CC       ?= cc
WERROR   ?= 1
DEBUG    ?= 0
SANITIZE ?=
PROTOC_C ?= protoc-c
PKG_CONFIG ?= pkg-config

ifeq ($(V),1)
say =
else
say = @printf '  %-7s %s\n' $(1) $(2);
endif

PKGS := libuv libprotobuf-c hiredis inih
PKG_CFLAGS = $(shell $(PKG_CONFIG) --cflags $(PKGS))
PKG_LIBS   = $(shell $(PKG_CONFIG) --libs $(PKGS))
CHECK_CFLAGS = $(shell $(PKG_CONFIG) --cflags check)
CHECK_LIBS   = $(shell $(PKG_CONFIG) --libs check)
# STATIC=1: link the Debian packages' static archives, so the binaries run on
# a machine that has none of them (the GPU machine); libcuda and libnccl are
# always loaded with dlopen.
ifeq ($(STATIC),1)
sa = $(shell $(CC) -print-file-name=$(1))
PKG_LIBS   = $(call sa,libuv_a.a) $(call sa,libprotobuf-c.a) $(call sa,libhiredis.a) $(call sa,libinih.a) -lrt
CHECK_LIBS = $(call sa,libcheck_pic.a) $(call sa,libsubunit.a) -lrt -lm
# Debian's libprotobuf-c.a is position-independent: the shared libraries
# (libheapc.so for python/heapd, the preload library) link it in, hidden.
STATIC_LDFLAGS := -Wl,--exclude-libs,ALL
endif

WARN := -Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes -Wno-unused-parameter
ifeq ($(WERROR),1)
WARN += -Werror
endif
OPT :=
ifeq ($(DEBUG),1)
OPT := -O0 -g3 -DHEAPD_DEBUG=1
endif
ifneq ($(SANITIZE),)
OPT += -fsanitize=$(SANITIZE) -fno-omit-frame-pointer -fno-sanitize-recover=all -DHEAPD_DEBUG=1
SAN_LDFLAGS := -fsanitize=$(SANITIZE)
endif
ifneq ($(wildcard $(CUDA_HOME)/include/cuda.h),)
CUDA_CFLAGS := -I$(CUDA_HOME)/include -DHEAPD_HAVE_CUDA_H=1
endif

# The user's CPPFLAGS, CFLAGS (default -O2 -g), LDFLAGS and LDLIBS go into
# the REAL_* ones with the project's flags, which a command line cannot drop
# (hiredis's REAL_CFLAGS): `make CFLAGS=-O1` keeps -std=c11, the warnings,
# -fPIC and -MMD. DEBUG=1 and SANITIZE come after CFLAGS.
CFLAGS   ?= -O2 -g
REAL_CPPFLAGS = -D_GNU_SOURCE -DHEAPD_VERSION='"$(VERSION)"' -I. -Icommon -Idaemon -Idaemon/heap -Iclient \
    -I$(BUILD)/proto $(CPPFLAGS)
REAL_CFLAGS = -std=c11 $(CFLAGS) $(OPT) $(WARN) -fPIC -MMD -MP $(VISIBILITY) $(PKG_CFLAGS) $(CUDA_CFLAGS)
REAL_LDFLAGS = $(LDFLAGS) $(SAN_LDFLAGS) $(STATIC_LDFLAGS)
REAL_LDLIBS = $(LDLIBS) $(PKG_LIBS) -ldl -lpthread -lm

# ---- sources ------------------------------------------------------------
PROTO_C   := $(BUILD)/proto/heapd.pb-c.c
PROTO_H   := $(BUILD)/proto/heapd.pb-c.h
COMMON_SRC := $(wildcard common/*.c)
# Programs: heapd one file, heapsim its heapsim*.c files; everything else in
# daemon/ is the daemon library (the allocator core daemon/alloc*.c in it,
# which heapsim, the tests, the benches and the alloc fuzzer link).
DAEMON_MAINS := daemon/heapd.c daemon/heapsim.c
HEAPSIM_SRC := $(wildcard daemon/heapsim*.c)
DAEMON_SRC := $(filter-out $(DAEMON_MAINS) $(HEAPSIM_SRC),$(wildcard daemon/*.c daemon/heap/*.c))
CLIENT_MAINS := client/heapctl.c
HEAPCTL_SRC := client/heapctl_prom.c client/heapctl_json.c   # heapctl's other files (not libheapc)
CLIENT_PRELOAD_SRC := client/heapc_nccl_preload.c
CLIENT_TORCH_SRC := client/heapc_torch.c
CLIENT_NCCL_SRC := $(filter-out $(CLIENT_PRELOAD_SRC),$(wildcard client/heapc_nccl*.c))
CLIENT_SRC := $(filter-out $(CLIENT_MAINS) $(HEAPCTL_SRC) $(CLIENT_NCCL_SRC) $(CLIENT_PRELOAD_SRC) $(CLIENT_TORCH_SRC),$(wildcard client/*.c))
TEST_SRC  := $(wildcard tests/check_*.c)
TPROG_SRC := $(wildcard tests/prog_*.c)
BENCH_SRC := $(wildcard bench/*.c)
EXAMPLE_SRC := $(wildcard examples/*.c)

obj = $(patsubst %.c,$(BUILD)/obj/%.o,$(1))
PROTO_OBJ  := $(BUILD)/obj/proto/heapd.pb-c.o
COMMON_OBJ := $(call obj,$(COMMON_SRC)) $(PROTO_OBJ)
DAEMON_OBJ := $(call obj,$(DAEMON_SRC))
# Issue 28: libheapc runs the allocator core too (its replica of the heap's
# allocator: client/heapc_replica.c), hidden like the rest of libheapc.
CORE_OBJ := $(call obj,$(wildcard daemon/alloc*.c))
CLIENT_OBJ := $(call obj,$(CLIENT_SRC)) $(CORE_OBJ)
CLIENT_NCCL_OBJ := $(call obj,$(CLIENT_NCCL_SRC))

LIBHEAPD   := $(BUILD)/libheapd_core.a
LIBHEAPC_A := $(BUILD)/libheapc.a
LIBHEAPC_SO := $(BUILD)/libheapc.so
LIBHEAPC_NCCL_A := $(BUILD)/libheapc_nccl.a
LIBHEAPC_NCCL_SO := $(BUILD)/libheapc_nccl.so
# Issue 17: the NCCL preload library (self-contained: libheapc and
# libheapc_nccl inside) and the recording NCCL stand-in its tests load.
LIBHEAPC_PRELOAD_SO := $(BUILD)/libheapc_nccl_preload.so
LIBHEAPC_TORCH_SO := $(BUILD)/libheapc_torch.so
NCCL_STUB_SRC := tests/nccl_stub/nccl_stub.c tests/nccl_stub/nccl_user.c
NCCL_STUB_LIBS := $(BUILD)/tests/nccl_stub/libnccl.so.2 $(BUILD)/tests/nccl_stub/libnccl_user.so
PROGS      := $(patsubst daemon/%.c,$(BUILD)/%,$(wildcard $(DAEMON_MAINS))) $(patsubst client/%.c,$(BUILD)/%,$(wildcard $(CLIENT_MAINS)))
TESTS      := $(patsubst tests/%.c,$(BUILD)/tests/%,$(TEST_SRC))
TPROGS     := $(patsubst tests/%.c,$(BUILD)/tests/%,$(TPROG_SRC))
BENCHES    := $(patsubst bench/%.c,$(BUILD)/bench/%,$(BENCH_SRC))
EXAMPLES   := $(patsubst examples/%.c,$(BUILD)/examples/%,$(EXAMPLE_SRC))

# The shared libraries export their API only: the client and common objects
# are built with hidden symbols; heapc.h and heapc_nccl.h mark the API
# (#pragma GCC visibility push(default)). Static archives and programs link
# the same objects. `nm -D --defined-only` lists heapc_* / hnccl_* only.
$(CLIENT_OBJ) $(CLIENT_NCCL_OBJ) $(COMMON_OBJ): VISIBILITY := -fvisibility=hidden

ALL_OBJ := $(COMMON_OBJ) $(DAEMON_OBJ) $(CLIENT_OBJ) $(CLIENT_NCCL_OBJ) $(call obj,$(CLIENT_PRELOAD_SRC) $(CLIENT_TORCH_SRC) $(NCCL_STUB_SRC)) $(call obj,$(DAEMON_MAINS) $(HEAPSIM_SRC) $(CLIENT_MAINS) $(HEAPCTL_SRC) $(TEST_SRC) $(TPROG_SRC) $(BENCH_SRC) $(EXAMPLE_SRC))

# Keep intermediate files (the generated protobuf sources) between runs.
.SECONDARY:

.PHONY: all check bench demo install uninstall clean distclean help tests
.DEFAULT_GOAL := all

# STATIC=1 builds the shared libraries too, with libprotobuf-c.a linked in.
LIBHEAPC_SO_ALL := $(LIBHEAPC_SO)
LIBHEAPC_NCCL_SO_ALL := $(LIBHEAPC_NCCL_SO)
all: $(PROGS) $(LIBHEAPC_A) $(LIBHEAPC_SO_ALL) $(LIBHEAPC_NCCL_A) $(LIBHEAPC_NCCL_SO_ALL) $(TESTS) $(TPROGS) $(BENCHES) $(EXAMPLES) \
    $(LIBHEAPC_PRELOAD_SO) $(LIBHEAPC_TORCH_SO) $(NCCL_STUB_LIBS)

# ---- rules --------------------------------------------------------------
$(PROTO_C) $(PROTO_H): proto/heapd.proto
	@mkdir -p $(BUILD)/proto
	$(call say,PROTOC,$<)$(PROTOC_C) --proto_path=proto --c_out=$(BUILD)/proto $<

$(BUILD)/obj/proto/heapd.pb-c.o: $(PROTO_C)
	@mkdir -p $(dir $@)
	$(call say,CC,$<)$(CC) $(REAL_CPPFLAGS) $(REAL_CFLAGS) -Wno-error -c -o $@ $<

$(BUILD)/obj/%.o: %.c | $(PROTO_H)
	@mkdir -p $(dir $@)
	$(call say,CC,$<)$(CC) $(REAL_CPPFLAGS) $(REAL_CFLAGS) -c -o $@ $<

$(LIBHEAPD): $(DAEMON_OBJ) $(COMMON_OBJ)
	$(call say,AR,$@)rm -f $@ && ar rcs $@ $^

$(LIBHEAPC_A): $(CLIENT_OBJ) $(COMMON_OBJ)
	$(call say,AR,$@)rm -f $@ && ar rcs $@ $^

$(LIBHEAPC_SO): $(CLIENT_OBJ) $(COMMON_OBJ)
	$(call say,LD,$@)$(CC) -shared -Wl,-soname,libheapc.so.0 $(REAL_LDFLAGS) -o $@ $^ $(REAL_LDLIBS)
	@ln -sf libheapc.so $(BUILD)/libheapc.so.0   # the soname: what a program linked against $(BUILD) loads

# libheapc_nccl: the NCCL wrappers (client/heapc_nccl*.c), a library of its
# own so that libheapc does not need NCCL; it uses libheapc (link both).
$(LIBHEAPC_NCCL_A): $(CLIENT_NCCL_OBJ)
	$(call say,AR,$@)rm -f $@ && ar rcs $@ $^

# Its own hidden copies of hsz_parse_size and the libcuda loader (libheapc
# exports no hsz_* nor cd_*).
NCCL_SO_COMMON := $(BUILD)/obj/common/size.o $(BUILD)/obj/common/cuda_dl.o
$(LIBHEAPC_NCCL_SO): $(CLIENT_NCCL_OBJ) $(NCCL_SO_COMMON) $(LIBHEAPC_SO)
	$(call say,LD,$@)$(CC) -shared -Wl,-soname,libheapc_nccl.so.0 $(REAL_LDFLAGS) -o $@ $(CLIENT_NCCL_OBJ) \
	    $(NCCL_SO_COMMON) -L$(BUILD) -lheapc -ldl -lpthread
	@ln -sf libheapc_nccl.so $(BUILD)/libheapc_nccl.so.0

# The preload library: -Bsymbolic binds its own calls to its own copies;
# the version script exports nccl*, heapc_* and hnccl_* only.
$(LIBHEAPC_PRELOAD_SO): $(call obj,$(CLIENT_PRELOAD_SRC)) $(CLIENT_NCCL_OBJ) $(CLIENT_OBJ) $(COMMON_OBJ) client/heapc_nccl_preload.map
	$(call say,LD,$@)$(CC) -shared -Wl,-soname,libheapc_nccl_preload.so -Wl,-Bsymbolic \
	    -Wl,--version-script=client/heapc_nccl_preload.map $(REAL_LDFLAGS) -o $@ $(filter %.o,$^) $(REAL_LDLIBS)

# The torch allocator shim: no libheapc inside (python/heapd hands it its
# libheapc's functions); libcuda is dlopened.
$(LIBHEAPC_TORCH_SO): $(call obj,$(CLIENT_TORCH_SRC))
	$(call say,LD,$@)$(CC) -shared -Wl,-soname,libheapc_torch.so $(REAL_LDFLAGS) -o $@ $< -ldl -lpthread

$(BUILD)/tests/nccl_stub/libnccl.so.2: $(BUILD)/obj/tests/nccl_stub/nccl_stub.o
	@mkdir -p $(dir $@)
	$(call say,LD,$@)$(CC) -shared -Wl,-soname,libnccl.so.2 $(REAL_LDFLAGS) -o $@ $<

$(BUILD)/tests/nccl_stub/libnccl_user.so: $(BUILD)/obj/tests/nccl_stub/nccl_user.o $(BUILD)/tests/nccl_stub/libnccl.so.2
	$(call say,LD,$@)$(CC) -shared $(REAL_LDFLAGS) -o $@ $< -L$(dir $@) -l:libnccl.so.2 -Wl,-rpath,'$$ORIGIN' -Wl,--enable-new-dtags

$(BUILD)/heapd: $(BUILD)/%: $(BUILD)/obj/daemon/%.o $(LIBHEAPD)
	$(call say,LD,$@)$(CC) $(REAL_LDFLAGS) -o $@ $^ $(REAL_LDLIBS)

$(BUILD)/heapsim: $(call obj,$(HEAPSIM_SRC)) $(LIBHEAPD)
	$(call say,LD,$@)$(CC) $(REAL_LDFLAGS) -o $@ $^ $(REAL_LDLIBS)

$(BUILD)/heapctl: $(BUILD)/obj/client/heapctl.o $(call obj,$(HEAPCTL_SRC)) $(LIBHEAPC_A)
	$(call say,LD,$@)$(CC) $(REAL_LDFLAGS) -o $@ $^ $(REAL_LDLIBS)

$(BUILD)/tests/%: $(BUILD)/obj/tests/%.o $(LIBHEAPD) $(LIBHEAPC_A)
	@mkdir -p $(dir $@)
	$(call say,LD,$@)$(CC) $(REAL_LDFLAGS) -o $@ $< $(LIBHEAPD) $(LIBHEAPC_A) $(CHECK_LIBS) $(REAL_LDLIBS)

$(BUILD)/tests/check_nccl: $(BUILD)/obj/tests/check_nccl.o $(LIBHEAPC_NCCL_A) $(LIBHEAPD) $(LIBHEAPC_A)
	@mkdir -p $(dir $@)
	$(call say,LD,$@)$(CC) $(REAL_LDFLAGS) -o $@ $< $(LIBHEAPC_NCCL_A) $(LIBHEAPD) $(LIBHEAPC_A) $(CHECK_LIBS) $(REAL_LDLIBS)

$(BUILD)/tests/check_nccl_win: $(BUILD)/obj/tests/check_nccl_win.o $(LIBHEAPC_NCCL_A) $(LIBHEAPD) $(LIBHEAPC_A)
	@mkdir -p $(dir $@)
	$(call say,LD,$@)$(CC) $(REAL_LDFLAGS) -o $@ $< $(LIBHEAPC_NCCL_A) $(LIBHEAPD) $(LIBHEAPC_A) $(CHECK_LIBS) $(REAL_LDLIBS)

$(BUILD)/obj/tests/%.o: tests/%.c | $(PROTO_H)
	@mkdir -p $(dir $@)
	$(call say,CC,$<)$(CC) $(REAL_CPPFLAGS) $(REAL_CFLAGS) $(CHECK_CFLAGS) -c -o $@ $<

$(BUILD)/bench/%: $(BUILD)/obj/bench/%.o $(LIBHEAPD) $(LIBHEAPC_A)
	@mkdir -p $(dir $@)
	$(call say,LD,$@)$(CC) $(REAL_LDFLAGS) -o $@ $< $(LIBHEAPD) $(LIBHEAPC_A) $(REAL_LDLIBS)

$(BUILD)/bench/nccl_bench: $(BUILD)/obj/bench/nccl_bench.o $(LIBHEAPC_NCCL_A) $(LIBHEAPD) $(LIBHEAPC_A)
	@mkdir -p $(dir $@)
	$(call say,LD,$@)$(CC) $(REAL_LDFLAGS) -o $@ $< $(LIBHEAPC_NCCL_A) $(LIBHEAPD) $(LIBHEAPC_A) $(REAL_LDLIBS)

# issue 32's multi-GPU bench: --host loads the NCCL stand-in, so make builds it first
$(BUILD)/bench/nccl_multi_bench: $(BUILD)/obj/bench/nccl_multi_bench.o $(LIBHEAPC_NCCL_A) $(LIBHEAPD) $(LIBHEAPC_A) \
    $(BUILD)/tests/nccl_stub/libnccl.so.2
	@mkdir -p $(dir $@)
	$(call say,LD,$@)$(CC) $(REAL_LDFLAGS) -o $@ $< $(LIBHEAPC_NCCL_A) $(LIBHEAPD) $(LIBHEAPC_A) $(REAL_LDLIBS)

$(BUILD)/examples/%: $(BUILD)/obj/examples/%.o $(LIBHEAPC_A)
	@mkdir -p $(dir $@)
	$(call say,LD,$@)$(CC) $(REAL_LDFLAGS) -o $@ $< $(LIBHEAPC_A) $(REAL_LDLIBS)

-include $(ALL_OBJ:.o=.d)

# ---- check, bench, demo -------------------------------------------------
# Unit tests (check framework, one file per module) then the shell-driven
# integration tests in tests/*.sh; each prints its own result lines.
check: all
	@BUILD=$(BUILD) HEAPD_VALIDATING=$(if $(SANITIZE)$(filter 1,$(DEBUG)),1,) sh tests/run.sh

bench: all
	@BUILD=$(BUILD) sh bench/run.sh

demo: all
	@BUILD=$(BUILD) sh scripts/demo.sh

# ---- install ------------------------------------------------------------
# Everything honours PREFIX and DESTDIR. The configuration is installed only
# when there is none (an operator's heapd.conf is never overwritten, and
# uninstall leaves it), with `backend = auto` (the shipped file says host, for
# the demo). heapc.pc gets libdir/includedir relative to ${prefix} where they
# lie under PREFIX, so `pkg-config --define-prefix` works on a DESTDIR tree.
UNITDIR  ?= $(PREFIX)/lib/systemd/system
SYSUSERSDIR ?= $(PREFIX)/lib/sysusers.d
TMPFILESDIR ?= $(PREFIX)/lib/tmpfiles.d
PCDIR    ?= $(LIBDIR)/pkgconfig
pcdir = $(patsubst $(PREFIX)/%,$${prefix}/%,$(patsubst $(PREFIX),$${prefix},$(1)))

# python/heapd goes where Debian's python3 finds it: /usr/lib/python3/dist-packages
# for PREFIX=/usr, else PREFIX/lib/python3.X/dist-packages.
PYTHON3 ?= /usr/bin/python3
PYVER = $(shell $(PYTHON3) -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || echo 3)
PYDIR ?= $(if $(filter /usr,$(PREFIX)),$(PREFIX)/lib/python3/dist-packages,$(PREFIX)/lib/python$(PYVER)/dist-packages)

# install-files: what is installed, built if needed, without the tests and
# benchmarks (debian/rules: the package needs no test framework to build).
INSTALL_DEPS := $(PROGS) $(LIBHEAPC_A) $(LIBHEAPC_SO) $(LIBHEAPC_NCCL_A) $(LIBHEAPC_NCCL_SO) \
    $(LIBHEAPC_PRELOAD_SO) $(LIBHEAPC_TORCH_SO)
.PHONY: install-deps install-files
install-deps: $(INSTALL_DEPS)
install: all install-files
install-files: $(INSTALL_DEPS)
	install -d $(DESTDIR)$(SBINDIR) $(DESTDIR)$(BINDIR) $(DESTDIR)$(LIBDIR) $(DESTDIR)$(INCDIR) \
	    $(DESTDIR)$(PCDIR) $(DESTDIR)$(UNITDIR) $(DESTDIR)$(SYSCONFDIR)/heapd \
	    $(DESTDIR)$(MANDIR)/man1 $(DESTDIR)$(MANDIR)/man3 $(DESTDIR)$(MANDIR)/man5 $(DESTDIR)$(MANDIR)/man8
	install -d $(DESTDIR)$(PYDIR)/heapd
	install -m 0644 python/heapd/*.py $(DESTDIR)$(PYDIR)/heapd/
	install -m 0755 $(LIBHEAPC_PRELOAD_SO) $(LIBHEAPC_TORCH_SO) $(DESTDIR)$(LIBDIR)/
	install -m 0755 $(BUILD)/heapd $(DESTDIR)$(SBINDIR)/heapd
	install -m 0755 $(BUILD)/heapctl $(BUILD)/heapsim $(DESTDIR)$(BINDIR)/
	install -m 0644 $(LIBHEAPC_A) $(DESTDIR)$(LIBDIR)/libheapc.a
	install -m 0755 $(LIBHEAPC_SO) $(DESTDIR)$(LIBDIR)/libheapc.so.0
	ln -sf libheapc.so.0 $(DESTDIR)$(LIBDIR)/libheapc.so
	install -m 0644 client/heapc.h $(DESTDIR)$(INCDIR)/heapc.h
	install -m 0644 $(LIBHEAPC_NCCL_A) $(DESTDIR)$(LIBDIR)/libheapc_nccl.a
	install -m 0755 $(LIBHEAPC_NCCL_SO) $(DESTDIR)$(LIBDIR)/libheapc_nccl.so.0
	ln -sf libheapc_nccl.so.0 $(DESTDIR)$(LIBDIR)/libheapc_nccl.so
	install -m 0644 client/heapc_nccl.h $(DESTDIR)$(INCDIR)/heapc_nccl.h
	sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@LIBDIR@|$(call pcdir,$(LIBDIR))|g' \
	    -e 's|@INCDIR@|$(call pcdir,$(INCDIR))|g' -e 's|@VERSION@|$(VERSION)|g' \
	    client/heapc.pc.in > $(DESTDIR)$(PCDIR)/heapc.pc
	chmod 0644 $(DESTDIR)$(PCDIR)/heapc.pc
	sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@LIBDIR@|$(call pcdir,$(LIBDIR))|g' \
	    -e 's|@INCDIR@|$(call pcdir,$(INCDIR))|g' -e 's|@VERSION@|$(VERSION)|g' \
	    client/heapc_nccl.pc.in > $(DESTDIR)$(PCDIR)/heapc_nccl.pc
	chmod 0644 $(DESTDIR)$(PCDIR)/heapc_nccl.pc
	install -d $(DESTDIR)$(SYSUSERSDIR) $(DESTDIR)$(TMPFILESDIR)
	install -m 0644 systemd/heapd.sysusers $(DESTDIR)$(SYSUSERSDIR)/heapd.conf
	install -m 0644 systemd/heapd.tmpfiles $(DESTDIR)$(TMPFILESDIR)/heapd.conf
	sed -e 's|@SBINDIR@|$(SBINDIR)|g' -e 's|@SYSCONFDIR@|$(SYSCONFDIR)|g' \
	    systemd/heapd.service.in > $(DESTDIR)$(UNITDIR)/heapd.service
	chmod 0644 $(DESTDIR)$(UNITDIR)/heapd.service
	install -m 0644 systemd/heapd.socket $(DESTDIR)$(UNITDIR)/heapd.socket
	sed -e 's|@BINDIR@|$(BINDIR)|g' systemd/heapd-metrics.service.in > $(DESTDIR)$(UNITDIR)/heapd-metrics.service
	chmod 0644 $(DESTDIR)$(UNITDIR)/heapd-metrics.service
	install -m 0644 systemd/heapd-metrics.timer $(DESTDIR)$(UNITDIR)/heapd-metrics.timer
	@if [ -e $(DESTDIR)$(SYSCONFDIR)/heapd/heapd.conf ]; then \
	    echo "kept $(DESTDIR)$(SYSCONFDIR)/heapd/heapd.conf (exists; the new default is heapd.conf in the source tree)"; \
	else \
	    echo "sed 's/^backend = host$$/backend = auto/' heapd.conf > $(DESTDIR)$(SYSCONFDIR)/heapd/heapd.conf"; \
	    sed 's/^backend = host$$/backend = auto/' heapd.conf > $(DESTDIR)$(SYSCONFDIR)/heapd/heapd.conf && \
	    chmod 0644 $(DESTDIR)$(SYSCONFDIR)/heapd/heapd.conf; \
	fi
	install -m 0644 docs/man/heapctl.1 $(DESTDIR)$(MANDIR)/man1/heapctl.1
	install -m 0644 docs/man/libheapc.3 $(DESTDIR)$(MANDIR)/man3/libheapc.3
	install -m 0644 docs/man/libheapc_nccl.3 $(DESTDIR)$(MANDIR)/man3/libheapc_nccl.3
	install -m 0644 docs/man/heapd.conf.5 $(DESTDIR)$(MANDIR)/man5/heapd.conf.5
	install -m 0644 docs/man/heapd.8 $(DESTDIR)$(MANDIR)/man8/heapd.8
	@echo "installed; as root, without DESTDIR: ldconfig; groupadd --system heapd;" \
	    "useradd --system -g heapd -d / -s /usr/sbin/nologin heapd; systemctl daemon-reload;" \
	    "systemctl enable --now heapd.socket heapd.service (docs/operations.md)"

uninstall:
	rm -f $(DESTDIR)$(SBINDIR)/heapd $(DESTDIR)$(BINDIR)/heapctl $(DESTDIR)$(BINDIR)/heapsim
	rm -f $(DESTDIR)$(LIBDIR)/libheapc.a $(DESTDIR)$(LIBDIR)/libheapc.so $(DESTDIR)$(LIBDIR)/libheapc.so.0
	rm -f $(DESTDIR)$(INCDIR)/heapc.h $(DESTDIR)$(PCDIR)/heapc.pc $(DESTDIR)$(PCDIR)/heapc_nccl.pc \
	    $(DESTDIR)$(SYSUSERSDIR)/heapd.conf $(DESTDIR)$(TMPFILESDIR)/heapd.conf \
	    $(DESTDIR)$(MANDIR)/man3/libheapc_nccl.3
	rm -f $(DESTDIR)$(LIBDIR)/libheapc_nccl.a $(DESTDIR)$(LIBDIR)/libheapc_nccl.so \
	    $(DESTDIR)$(LIBDIR)/libheapc_nccl.so.0 $(DESTDIR)$(INCDIR)/heapc_nccl.h
	rm -rf $(DESTDIR)$(PYDIR)/heapd
	rm -f $(DESTDIR)$(LIBDIR)/libheapc_nccl_preload.so $(DESTDIR)$(LIBDIR)/libheapc_torch.so
	rm -f $(DESTDIR)$(UNITDIR)/heapd.service $(DESTDIR)$(UNITDIR)/heapd.socket \
	    $(DESTDIR)$(UNITDIR)/heapd-metrics.service $(DESTDIR)$(UNITDIR)/heapd-metrics.timer
	rm -f $(DESTDIR)$(MANDIR)/man1/heapctl.1 $(DESTDIR)$(MANDIR)/man3/libheapc.3 \
	    $(DESTDIR)$(MANDIR)/man5/heapd.conf.5 $(DESTDIR)$(MANDIR)/man8/heapd.8
	@if [ -e $(DESTDIR)$(SYSCONFDIR)/heapd/heapd.conf ]; then \
	    echo "left $(DESTDIR)$(SYSCONFDIR)/heapd/heapd.conf (the operator's configuration): remove it by hand if it is no longer wanted"; \
	fi

clean distclean:
	rm -rf $(BUILD)

# ---- fuzz ---------------------------------------------------------------
# libFuzzer targets (tests/fuzz/fuzz_*.c), built with clang straight from the
# sources (-fsanitize=fuzzer,address,undefined) into $(BUILD)/fuzz and run
# FUZZ_SECONDS each from the seed corpus tests/fuzz/corpus/NAME; new inputs
# go to $(BUILD)/fuzz/corpus/NAME, crashes to $(BUILD)/fuzz/artifacts/NAME.
# Targets: wire, alloc, heap (the heap wing in process), dispatch (frames
# through dispatch.c); tests/fuzz/run.sh says what each drives. `make check`
# runs them briefly (tests/it_fuzz.sh: 10 s, heap and dispatch 5 s).
FUZZ_SECONDS ?= 60
FUZZ_CC      ?= clang
FUZZ_TARGETS ?= wire alloc heap dispatch ring
.PHONY: fuzz
fuzz: $(PROTO_C)
	@BUILD=$(BUILD) HEAPD_SRC=$(CURDIR) FUZZ_SECONDS=$(FUZZ_SECONDS) FUZZ_CC=$(FUZZ_CC) \
	    FUZZ_TARGETS="$(FUZZ_TARGETS)" PKG_CONFIG=$(PKG_CONFIG) sh tests/fuzz/run.sh

help:
	@sed -n '1,/^$$/p' Makefile | sed 's/^# \{0,1\}//'

endif
