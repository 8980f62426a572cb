#!/usr/bin/python3
"""make install: programs, libaneclient with its header and pkg-config file,
systemd units and docs land under PREFIX (staged through DESTDIR); a program
builds against the installed library through pkg-config alone; the units pass
`systemd-analyze verify` where systemd is present.

Ends with "N passed, M failed"; exits non-zero on any failure."""
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
passed = failed = 0


def check(cond, msg):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print("FAIL: " + msg)


def install(prefix, destdir=""):
    # The tree is built already (make test builds first): nothing recompiles.
    r = subprocess.run(["make", "-s", "install", "PREFIX=" + prefix, "DESTDIR=" + destdir],
                       cwd=ROOT, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    check(r.returncode == 0, "make install PREFIX=%s DESTDIR=%s: %s" % (prefix, destdir, r.stderr[-400:]))
    return r.returncode == 0


def main():
    tmp = tempfile.mkdtemp(prefix="ane-install.")
    try:
        # Staged: DESTDIR holds PREFIX's tree, the units name PREFIX.
        stage = os.path.join(tmp, "stage")
        if install("/opt/anetest", stage):
            base = stage + "/opt/anetest"
            for f in ["bin/aned", "bin/aneclient", "bin/aned-http", "lib/libaneclient.a",
                      "include/aned/aneclient.h", "include/aned/proto/proto.h", "include/aned/common/msg.h",
                      "lib/pkgconfig/aneclient.pc", "lib/systemd/system/aned.service",
                      "lib/systemd/system/aned.socket", "lib/systemd/system/aned-http.service",
                      "share/doc/aned/README.md", "share/doc/aned/PROTOCOL.md",
                      "share/doc/aned/service.md"]:
                check(os.path.isfile(os.path.join(base, f)), "staged install lacks " + f)
            for f in ["bin/aned", "bin/aneclient", "bin/aned-http"]:
                check(os.access(os.path.join(base, f), os.X_OK), f + " not executable")
            unit = open(base + "/lib/systemd/system/aned.service").read()
            check("/opt/anetest/bin/aned " in unit and "/usr/local" not in unit,
                  "aned.service does not name PREFIX's aned")
            doc = [l for l in unit.splitlines() if l.startswith("Documentation=")]
            check(doc and os.path.isfile(stage + doc[0].split("file:", 1)[1]),
                  "aned.service's Documentation= names a file not installed: %r" % doc)
            check(not os.path.exists(os.path.join(tmp, "opt")), "DESTDIR ignored")

        # Real prefix: build a client with pkg-config and run it.
        pre = os.path.join(tmp, "usr")
        if install(pre):
            env = dict(os.environ, PKG_CONFIG_PATH=pre + "/lib/pkgconfig")
            flags = subprocess.run(["pkg-config", "--cflags", "--libs", "aneclient"], env=env,
                                   capture_output=True, text=True)
            check(flags.returncode == 0 and "-laneclient" in flags.stdout,
                  "pkg-config aneclient: %s%s" % (flags.stdout, flags.stderr))
            src = os.path.join(tmp, "c.c")
            with open(src, "w") as f:
                f.write('#include <aneclient.h>\n#include <stdio.h>\n'
                        'int main(void) { char b[128]; puts(ane_default_socket(b, sizeof b));'
                        ' puts(ANE_VERSION); return 0; }\n')
            exe = os.path.join(tmp, "c")
            # A sanitized build's library needs the sanitizer's runtime at link time
            san = os.environ.get("SANITIZER", "")
            extra = ["-fsanitize=" + san] if san else []
            cc = subprocess.run(["cc", src, "-o", exe] + extra + flags.stdout.split(), capture_output=True,
                                text=True)
            check(cc.returncode == 0, "a program does not build against the installed library: "
                  + cc.stderr[-400:])
            if cc.returncode == 0:
                out = subprocess.run([exe], capture_output=True, text=True).stdout.split("\n")
                check(len(out) > 1 and out[0].endswith(".sock") and out[1] == "0.1.0",
                      "installed library's program printed %r" % out)
            sa = shutil.which("systemd-analyze")
            if not sa:
                print("systemd-analyze not found: unit verification skipped")
            else:
                units = pre + "/lib/systemd/system/"
                r = subprocess.run([sa, "verify", "--man=no", units + "aned.socket",
                                    units + "aned.service", units + "aned-http.service"],
                                   capture_output=True, text=True)
                check(r.returncode == 0 and not r.stderr.strip(),
                      "systemd-analyze verify: rc %d %s" % (r.returncode, r.stderr[-600:]))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("%d passed, %d failed" % (passed, failed))
    sys.exit(1 if failed else 0)


main()
