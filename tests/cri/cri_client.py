"""A Kubernetes CRI client of our own (runtime.v1 over gRPC), for tests/cri and bench P11: what
critest and crictl do, without either (Debian packages neither).

The messages come from api_pb2, generated at build time from Debian 13's cri-api `api.proto`
(tests/cri/gen-stubs.sh; the directory holding it is CRI_STUBS_DIR, or the `stubs` argument). The
calls are grpc's generic unary calls, each method's request and response types taken from the
proto's own service descriptor, so no grpc code generator is needed (python3-grpcio alone).

    c = Cri("/tmp/x/c.sock")
    pod = c.RunPodSandbox(config=c.pb.PodSandboxConfig(...), runtime_handler="runc").pod_sandbox_id

Every call is bounded (`deadline` seconds, default BOUND); a failed call raises CriError naming
the method and carrying gRPC's status code and message.
"""
import importlib
import os
import sys

import grpc

BOUND = 120  # seconds: the most any one call may take unless the caller says otherwise


class CriError(Exception):
    """A CRI call that failed: `method` (e.g. "RuntimeService/CreateContainer"), `code` (a
    grpc.StatusCode) and `details` (the server's message)."""

    def __init__(self, method, code, details):
        super().__init__(f"{method}: {code.name}: {details}")
        self.method, self.code, self.details = method, code, details


def load_stubs(stubs=None):
    """The generated api_pb2 module, from `stubs` (a directory) or $CRI_STUBS_DIR."""
    d = stubs or os.environ.get("CRI_STUBS_DIR")
    if not d or not os.path.isfile(os.path.join(d, "api_pb2.py")):
        raise RuntimeError(f"no api_pb2.py in {d!r} (CRI_STUBS_DIR: built by tests/cri/gen-stubs.sh)")
    if d not in sys.path:
        sys.path.insert(0, d)
    return importlib.import_module("api_pb2")


class Cri:
    """One gRPC channel to a CRI endpoint (`sock`: a Unix socket path). Every method of
    runtime.v1.RuntimeService and runtime.v1.ImageService is an attribute taking the request's
    fields as keywords (or `request=` a built message) and `deadline=` seconds (the gRPC call's
    bound: not `timeout`, which is a field of StopContainer and ExecSync); it returns the
    response message. `pb` is the api_pb2 module, for building nested messages."""

    SERVICES = ("RuntimeService", "ImageService")

    def __init__(self, sock, stubs=None):
        self.pb = load_stubs(stubs)
        self.channel = grpc.insecure_channel("unix://" + os.path.abspath(sock))
        self._methods = {}
        for svc in self.SERVICES:
            for m in self.pb.DESCRIPTOR.services_by_name[svc].methods:
                if m.name in self._methods:
                    raise RuntimeError(f"CRI method {m.name} in two services")
                self._methods[m.name] = (svc, getattr(self.pb, m.input_type.name),
                                         getattr(self.pb, m.output_type.name))

    def __getattr__(self, name):
        if name.startswith("_") or name not in self._methods:
            raise AttributeError(name)
        svc, req_t, resp_t = self._methods[name]
        path = f"/runtime.v1.{svc}/{name}"
        call = self.channel.unary_unary(path, request_serializer=req_t.SerializeToString,
                                        response_deserializer=resp_t.FromString)

        def invoke(request=None, deadline=BOUND, **fields):
            req = request if request is not None else req_t(**fields)
            try:
                return call(req, timeout=deadline)
            except grpc.RpcError as e:
                raise CriError(f"{svc}/{name}", e.code(), e.details()) from None

        invoke.__name__ = name
        return invoke

    def close(self):
        self.channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def parse_cri_log(text):
    """The CRI log format (what the kubelet reads at a container's log_path): one record a line,
    `TIMESTAMP STREAM TAG CONTENT`, TIMESTAMP RFC 3339 with nanoseconds, STREAM stdout|stderr, TAG
    F (the line's end) or P (a part of a longer line). Returns [(stream, whole line)] with the P
    parts joined to their F; raises ValueError naming the first malformed record."""
    out, partial = [], {}
    for n, rec in enumerate(text.split("\n")):
        if rec == "" and n == len(text.split("\n")) - 1:
            break  # the final newline
        parts = rec.split(" ", 3)
        if len(parts) < 3 or parts[1] not in ("stdout", "stderr") or parts[2] not in ("F", "P"):
            raise ValueError(f"CRI log record {n + 1} malformed: {rec!r}")
        ts, stream, tag = parts[:3]
        content = parts[3] if len(parts) == 4 else ""
        if len(ts) < 20 or ts[4] != "-" or ts[10] != "T" or not (ts.endswith("Z") or "+" in ts[19:] or "-" in ts[19:]):
            raise ValueError(f"CRI log record {n + 1}: timestamp {ts!r} is not RFC 3339")
        partial[stream] = partial.get(stream, "") + content
        if tag == "F":
            out.append((stream, partial.pop(stream)))
    return out
