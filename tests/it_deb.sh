#!/bin/sh
# it_deb.sh - the Debian packages (debian/): `dpkg-buildpackage -us -uc -b`
# on a copy of the source tree, the packages extracted into a DESTDIR-like
# root, their files checked, the sysusers.d and tmpfiles.d files applied to
# that root (the heapd user and group, /run/heapd), heapd and heapctl run
# from it (host backend, a socket of their own), the Python module imported
# from it, and lintian (no errors).
#
# It rebuilds everything (a few minutes on 2 cores), so `make check` runs it
# only with HEAPD_DEB_TEST=1 (otherwise it says "skipped"); CI runs it so on
# a machine with time to spare. Needs dpkg-dev, debhelper, fakeroot, lintian.
set -u
BUILD=${BUILD:-build}
SRC=${HEAPD_SRC:-$(pwd)}
. "$SRC/tests/lib.sh"
if [ "${HEAPD_DEB_TEST:-0}" != 1 ]; then
    echo "skipped: the Debian package build (minutes): HEAPD_DEB_TEST=1 make check, or sh tests/it_deb.sh"
    exit 0
fi
for t in dpkg-buildpackage dh fakeroot lintian; do
    command -v $t >/dev/null 2>&1 || { echo "FAIL $t is not installed (apt-get install dpkg-dev debhelper fakeroot lintian)"; exit 1; }
done
T=$(mktemp -d /tmp/heapd-deb.XXXXXX)
chmod 755 "$T"
hpid=
cleanup() {
    [ -n "$hpid" ] && kill -9 "$hpid" 2>/dev/null
    [ -n "${KEEP:-}" ] || rm -rf "$T"
}
trap cleanup EXIT INT TERM

# The tracked and untracked (not ignored) files, as a release would hold.
mkdir "$T/heapd-0.1.0"
(cd "$SRC" && git ls-files -co --exclude-standard -z | xargs -0 tar cf - 2>/dev/null) | (cd "$T/heapd-0.1.0" && tar xf -)
(cd "$T/heapd-0.1.0" && DEB_BUILD_OPTIONS="nocheck parallel=2" dpkg-buildpackage -us -uc -b) >"$T/build.log" 2>&1
brc=$?
check "dpkg-buildpackage -us -uc -b" test $brc = 0
[ $brc = 0 ] || { tail -30 "$T/build.log" | sed 's/^/    | /'; exit 1; }
for p in heapd libheapc0 libheapc-dev python3-heapd; do
    check "package $p built" sh -c "ls '$T'/${p}_0.1.0_*.deb >/dev/null 2>&1"
done

# python3-heapd copies libheapc's structs: it needs exactly its version (issue 31).
pydeb=$(ls "$T"/python3-heapd_0.1.0_*.deb 2>/dev/null | head -1)
check "python3-heapd depends on libheapc0 (= 0.1.0) and python3-numpy" \
    sh -c "dpkg-deb -f '$pydeb' Depends | grep -q 'libheapc0 (= 0.1.0)' && dpkg-deb -f '$pydeb' Depends | grep -q python3-numpy"
check "python3-heapd recommends python3-torch" sh -c "dpkg-deb -f '$pydeb' Recommends | grep -q python3-torch"

