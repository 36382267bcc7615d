"""The few calls of containerd's Tasks service (containerd.services.tasks.v1, containerd 1.6's
api/services/tasks/v1/tasks.proto) that `ctr` cannot make alone, for tests/shim: Create without
Start (a task left CREATED) and Exec without Start (an exec left added), then Get, Start, Wait
and DeleteProcess, as containerd answers them.

No generated code: the handful of messages are written and read here with protobuf's wire format
(varints and length-delimited fields, field numbers from tasks.proto and types/task/task.proto),
and each call is grpc's generic unary call on Debian's python3-grpcio. Every call is bounded
(`deadline` seconds); a failed one raises TasksError with gRPC's code name and message.

    t = Tasks("/tmp/x/c.sock")
    t.create("c1")                      # -> pid (the shim's)
    t.get("c1")                         # -> {"pid": ..., "status": "CREATED", "exit_status": ...}
"""
import json

import grpc

BOUND = 60
STATUS = {0: "UNKNOWN", 1: "CREATED", 2: "RUNNING", 3: "STOPPED", 4: "PAUSED", 5: "PAUSING"}
PROCESS_SPEC = "types.containerd.io/opencontainers/runtime-spec/1/Process"


class TasksError(Exception):
    def __init__(self, method, code, details):
        super().__init__(f"{method}: {code.name}: {details}")
        self.method, self.code, self.details = method, code, details


def _varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def encode(fields):
    """[(number, value)]: str/bytes length-delimited, bool/int varint, dict a nested message (its
    own [(number, value)] under key "fields"). Empty and zero values are left out, as proto3 does."""
    out = bytearray()
    for num, v in fields:
        if isinstance(v, dict):
            body = encode(v["fields"])
            out += _varint(num << 3 | 2) + _varint(len(body)) + body
        elif isinstance(v, (str, bytes)):
            b = v.encode() if isinstance(v, str) else v
            if b:
                out += _varint(num << 3 | 2) + _varint(len(b)) + b
        elif v:
            out += _varint(num << 3) + _varint(int(v))
    return bytes(out)


def _read_varint(data, i):
    """(value, next index) of the varint at data[i]."""
    v, shift = 0, 0
    while True:
        b = data[i]
        i += 1
        v |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return v, i


def decode(data):
    """{number: value}: varints as int, length-delimited as bytes (the last of a repeated one)."""
    out, i = {}, 0
    while i < len(data):
        key, i = _read_varint(data, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            out[num], i = _read_varint(data, i)
        elif wt == 2:
            n, i = _read_varint(data, i)
            out[num] = data[i:i + n]
            i += n
        elif wt == 5:
            out[num] = data[i:i + 4]
            i += 4
        elif wt == 1:
            out[num] = data[i:i + 8]
            i += 8
        else:
            raise ValueError(f"wire type {wt} of field {num}")
    return out


class Tasks:
    """containerd's Tasks service on `sock` (its gRPC socket), namespace `ns`."""

    def __init__(self, sock, ns="default"):
        self.target = "unix://" + sock
        self.meta = (("containerd-namespace", ns),)

    def _call(self, method, fields, deadline=BOUND):
        # A channel per call: the tests restart containerd between calls, and a channel's stale
        # connection fails its next call (UNAVAILABLE) instead of dialling again.
        with grpc.insecure_channel(self.target) as channel:
            call = channel.unary_unary(f"/containerd.services.tasks.v1.Tasks/{method}",
                                       request_serializer=lambda b: b, response_deserializer=lambda b: b)
            try:
                return decode(call(encode(fields), timeout=deadline, metadata=self.meta))
            except grpc.RpcError as e:
                raise TasksError(method, e.code(), e.details()) from None

    def create(self, cid):
        """Create (no stdio, no rootfs mounts: a container made with `ctr container create
        --rootfs`): the task's pid."""
        return self._call("Create", [(1, cid)]).get(2, 0)

    def start(self, cid, exec_id=""):
        return self._call("Start", [(1, cid), (2, exec_id)]).get(1, 0)

    def get(self, cid, exec_id=""):
        p = decode(self._call("Get", [(1, cid), (2, exec_id)]).get(1, b""))
        return {"pid": p.get(3, 0), "status": STATUS.get(p.get(4, 0), "?"), "exit_status": p.get(9, 0)}

    def exec(self, cid, exec_id, args, stdout=""):
        """Exec (added, not started): `args` in the task's root as uid 0, cwd /."""
        spec = json.dumps({"args": args, "cwd": "/", "user": {"uid": 0, "gid": 0},
                           "env": ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"]})
        self._call("Exec", [(1, cid), (3, stdout), (6, {"fields": [(1, PROCESS_SPEC), (2, spec.encode())]}), (7, exec_id)])

    def wait(self, cid, exec_id="", deadline=BOUND):
        return self._call("Wait", [(1, cid), (2, exec_id)], deadline).get(1, 0)

    def delete_process(self, cid, exec_id):
        r = self._call("DeleteProcess", [(1, cid), (2, exec_id)])
        return {"pid": r.get(2, 0), "exit_status": r.get(3, 0), "exited_at": r.get(4, b"")}

    def close(self):
        pass
