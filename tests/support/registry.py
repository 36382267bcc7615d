"""A private container registry for tests and benches, on 127.0.0.1 only: Debian's
`docker-registry serve CONFIG.yml` (the CNCF distribution registry 2.8) with TLS from a test-made CA
and token auth (`auth: token`) through a token server of a few dozen lines here, plus a TLS proxy
in front of it that can fail, count, redirect and hold requests (tests of 5xx, redirects and ^C).
Images are built here from real files and pushed with skopeo. Nothing leaves this machine.

    with Registry(tmp) as reg:
        reg.push(layout_dir, "app:1", "docker://...")   # see push()
        reg.host            # "127.0.0.1:PORT"
        reg.ca_dir          # a directory holding ca.crt (for --cert-dir, skopeo's --*-cert-dir)

Users: pusher/pushpw may push and pull everything; alice/alicepw may pull everything; anonymous
may pull every repository except those under private/. A token server request with wrong
credentials is answered 401. Every process is reaped and the temp dir removed on close()."""
import base64
import gzip
import hashlib
import http.client
import http.server
import io
import json
import os
import shutil
import socket
import ssl
import subprocess
import tarfile
import tempfile
import threading
import time
import urllib.parse

USERS = {"pusher": "pushpw", "alice": "alicepw"}
SERVICE = "nes-test-registry"
ISSUER = "nes-test-issuer"


def free_port():
    """A port nothing listens on right now (bound, read, closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_ca(d, name="nes test CA"):
    """A CA (ca.key, ca.crt) in d; returns ca.crt's path."""
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
             "-days", "2", "-subj", "/CN=" + name, cwd=d)
    return os.path.join(d, "ca.crt")


def make_server_cert(d, ca_dir, stem="server"):
    """stem.key/stem.crt in d for 127.0.0.1 (subjectAltName IP), signed by ca_dir's CA."""
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", stem + ".key", "-out", stem + ".csr",
             "-subj", "/CN=127.0.0.1", cwd=d)
    ext = os.path.join(d, stem + ".ext")
    with open(ext, "w") as f:
        f.write("subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    _openssl("x509", "-req", "-in", stem + ".csr", "-CA", os.path.join(ca_dir, "ca.crt"),
             "-CAkey", os.path.join(ca_dir, "ca.key"), "-CAcreateserial", "-out", stem + ".crt",
             "-days", "2", "-extfile", ext, cwd=d)
    return os.path.join(d, stem + ".crt"), os.path.join(d, stem + ".key")


def _b64url(b):
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


class TokenSigner:
    """Signs the registry's bearer tokens: RS256 JWTs with the signing certificate in `x5c` (the
    registry trusts it through `rootcertbundle`)."""

    def __init__(self, d):
        self.d = d
        _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "sign.key", "-out", "sign.crt",
                 "-days", "2", "-subj", "/CN=nes token signer", cwd=d)
        der = subprocess.run(["openssl", "x509", "-in", "sign.crt", "-outform", "DER"], cwd=d, check=True,
                             capture_output=True, timeout=60).stdout
        self.x5c = base64.b64encode(der).decode()
        self.cert = os.path.join(d, "sign.crt")

    def token(self, sub, access):
        now = int(time.time())
        header = {"typ": "JWT", "alg": "RS256", "x5c": [self.x5c]}
        claims = {"iss": ISSUER, "sub": sub, "aud": SERVICE, "exp": now + 300, "nbf": now - 10,
                  "iat": now, "jti": os.urandom(8).hex(), "access": access}
        signing_input = _b64url(json.dumps(header).encode()) + "." + _b64url(json.dumps(claims).encode())
        sig = subprocess.run(["openssl", "dgst", "-sha256", "-sign", os.path.join(self.d, "sign.key")],
                             input=signing_input.encode(), capture_output=True, check=True, timeout=60).stdout
        return signing_input + "." + _b64url(sig)


def _grant(user, repo, actions):
    """The token server's policy (see the module's doc)."""
    if user == "pusher":
        return [a for a in actions if a in ("pull", "push")]
    if user is None and repo.startswith("private/"):
        return []
    return [a for a in actions if a == "pull"]


class _ThreadingServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request, client_address):
        import sys
        if isinstance(sys.exc_info()[1], OSError):
            return  # a client that went away mid-answer (a cut transfer, ^C): expected in these tests
        super().handle_error(request, client_address)


