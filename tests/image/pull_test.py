#!/usr/bin/env python3
"""`neshost pull`, `login` and `logout` against a real registry (tests/support/registry.py:
Debian's docker-registry on 127.0.0.1, TLS from a test CA, token auth through a test token server,
a TLS proxy in front that can fail, redirect and hold requests), with images built here from
real files and pushed with skopeo. Every bad input is a clear error naming the registry and the
reason, exit 125, and leaves the store's refs as they were with no unverified blob.

Synchronisation is on real events only: the proxy's `held` event (a blob half sent), neshost's
own progress lines. Every process is reaped, every temp dir removed (also /etc/docker/certs.d's
entry this test makes).
usage: pull_test.py NESHOST_BIN
"""
import base64
import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "host"))
sys.path.insert(0, os.path.join(HERE, "..", "support"))
from checks import check, finish, skip  # noqa: E402
import registry as R  # noqa: E402

NESHOST = sys.argv[1]
for tool in ("docker-registry", "skopeo", "openssl"):
    if shutil.which(tool) is None:
        skip("no " + tool)


def run(args, state, timeout=120, stdin=None):
    return subprocess.run([NESHOST] + args + ["--state", state], capture_output=True, text=True,
                          timeout=timeout, input=stdin)


def refs(state):
    """index.json's refs: {name: digest}."""
    p = os.path.join(state, ".images", "index.json")
    if not os.path.exists(p):
        return {}
    with open(p) as f:
        idx = json.load(f)
    return {m.get("annotations", {}).get("org.opencontainers.image.ref.name", ""): m["digest"]
            for m in idx.get("manifests", [])}


def blobs(state):
    """{digest: verified?} of every file in blobs/sha256."""
    d = os.path.join(state, ".images", "blobs", "sha256")
    out = {}
    if os.path.isdir(d):
        for name in os.listdir(d):
            with open(os.path.join(d, name), "rb") as f:
                out["sha256:" + name] = hashlib.sha256(f.read()).hexdigest() == name
    return out


def check_store_kept(state, before_refs, what, absent=()):
    """The store after a failed pull: the same refs, every blob verified, `absent` not there."""
    check(refs(state) == before_refs, "%s: refs unchanged (%r)" % (what, refs(state)))
    b = blobs(state)
    check(all(b.values()), "%s: every blob in the store verified" % what)
    for d in absent:
        check(d not in b, "%s: %s not in the store" % (what, d))


def failed(r, what, *words):
    """A failed command: exit 125, one error naming the registry and each of `words`."""
    check(r.returncode == 125, "%s: exit 125 (got %d: %s)" % (what, r.returncode, r.stderr.strip()))
    for w in words:
        check(w.lower() in r.stderr.lower(), "%s: stderr names %r: %s" % (what, w, r.stderr.strip()))


def image(tmp, name, files, layers=1, arch="amd64", layout=None):
    """A layout with one image of `layers` gzip layers from real files; returns (layout, desc,
    layer digests)."""
    lay = layout or R.Layout(os.path.join(tmp, "lay-" + name))
    ls = []
    for i in range(layers):
        root = R.tree(os.path.join(tmp, "src-%s-%s-%d" % (name, arch, i)),
                      {k.replace("N", str(i)): v for k, v in files.items()})
        ls.append(R.tar_layer(root))
    d = lay.image(ls, arch=arch)
    man = json.load(open(os.path.join(lay.d, "blobs", "sha256", d["digest"].split(":")[1])))
    return lay, d, [l["digest"] for l in man["layers"]], man["config"]["digest"]