# Extracted into a root, as dpkg would install them.
ROOT=$T/root
mkdir "$ROOT"
for d in "$T"/*.deb; do dpkg-deb -x "$d" "$ROOT"; done
MA=$(dpkg-architecture -qDEB_HOST_MULTIARCH)
for f in usr/sbin/heapd usr/bin/heapctl usr/bin/heapsim etc/heapd/heapd.conf \
         lib/systemd/system/heapd.service lib/systemd/system/heapd.socket \
         lib/systemd/system/heapd-metrics.service lib/systemd/system/heapd-metrics.timer \
         usr/lib/sysusers.d/heapd.conf usr/lib/tmpfiles.d/heapd.conf \
         "usr/lib/$MA/libheapc.so.0" "usr/lib/$MA/libheapc_nccl.so.0" "usr/lib/$MA/pkgconfig/heapc.pc" \
         "usr/lib/$MA/pkgconfig/heapc_nccl.pc" usr/include/heapc.h usr/include/heapc_nccl.h \
         usr/share/man/man3/libheapc_nccl.3.gz usr/share/man/man8/heapd.8.gz \
         usr/lib/python3/dist-packages/heapd/__init__.py; do
    check "installed: /$f" test -e "$ROOT/$f"
done
check "heapd-metrics.service runs /usr/bin/heapctl" grep -q '^ExecStart=/usr/bin/heapctl ' "$ROOT/lib/systemd/system/heapd-metrics.service"
check "the installed heapd.conf says backend = auto" grep -qx 'backend = auto' "$ROOT/etc/heapd/heapd.conf"
check "heapc_nccl.pc requires heapc and links -lheapc_nccl" \
    sh -c "PKG_CONFIG_PATH='$ROOT/usr/lib/$MA/pkgconfig' pkg-config --define-prefix --libs heapc_nccl | grep -q -- '-lheapc_nccl.*-lheapc'"
check "heapd's postinst creates the heapd user (sysusers)" grep -q 'systemd-sysusers' "$T/heapd-0.1.0/debian/heapd/DEBIAN/postinst"

# sysusers.d and tmpfiles.d applied to the root.
if command -v systemd-sysusers >/dev/null 2>&1; then
    mkdir -p "$ROOT/etc"
    systemd-sysusers --root="$ROOT" "$ROOT/usr/lib/sysusers.d/heapd.conf" >"$T/sysusers.log" 2>&1
    check "systemd-sysusers: user and group heapd in the root" \
        sh -c "grep -q '^heapd:' '$ROOT/etc/passwd' && grep -q '^heapd:' '$ROOT/etc/group'"
    systemd-tmpfiles --root="$ROOT" --create "$ROOT/usr/lib/tmpfiles.d/heapd.conf" >"$T/tmpfiles.log" 2>&1
    check "systemd-tmpfiles: /run/heapd in the root, mode 0755" test "$(stat -c %a "$ROOT/run/heapd" 2>/dev/null)" = 755
else
    echo "    skipped: systemd-sysusers not installed"
fi

# The installed programs run: heapd (host backend) and heapctl from the root.
L=$ROOT/usr/lib/$MA
S=$T/heapd.sock
LD_LIBRARY_PATH=$L "$ROOT/usr/sbin/heapd" --config "$ROOT/etc/heapd/heapd.conf" --check-config >"$T/cc.out" 2>&1
check "the installed heapd checks the installed heapd.conf" grep -q 'heapd.conf: ok' "$T/cc.out"
LD_LIBRARY_PATH=$L "$ROOT/usr/sbin/heapd" --config "$ROOT/etc/heapd/heapd.conf" --backend host --socket "$S" 2>"$T/heapd.log" &
hpid=$!
wait_for test -S "$S"
LD_LIBRARY_PATH=$L "$ROOT/usr/bin/heapctl" --socket "$S" metrics >"$T/m.prom" 2>&1
check "the installed heapd serves the installed heapctl (metrics: heapd_up 1)" grep -qx 'heapd_up 1' "$T/m.prom"
check "the installed Python module loads the installed libheapc" \
    sh -c "cd / && env -u HEAPC_LIB LD_LIBRARY_PATH='$L' PYTHONPATH='$ROOT/usr/lib/python3/dist-packages' /usr/bin/python3 -c 'import heapd; print(open(\"/proc/self/maps\").read())' | grep -q '$L/libheapc.so.0'"
kill "$hpid"; wait "$hpid" 2>/dev/null; hpid=

(cd "$T" && lintian --fail-on error --tag-display-limit 0 ./*.changes) >"$T/lintian.log" 2>&1
lrc=$?
sed 's/^/    lintian: /' "$T/lintian.log" | head -40
check "lintian: no errors" test $lrc = 0

[ $fails = 0 ] && echo "it_deb: all passed" || echo "it_deb: $fails failed"
[ $fails = 0 ]