def _tls_server(handler, cert, key):
    srv = _ThreadingServer(("127.0.0.1", 0), handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    return srv, t


class TokenServer:
    """GET /token?service=S&scope=repository:NAME:ACTIONS[&scope=...] (Basic credentials optional)
    -> {"token", "access_token"}; wrong credentials -> 401. `requests` lists (user, scopes)."""

    def __init__(self, signer, cert, key):
        self.requests = []
        outer = self

        class H(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                u = urllib.parse.urlparse(self.path)
                q = urllib.parse.parse_qs(u.query)
                user = None
                auth = self.headers.get("Authorization", "")
                if auth.startswith("Basic "):
                    try:
                        user, _, pw = base64.b64decode(auth[6:]).decode().partition(":")
                    except Exception:
                        user, pw = "", None
                    if USERS.get(user) != pw:
                        self.send_response(401)
                        self.send_header("Content-Type", "application/json")
                        body = b'{"details":"incorrect username or password"}'
                        self.send_header("Content-Length", str(len(body)))
                        self.end_headers()
                        self.wfile.write(body)
                        return
                access = []
                for scope in q.get("scope", []):
                    parts = scope.split(":")
                    if len(parts) == 3 and parts[0] == "repository":
                        acts = _grant(user, parts[1], parts[2].split(","))
                        if acts:
                            access.append({"type": "repository", "name": parts[1], "actions": acts})
                outer.requests.append((user, q.get("scope", [])))
                tok = signer.token(user or "", access)
                body = json.dumps({"token": tok, "access_token": tok, "expires_in": 300}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.srv, self.thread = _tls_server(H, cert, key)
        self.port = self.srv.server_address[1]

    def close(self):
        self.srv.shutdown()
        self.srv.server_close()
        self.thread.join(10)


class Proxy:
    """A TLS proxy in front of the registry (same CA): forwards GET/HEAD with their headers and
    answers as the registry does, unless told otherwise:
      fail[substr] = status      answer `status` to requests whose path contains substr
      redirect_blobs = True      answer blob GETs with 307 to /direct/<path> here, served as usual
      hold = digest              serve that blob's first half, then set `held`, wait for
                                 `release`, and cut the connection (hold_cut, the default) or
                                 send the rest
    `gets` counts the GETs per path (redirect hops not counted twice)."""

    def __init__(self, upstream_port, ca_file, cert, key):
        self.fail = {}
        self.redirect_blobs = False
        self.hold = None
        self.hold_cut = True
        self.held = threading.Event()
        self.release = threading.Event()
        self.gets = {}
        self.lock = threading.Lock()
        outer = self
        upctx = ssl.create_default_context(cafile=ca_file)

        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _answer(self, head):
                path = self.path
                direct = path.startswith("/direct/")
                if direct:
                    path = path[len("/direct"):]
                for sub, status in list(outer.fail.items()):
                    if sub in path:
                        body = b'{"errors":[{"code":"UNAVAILABLE","message":"test proxy says no"}]}'
                        self.send_response(status)
                        self.send_header("Content-Length", str(len(body)))
                        self.send_header("Content-Type", "application/json")
                        self.end_headers()
                        if not head:
                            self.wfile.write(body)
                        return
                if not head and not direct:
                    with outer.lock:
                        outer.gets[path] = outer.gets.get(path, 0) + 1
                if outer.redirect_blobs and not direct and not head and "/blobs/" in path:
                    self.send_response(307)
                    self.send_header("Location", "/direct" + path)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                conn = http.client.HTTPSConnection("127.0.0.1", upstream_port, context=upctx, timeout=60)
                conn.putrequest("HEAD" if head else "GET", path, skip_accept_encoding=True)
                for k, v in self.headers.items():  # each one: a client sends several Accept lines
                    if k.lower() not in ("host", "connection"):
                        conn.putheader(k, v)
                conn.endheaders()
                r = conn.getresponse()
                data = b"" if head else r.read()
                self.send_response(r.status)
                for k, v in r.getheaders():
                    if k.lower() in ("connection", "transfer-encoding", "content-length"):
                        continue
                    self.send_header(k, v)
                length = r.getheader("Content-Length") if head else str(len(data))
                if length is not None:
                    self.send_header("Content-Length", length)
                self.end_headers()
                conn.close()
                if head:
                    return
                if outer.hold and outer.hold in path and r.status == 200:
                    half = len(data) // 2
                    self.wfile.write(data[:half])
                    self.wfile.flush()
                    outer.held.set()
                    outer.release.wait(120)
                    if not outer.hold_cut:
                        self.wfile.write(data[half:])
                        return
                    self.close_connection = True
                    try:
                        self.connection.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                    return
                self.wfile.write(data)

            def do_GET(self):
                self._answer(False)

            def do_HEAD(self):
                self._answer(True)

        self.srv, self.thread = _tls_server(H, cert, key)
        self.port = self.srv.server_address[1]
        self.host = "127.0.0.1:%d" % self.port

    def close(self):
        self.release.set()
        self.srv.shutdown()
        self.srv.server_close()
        self.thread.join(10)


class Registry:
    """The registry, its token server and a proxy, in temp dir `tmp` (see the module's doc)."""

    def __init__(self, tmp, tls=True):
        """`tls`=False: the registry speaks plain HTTP (its token server and proxy keep TLS)."""
        self.tmp = tmp
        self.tls = tls
        self.proc = None
        self.tokens = None
        self.proxy = None
        ca_private = os.path.join(tmp, "ca-private")
        os.makedirs(ca_private)
        make_ca(ca_private)
        self.ca_dir = os.path.join(tmp, "ca")  # ca.crt alone: skopeo reads a *.key there as a client key
        os.makedirs(self.ca_dir)
        shutil.copy(os.path.join(ca_private, "ca.crt"), self.ca_dir)
        self.cert, self.key = make_server_cert(tmp, ca_private)
        self.signer = TokenSigner(tmp)
        self.storage = os.path.join(tmp, "storage")
        self.port = free_port()
        self.host = "127.0.0.1:%d" % self.port

    def __enter__(self):
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *a):
        self.close()

    def start(self):
        self.tokens = TokenServer(self.signer, self.cert, self.key)
        conf = os.path.join(self.tmp, "config.yml")
        tls = "  tls:\n    certificate: %s\n    key: %s\n" % (self.cert, self.key) if self.tls else ""
        with open(conf, "w") as f:
            f.write(f"""version: 0.1
log:
  level: info
  formatter: text
storage:
  filesystem:
    rootdirectory: {self.storage}
  delete:
    enabled: true
  maintenance:
    uploadpurging:
      enabled: false
http:
  addr: 127.0.0.1:{self.port}
{tls}auth:
  token:
    realm: https://127.0.0.1:{self.tokens.port}/token
    service: {SERVICE}
    issuer: {ISSUER}
    rootcertbundle: {self.signer.cert}
""")
        self.log = open(os.path.join(self.tmp, "registry.log"), "w+")
        self.proc = subprocess.Popen(["docker-registry", "serve", conf], stdin=subprocess.DEVNULL,
                                     stdout=self.log, stderr=subprocess.PIPE, text=True)
        # Ready when it says so on stderr ("listening on 127.0.0.1:PORT"); the rest goes to the log.
        for line in self.proc.stderr:
            self.log.write(line)
            if "listening on" in line:
                break
        else:
            raise RuntimeError("docker-registry exited: see " + self.log.name)
        self._drain = threading.Thread(target=self._copy_stderr, daemon=True)
        self._drain.start()
        if self.tls:
            self.proxy = Proxy(self.port, os.path.join(self.ca_dir, "ca.crt"), self.cert, self.key)

    def _copy_stderr(self):
        for line in self.proc.stderr:
            self.log.write(line)

    def close(self):
        if self.proxy:
            self.proxy.close()
            self.proxy = None
        if self.proc:
            if self.proc.poll() is None:
                self.proc.terminate()
                try:
                    self.proc.wait(20)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
            self.proc = None
        if self.tokens:
            self.tokens.close()
            self.tokens = None

    def blob_path(self, digest):
        """The registry's own file for a blob (a test corrupts it to make a tampering registry)."""
        h = digest.split(":", 1)[1]
        return os.path.join(self.storage, "docker/registry/v2/blobs/sha256", h[:2], h, "data")

    def manifest(self, repo_tag):
        """The manifest the registry serves for REPO:TAG (parsed JSON), read with skopeo. skopeo
        compresses an uncompressed layer as it pushes it, so a layer's digest is read here."""
        r = subprocess.run(["skopeo", "inspect", "--raw", "--cert-dir", self.ca_dir,
                            "docker://%s/%s" % (self.host, repo_tag)], capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise RuntimeError("skopeo inspect failed: " + r.stderr[-2000:])
        return json.loads(r.stdout)

    def push(self, layout, ref, repo_tag, all_platforms=False, host=None):
        """skopeo copy oci:LAYOUT:REF -> docker://HOST/REPO_TAG as pusher (through our CA)."""
        cmd = ["skopeo", "copy", "--quiet", "--dest-cert-dir", self.ca_dir, "--dest-creds", "pusher:pushpw"]
        if not self.tls:
            cmd.append("--dest-tls-verify=false")
        if all_platforms:
            cmd.append("--all")
        cmd += ["oci:%s:%s" % (layout, ref), "docker://%s/%s" % (host or self.host, repo_tag)]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            raise RuntimeError("skopeo copy failed: " + r.stderr[-2000:] + "\nregistry log: " + open(self.log.name).read()[-2000:])


# --- images from real files -------------------------------------------------------------------

def tar_layer(root, compress="gzip"):
    """The tree `root` as a layer: (blob bytes, media type, diff_id)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as t:
        for name in sorted(os.listdir(root)):
            t.add(os.path.join(root, name), arcname=name)
    data = raw.getvalue()
    diff_id = "sha256:" + hashlib.sha256(data).hexdigest()
    if compress == "gzip":
        return gzip.compress(data, compresslevel=1, mtime=0), "application/vnd.oci.image.layer.v1.tar+gzip", diff_id
    return data, "application/vnd.oci.image.layer.v1.tar", diff_id


class Layout:
    """An OCI image layout written from Python (what skopeo reads as oci:DIR:REF)."""

    def __init__(self, d):
        self.d = d
        os.makedirs(os.path.join(d, "blobs", "sha256"), exist_ok=True)
        with open(os.path.join(d, "oci-layout"), "w") as f:
            f.write('{"imageLayoutVersion":"1.0.0"}')
        self.refs = []

    def blob(self, data, media_type):
        h = hashlib.sha256(data).hexdigest()
        with open(os.path.join(self.d, "blobs", "sha256", h), "wb") as f:
            f.write(data)
        return {"mediaType": media_type, "digest": "sha256:" + h, "size": len(data)}

    def image(self, layers, arch="amd64", cmd=("/bin/sh",)):
        """A manifest over `layers` (tar_layer() results); returns its descriptor with platform."""
        config = {"architecture": arch, "os": "linux", "config": {"Cmd": list(cmd), "Env": ["PATH=/bin"]},
                  "rootfs": {"type": "layers", "diff_ids": [l[2] for l in layers]}}
        cdesc = self.blob(json.dumps(config).encode(), "application/vnd.oci.image.config.v1+json")
        ldescs = [self.blob(l[0], l[1]) for l in layers]
        man = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
               "config": cdesc, "layers": ldescs}
        d = self.blob(json.dumps(man).encode(), "application/vnd.oci.image.manifest.v1+json")
        d["platform"] = {"architecture": arch, "os": "linux"}
        return d

    def index(self, manifests):
        idx = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
               "manifests": manifests}
        return self.blob(json.dumps(idx).encode(), "application/vnd.oci.image.index.v1+json")

    def tag(self, desc, ref):
        d = {k: v for k, v in desc.items() if k != "platform"}
        d["annotations"] = {"org.opencontainers.image.ref.name": ref}
        self.refs.append(d)
        with open(os.path.join(self.d, "index.json"), "w") as f:
            json.dump({"schemaVersion": 2, "manifests": self.refs}, f)


def tree(root, files):
    """Writes {relative path: bytes} under root (a path under bin/ executable, 0755); returns root."""
    for rel, data in files.items():
        p = os.path.join(root, rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            f.write(data)
        if rel.startswith("bin/"):
            os.chmod(p, 0o755)
    return root


class TempDir:
    """A temp dir removed on exit, whatever happened."""

    def __init__(self, prefix="nes-reg-"):
        self.path = tempfile.mkdtemp(prefix=prefix)

    def __enter__(self):
        return self.path

    def __exit__(self, *a):
        shutil.rmtree(self.path, ignore_errors=True)