def run_pull(tmp, reg, host, busybox):
    """`neshost run --pull`: missing (the default) pulls an absent IMAGE first, its progress on
    stderr and the workload's stdout its own; never refuses an absent one with the store kept;
    always pulls again (every blob already there). The registry's CA comes from certs.d."""
    lay, d, _, _ = image(tmp, "runme", {"bin/busybox": busybox, "etc/hello": b"hello from the image\n"})
    lay.tag(d, "v1")
    reg.push(lay.d, "v1", "runme:v1")
    ref = "%s/runme:v1" % host
    st = os.path.join(tmp, "s-run")
    argv = ["/bin/busybox", "cat", "/etc/hello"]

    def run(args, timeout=240):  # --state before IMAGE: what follows it is the workload's
        return subprocess.run([NESHOST, "run", "--state", st] + args, capture_output=True, text=True, timeout=timeout)
    r = run(["--rm", "--pull", "never", ref] + argv)
    failed(r, "run --pull never, absent", "not in the store")
    check_store_kept(st, {}, "run --pull never")
    r = run(["--rm", ref] + argv)
    check(r.returncode == 0 and r.stdout == "hello from the image\n",
          "run --pull missing: pulled, then ran (%r %s)" % (r.stdout, r.stderr[-1500:]))
    check("Unable to find image" in r.stderr and "Digest: " + d["digest"] in r.stderr,
          "run --pull missing: docker's lines on stderr (%s)" % r.stderr[-800:])
    check(refs(st).get(ref) == d["digest"], "run --pull missing: the ref is in the store")
    r = run(["--rm", "--pull", "always", ref] + argv)
    check(r.returncode == 0 and r.stdout == "hello from the image\n" and "Already exists" in r.stderr,
          "run --pull always: pulled again, every blob already there (%s)" % r.stderr[-800:])


def main():
    with R.TempDir() as tmp, R.Registry(tmp) as reg:
        host, ca = reg.host, reg.ca_dir
        tls = ["--cert-dir", ca]
        busybox = open("/bin/busybox", "rb").read() if os.path.exists("/bin/busybox") else os.urandom(9000)
        # app:v1: two layers of real files.
        lay, app, app_layers, app_config = image(tmp, "app", {"etc/N/hello": b"hello\n", "bin/tool-N": busybox}, 2)
        lay.tag(app, "v1")
        reg.push(lay.d, "v1", "app:v1")
        # multi:v1, an index: amd64 and arm64, different layers.
        mlay = R.Layout(os.path.join(tmp, "lay-multi"))
        _, m_amd, _, _ = image(tmp, "multi", {"arch": b"amd64\n"}, layout=mlay)
        _, m_arm, _, _ = image(tmp, "multi", {"arch": b"arm64\n"}, arch="arm64", layout=mlay)
        mlay.tag(mlay.index([m_amd, m_arm]), "v1")
        reg.push(mlay.d, "v1", "multi:v1", all_platforms=True)
        # private/app:v1: anonymous may not pull it.
        reg.push(lay.d, "v1", "private/app:v1")

        # --- pull by tag: anonymous token -------------------------------------------------
        st = os.path.join(tmp, "s1")
        r = run(["pull"] + tls + ["%s/app:v1" % host], st)
        check(r.returncode == 0, "pull by tag: exit 0 (%s)" % r.stderr)
        ref = "%s/app:v1" % host
        check(refs(st).get(ref) == app["digest"], "pull by tag: the ref names the manifest (%r)" % refs(st))
        b = blobs(st)
        for d in app_layers + [app_config, app["digest"]]:
            check(b.get(d) is True, "pull by tag: %s in the store, verified" % d)
        lines = r.stdout.splitlines()
        check(sum("Pull complete" in l for l in lines) == 3, "one line per blob (config + 2 layers): %r" % lines)
        check("Digest: " + app["digest"] in lines, "the Digest line")
        check(lines[-1] == ref, "the last line is the ref")
        check(any(u is None and s == ["repository:app:pull"] for u, s in reg.tokens.requests),
              "an anonymous token for repository:app:pull was asked for")
        sk = subprocess.run(["skopeo", "inspect", "--raw", "oci:%s/.images:%s" % (st, ref)], capture_output=True,
                            text=True, timeout=60)
        check(sk.returncode == 0 and app_config in sk.stdout, "skopeo reads the pulled image from the store")

        # Again: nothing downloaded, every blob "Already exists".
        r = run(["pull"] + tls + [ref], st)
        check(r.returncode == 0 and r.stdout.count("Already exists") == 3 and "Image is up to date" in r.stdout,
              "a second pull reuses every blob: %r" % r.stdout)

        # --- by digest, -q ------------------------------------------------------------------
        st2 = os.path.join(tmp, "s2")
        r = run(["pull", "-q"] + tls + ["%s/app@%s" % (host, app["digest"])], st2)
        check(r.returncode == 0 and r.stdout == app["digest"] + "\n", "pull -q by digest prints the digest: %r %r"
              % (r.stdout, r.stderr))
        check(refs(st2).get("%s/app@%s" % (host, app["digest"])) == app["digest"], "by digest: the ref")

        # --- a multi-arch index picks the platform -------------------------------------------
        st3 = os.path.join(tmp, "s3")
        r = run(["pull", "-q"] + tls + ["%s/multi:v1" % host], st3)
        check(r.returncode == 0 and refs(st3).get("%s/multi:v1" % host) == m_amd["digest"],
              "index: linux/amd64 by default (%s)" % r.stderr)
        r = run(["pull", "-q", "--platform", "linux/arm64"] + tls + ["%s/multi:v1" % host], st3)
        check(r.returncode == 0 and refs(st3).get("%s/multi:v1" % host) == m_arm["digest"],
              "index: --platform linux/arm64 (%s)" % r.stderr)
        before = refs(st3)
        r = run(["pull", "--platform", "linux/s390x"] + tls + ["%s/multi:v1" % host], st3)
        failed(r, "no manifest for the platform", host, "linux/s390x", "linux/amd64")
        check_store_kept(st3, before, "no manifest for the platform")

        # --- credentials: 401 after auth, login, credentialed token, logout -------------------
        st4 = os.path.join(tmp, "s4")
        r = run(["pull"] + tls + ["%s/private/app:v1" % host], st4)
        failed(r, "private repo anonymously", host, "401", "anonymously")
        check_store_kept(st4, {}, "private repo anonymously")
        r = run(["login", "-u", "alice", "--password-stdin"] + tls + [host], st4, stdin="wrong\n")
        failed(r, "login with a wrong password", host, "401", "credentials rejected")
        check(not os.path.exists(os.path.join(st4, ".auth", "config.json")), "a failed login stores nothing")
        r = run(["login", "-u", "alice", "--password-stdin"] + tls + [host], st4, stdin="alicepw\n")
        check(r.returncode == 0 and "Login Succeeded" in r.stdout, "login: %s %s" % (r.stdout, r.stderr))
        cfg = os.path.join(st4, ".auth", "config.json")
        check(stat.S_IMODE(os.stat(cfg).st_mode) == 0o600, "config.json is 0600")
        with open(cfg) as f:
            auths = json.load(f)["auths"]
        check(auths == {host: {"auth": base64.b64encode(b"alice:alicepw").decode()}},
              "config.json in docker's auths format: %r" % auths)
        n = len(reg.tokens.requests)
        r = run(["pull", "-q"] + tls + ["%s/private/app:v1" % host], st4)
        check(r.returncode == 0 and refs(st4).get("%s/private/app:v1" % host) == app["digest"],
              "pull with credentials (%s)" % r.stderr)
        check(any(u == "alice" for u, _ in reg.tokens.requests[n:]), "the token was asked for as alice")
        r = run(["logout", host], st4)
        check(r.returncode == 0, "logout")
        with open(cfg) as f:
            check(json.load(f)["auths"] == {}, "logout removes the entry")
        check(run(["logout", host], st4).returncode == 1, "logout again: exit 1 (not logged in)")

        # --- TLS: unknown CA, --cert-dir, --tls-verify=false, certs.d --------------------------
        st5 = os.path.join(tmp, "s5")
        r = run(["pull", "%s/app:v1" % host], st5)
        failed(r, "unknown CA", host, "certificate")
        check_store_kept(st5, {}, "unknown CA")
        r = run(["pull", "-q", "--tls-verify=false", "%s/app:v1" % host], st5)
        check(r.returncode == 0 and ref in refs(st5), "--tls-verify=false (%s)" % r.stderr)
        st6 = os.path.join(tmp, "s6")
        certs_d = "/etc/docker/certs.d"
        made_root = not os.path.exists(certs_d)
        mine = os.path.join(certs_d, host)  # this test's port alone: removed below, whatever happens
        if os.geteuid() == 0 and not os.path.exists(mine):
            try:
                os.makedirs(mine)
                shutil.copy(os.path.join(ca, "ca.crt"), mine)
                r = run(["pull", "-q", "%s/app:v1" % host], st6)
                check(r.returncode == 0 and ref in refs(st6), "the CA from /etc/docker/certs.d/HOST:PORT (%s)" % r.stderr)
                run_pull(tmp, reg, host, busybox)
            finally:
                shutil.rmtree(mine, ignore_errors=True)
                if made_root:
                    shutil.rmtree(certs_d, ignore_errors=True)

        # --- --tls-verify=false against a registry without TLS: plain HTTP, as docker's insecure
        tmp2 = os.path.join(tmp, "plain")
        os.makedirs(tmp2)
        with R.Registry(tmp2, tls=False) as plain:
            plain.push(lay.d, "v1", "app:v1")
            stp = os.path.join(tmp, "sp")
            r = run(["pull", "-q", "%s/app:v1" % plain.host], stp)
            failed(r, "plain HTTP with verification on", plain.host)
            r = run(["pull", "-q", "--tls-verify=false", "%s/app:v1" % plain.host], stp)
            check(r.returncode == 0 and refs(stp).get("%s/app:v1" % plain.host) == app["digest"],
                  "--tls-verify=false falls back to plain HTTP (%s)" % r.stderr)

        # --- 404, 5xx, refused ------------------------------------------------------------------
        before = refs(st)
        r = run(["pull"] + tls + ["%s/app:nope" % host], st)
        failed(r, "404", host, "404", "MANIFEST_UNKNOWN")
        check_store_kept(st, before, "404")
        px = reg.proxy
        px.fail["/manifests/"] = 503
        r = run(["pull"] + tls + ["%s/app:v1" % px.host], st)
        failed(r, "503 on the manifest", px.host, "503")
        px.fail.clear()
        px.fail["/blobs/" + app_layers[1]] = 500
        r = run(["pull"] + tls + ["%s/app:v1" % px.host], os.path.join(tmp, "s7"))
        failed(r, "500 on a blob", px.host, "500", app_layers[1])
        check_store_kept(os.path.join(tmp, "s7"), {}, "500 on a blob", absent=[app_layers[1]])
        px.fail.clear()
        dead = "127.0.0.1:%d" % R.free_port()
        r = run(["pull"] + tls + ["%s/app:v1" % dead], st)
        failed(r, "connection refused", dead, "connect")
        check_store_kept(st, before, "connection refused")

        # --- redirects: blobs served from another URL -----------------------------------------
        px.redirect_blobs = True
        st8 = os.path.join(tmp, "s8")
        r = run(["pull", "-q"] + tls + ["%s/app:v1" % px.host], st8)
        check(r.returncode == 0 and all(blobs(st8).get(d) for d in app_layers), "blobs through a 307 (%s)" % r.stderr)
        px.redirect_blobs = False

        # --- a registry that tampers: a blob's bytes changed (same size), a blob grown ----------
        tlay, tdesc, tlayers, _ = image(tmp, "tamper", {"t/N": os.urandom(4096)})
        tlay.tag(tdesc, "v1")
        reg.push(tlay.d, "v1", "tamper:v1")
        data = reg.blob_path(tlayers[0])
        orig = open(data, "rb").read()
        with open(data, "wb") as f:
            f.write(bytes([orig[0] ^ 0xff]) + orig[1:])
        st9 = os.path.join(tmp, "s9")
        r = run(["pull"] + tls + ["%s/tamper:v1" % host], st9)
        failed(r, "digest mismatch", host, tlayers[0], "digest")
        check_store_kept(st9, {}, "digest mismatch", absent=[tlayers[0]])
        with open(data, "wb") as f:
            f.write(orig + b"more")
        r = run(["pull"] + tls + ["%s/tamper:v1" % host], st9)
        failed(r, "size mismatch", host, tlayers[0], "size")
        check_store_kept(st9, {}, "size mismatch", absent=[tlayers[0]])
        with open(data, "wb") as f:
            f.write(orig)

        # --- ^C mid-pull, then a pull that reuses what completed ------------------------------
        blay, bdesc, blayers, bconfig = image(tmp, "big", {"small/N": b"small\n"}, 2)
        big = R.tree(os.path.join(tmp, "src-big"), {"big.bin": os.urandom(24 << 20)})
        blay2 = R.Layout(os.path.join(tmp, "lay-big2"))
        big_layer = R.tar_layer(big, compress=None)
        small = [R.tar_layer(os.path.join(tmp, "src-big-amd64-%d" % i)) for i in range(2)]
        bdesc = blay2.image(small + [big_layer])
        blay2.tag(bdesc, "v1")
        reg.push(blay2.d, "v1", "big:v1")
        big_digest = max(reg.manifest("big:v1")["layers"], key=lambda l: l["size"])["digest"]
        px.hold, px.hold_cut = big_digest, True
        px.held.clear()
        px.release.clear()
        st10 = os.path.join(tmp, "s10")
        p = subprocess.Popen([NESHOST, "pull"] + tls + ["%s/big:v1" % px.host, "--state", st10],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            complete = 0
            for line in p.stdout:  # config + 2 small layers complete, the big one held half-way
                complete += "Pull complete" in line
                if complete == 3:
                    break
            check(px.held.wait(60), "^C: the big layer is half sent")
            p.send_signal(signal.SIGINT)
            out, err = p.communicate(timeout=60)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
            px.release.set()
        check(p.returncode == 130 and "interrupted" in err, "^C: exit 130, 'interrupted' (%d %s)" % (p.returncode, err))
        check_store_kept(st10, {}, "^C", absent=[big_digest])
        ingest = os.path.join(st10, ".images", "ingest")
        check(not [f for f in os.listdir(ingest) if not f.endswith(".lock")] if os.path.isdir(ingest) else True,
              "^C: nothing left in ingest/ but lock files")
        px.hold = None
        gets_before = dict(px.gets)
        r = run(["pull"] + tls + ["%s/big:v1" % px.host], st10)
        check(r.returncode == 0 and r.stdout.count("Already exists") == 3, "after ^C: the 3 finished blobs reused: %r"
              % r.stdout)
        for path, n in px.gets.items():
            if "/blobs/" in path and big_digest not in path:
                check(n == gets_before.get(path), "after ^C: %s not downloaded again" % path)
        check(blobs(st10).get(big_digest) is True, "after ^C: the big layer complete and verified")

        # --- SIGKILL mid-layer: nothing to clean up (the ingest file is O_TMPFILE) -------------
        st12 = os.path.join(tmp, "s12")
        px.hold, px.hold_cut = big_digest, True
        px.held.clear()
        px.release.clear()
        p = subprocess.Popen([NESHOST, "pull", "-q"] + tls + ["%s/big:v1" % px.host, "--state", st12],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            check(px.held.wait(60), "SIGKILL: the big layer is half sent")
            p.kill()
            p.communicate(timeout=60)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
            px.release.set()
        check(p.returncode == -signal.SIGKILL, "SIGKILL: killed (%r)" % p.returncode)
        check_store_kept(st12, {}, "SIGKILL", absent=[big_digest])
        px.hold = None
        r = run(["pull", "-q"] + tls + ["%s/big:v1" % px.host], st12)
        check(r.returncode == 0 and blobs(st12).get(big_digest) is True, "after SIGKILL: a pull completes (%s)" % r.stderr)

        # --- a full disk mid-layer: STATE on a 8 MiB tmpfs in a private mount namespace -------
        if os.geteuid() == 0 and shutil.which("unshare"):
            st13 = os.path.join(tmp, "s13")
            os.makedirs(st13)
            script = ('mount -t tmpfs -o size=8m tmpfs "$1" || exit 99; "$2" pull -q --cert-dir "$3" --state "$1" "$4"; '
                      'echo "rc=$?"; echo "refs=$(cat "$1/.images/index.json" 2>/dev/null | tr -d "\\n")"; '
                      'cd "$1/.images/blobs/sha256" && for f in *; do [ -f "$f" ] && echo "blob=$f $(sha256sum < "$f")"; done; '
                      'echo "ingest=$(ls "$1/.images/ingest" 2>/dev/null | grep -v "[.]lock$" | tr "\\n" " ")"')
            r = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", st13, NESHOST,
                                ca, "%s/big:v1" % host], capture_output=True, text=True, timeout=120)
            out = dict(l.split("=", 1) for l in r.stdout.splitlines() if "=" in l and l.split("=", 1)[0] in ("rc", "refs"))
            check(out.get("rc") == "125", "full disk: exit 125 (%r %s)" % (out, r.stderr))
            check("no space left" in r.stderr.lower() and host in r.stderr, "full disk: says so, naming the registry: %s"
                  % r.stderr.strip())
            named = json.loads(out["refs"]).get("manifests", []) if out.get("refs") else []
            check(named == [], "full disk: no ref (%r)" % out.get("refs"))
            bl = [l[5:].split() for l in r.stdout.splitlines() if l.startswith("blob=")]
            check(all(b[0] == b[1] for b in bl) and big_digest[7:] not in [b[0] for b in bl],
                  "full disk: every blob verified, the big one absent (%r)" % bl)
            left = [l[7:].strip() for l in r.stdout.splitlines() if l.startswith("ingest=")]
            check(left == [""], "full disk: nothing left in ingest/ but lock files (%r)" % left)

        # --- two pulls sharing a layer at once: it is downloaded once ------------------------
        st11 = os.path.join(tmp, "s11")
        px.hold, px.hold_cut = big_digest, False
        px.held.clear()
        px.release.clear()
        n_big = sum(n for path, n in px.gets.items() if big_digest in path)
        blay2.tag(blay2.image([big_layer]), "other")
        reg.push(blay2.d, "other", "big:other")
        a = subprocess.Popen([NESHOST, "pull"] + tls + ["%s/big:v1" % px.host, "--state", st11],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        b = None
        try:
            check(px.held.wait(60), "shared: the first pull holds the big layer")
            b = subprocess.Popen([NESHOST, "pull"] + tls + ["%s/big:other" % px.host, "--state", st11],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for line in b.stdout:
                if "Waiting" in line:
                    break
            px.release.set()
            out_b, err_b = b.communicate(timeout=120)
            out_a, err_a = a.communicate(timeout=120)
        finally:
            px.release.set()
            for q in (a, b):
                if q and q.poll() is None:
                    q.kill()
                    q.wait()
        check(a.returncode == 0 and b.returncode == 0, "shared: both pulls succeed (%s / %s)" % (err_a, err_b))
        check(sum(n for path, n in px.gets.items() if big_digest in path) == n_big + 1,
              "shared: the big layer was downloaded once")
        check({"%s/big:v1" % px.host, "%s/big:other" % px.host} <= set(refs(st11)), "shared: both refs")
        px.hold = None

        # --- usage errors: exit 125----------------------------------------------------------------
        check(run(["pull", "Bad//Ref"], st).returncode == 125, "a reference that does not parse: exit 125")
        check(run(["pull", "--tls-verify=maybe", ref], st).returncode == 125, "--tls-verify=maybe: exit 125")
        check(run(["pull"], st).returncode == 125, "no reference: exit 125")
    finish()


main()
