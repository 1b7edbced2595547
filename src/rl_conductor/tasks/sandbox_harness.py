"""The code that runs inside the sandbox: a candidate server, a test runner, and their wire format.

This file is copied into each sandbox (it is never imported there as part of ``rl_conductor``,
which is not reachable inside) and must use the standard library only. It has three roles,
chosen by its first argument:

``serve`` (candidate sandbox)
    Sets the resource limits, loads ``/sbx/solution.py`` as a module named ``solution`` (not
    ``__main__``: demo code under ``if __name__ == "__main__"`` does not run), then answers call
    requests: ``call name args kwargs`` → the function's result encoded as plain data. The
    candidate can tamper with everything in this process; that is fine, because nothing here
    decides anything.

``runner`` (runner sandbox, a different sandbox with its own PID namespace, reused across jobs)
    Runs the task's own tests (trusted dataset code). Every name the tests take from the
    candidate is a :class:`Remote` stub whose calls go over a pipe to the candidate sandbox and
    whose results come back as plain data, decoded by :func:`decode` into builtins only. The runner
    sends its verdict on a socket that only the grader holds. An early exit,
    a killed server, an object with a forged ``__eq__`` or a table read from the tests cannot
    produce a pass: the candidate never sees the tests nor the expected values, and only values
    of builtin types reach the comparisons.

``run`` (plain sandboxed program)
    Sets the limits and runs ``/sbx/solution.py`` as ``__main__``; the exit status is the
    program's, and it is not a grading verdict.

Wire format: each message is a 4-byte big-endian length followed by UTF-8 JSON. Values are
encoded by :func:`encode`: ``None``, ``bool``, ``int`` (up to 64 bits; larger ones tagged),
``float`` and ``str`` as JSON scalars; everything else as a ``[tag, payload]`` pair (``list``,
``tuple``, ``set``, ``frozenset``, ``dict``, ``bytes``, ``bytearray``, ``complex``, ``range``,
``Decimal``, ``Fraction``, ``iter`` for a materialised iterator, ``ref`` for an opaque handle to
an object that stays in the candidate's process). Only exact builtin types are encoded as data,
so an ``int`` subclass with a custom ``__eq__`` travels as an opaque ``ref``, which equals
nothing but itself.
"""

from __future__ import annotations

import os
import struct
import sys

# Start-up time is paid twice per grading, so this file imports as little as it can: no typing
# (annotations are strings), and json's C accelerator directly (``json`` itself imports ``re``).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

#: Largest message either side accepts (bytes of JSON).
MAX_MESSAGE = 16 * 1024 * 1024
#: Most values (containers and scalars) one encoded message may hold.
MAX_NODES = 1_000_000
#: Deepest nesting of containers.
MAX_DEPTH = 200
#: Items materialised from an iterator a candidate returns.
MAX_ITER_ITEMS = 100_000
_BIG = 1 << 63


class ProtocolError(Exception):
    """A message that is not valid wire format (too large, truncated, bad tags)."""


class CandidateError(Exception):
    """The candidate raised, crashed, exited or answered with something that is not a value."""


# --------------------------------------------------------------------------- framing


class _JsonContext:
    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int

    @staticmethod
    def parse_constant(name: str) -> float:
        return float(name)


_scanner: Any = None
_encoder: Any = None


def dumps(obj: Any) -> str:
    """Compact JSON (NaN and infinities allowed), by json's C encoder when available."""
    global _encoder
    if _encoder is None:
        try:
            import _json

            def no_default(o: Any) -> Any:
                raise TypeError(f"not JSON data: {type(o).__name__}")

            c = _json.make_encoder(
                None, no_default, _json.encode_basestring_ascii, None, ":", ",", False, False, True
            )
            _encoder = lambda o: "".join(c(o, 0))  # noqa: E731
        except (ImportError, AttributeError):  # pragma: no cover - CPython always has _json
            import json

            _encoder = lambda o: json.dumps(o, separators=(",", ":"))  # noqa: E731
    return str(_encoder(obj))


def loads(text: str) -> Any:
    """Parse one JSON document (json's C scanner when available); ValueError when malformed."""
    global _scanner
    if _scanner is None:
        try:
            import _json

            scan = _json.make_scanner(_JsonContext())  # type: ignore[arg-type]

            def _scan(t: str) -> Any:
                try:
                    obj, end = scan(t, 0)
                except StopIteration:
                    raise ValueError("not JSON") from None
                if t[end:].strip():
                    raise ValueError("extra data after JSON")
                return obj

            _scanner = _scan
        except (ImportError, AttributeError):  # pragma: no cover
            import json

            _scanner = json.loads
    return _scanner(text)


def send(fd: int, obj: Any) -> None:
    """Write one framed JSON message to ``fd``."""
    data = dumps(obj).encode("utf-8", "surrogatepass")
    if len(data) > MAX_MESSAGE:
        raise ProtocolError(f"message of {len(data)} bytes exceeds {MAX_MESSAGE}")
    buf = memoryview(struct.pack(">I", len(data)) + data)
    while buf:
        n = os.write(fd, buf)
        buf = buf[n:]


def _read_exact(fd: int, n: int) -> bytes:
    parts = []
    while n:
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            raise CandidateError("the other side closed the channel")
        parts.append(chunk)
        n -= len(chunk)
    return b"".join(parts)


def recv(fd: int) -> Any:
    """Read one framed JSON message from ``fd``."""
    (size,) = struct.unpack(">I", _read_exact(fd, 4))
    if size > MAX_MESSAGE:
        raise ProtocolError(f"message of {size} bytes exceeds {MAX_MESSAGE}")
    try:
        return loads(_read_exact(fd, size).decode("utf-8", "surrogatepass"))
    except (ValueError, RecursionError) as e:
        raise ProtocolError(f"undecodable message: {e}") from None


# --------------------------------------------------------------------------- values


class Remote:
    """An object that lives in the candidate's process; equal only to itself."""

    __slots__ = ("_channel", "_rid", "_type_name")

    def __init__(self, rid: int, type_name: str, channel: Any = None) -> None:
        self._rid = rid
        self._type_name = type_name
        self._channel = channel

    def __repr__(self) -> str:
        return f"<remote {self._type_name} #{self._rid}>"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._channel is None:
            raise CandidateError(f"{self!r} is not callable here")
        return self._channel.call(["ref", self._rid], args, kwargs)


class _Encoder:
    def __init__(self, refs: dict[int, Any] | None) -> None:
        self.refs = refs  # None: unknown types are an error (runner side)
        self.nodes = 0

    def __call__(self, x: Any, depth: int = 0) -> Any:
        self.nodes += 1
        if self.nodes > MAX_NODES or depth > MAX_DEPTH:
            raise ProtocolError("value too large or too deeply nested")
        t = type(x)
        if x is None or t is bool or t is str or t is float:
            return x
        if t is int:
            return x if -_BIG < x < _BIG else ["int", format(x, "x")]
        if t is list or t is tuple or t is set or t is frozenset:
            return [t.__name__, [self(i, depth + 1) for i in x]]
        if t is dict:
            return ["dict", [[self(k, depth + 1), self(v, depth + 1)] for k, v in x.items()]]
        if t is bytes or t is bytearray:
            return [t.__name__, x.hex()]
        if t is complex:
            return ["complex", [x.real, x.imag]]
        if t is range:
            return ["range", [self(x.start), self(x.stop), self(x.step)]]
        if t is Remote:
            return ["ref", x._rid]
        mod, name = getattr(t, "__module__", ""), getattr(t, "__qualname__", "")
        if mod == "collections" and name in ("Counter", "OrderedDict", "defaultdict"):
            return ["dict", [[self(k, depth + 1), self(v, depth + 1)] for k, v in x.items()]]
        if mod == "decimal" and name == "Decimal":
            return ["Decimal", str(x)]
        if mod == "fractions" and name == "Fraction":
            return ["Fraction", [self(x.numerator), self(x.denominator)]]
        if self.refs is None:
            raise ProtocolError(f"cannot send a value of type {name or t!r}")
        if hasattr(t, "__next__") and hasattr(t, "__iter__"):
            items: list[Any] = []
            for item in x:
                if len(items) >= MAX_ITER_ITEMS:
                    raise ProtocolError("iterator too long")
                items.append(self(item, depth + 1))
            return ["iter", items]
        rid = id(x)
        self.refs[rid] = x
        return ["ref", rid, f"{mod}.{name}"]


def encode(x: Any, refs: dict[int, Any] | None = None) -> Any:
    """``x`` as JSON-ready plain data; with ``refs``, unknown objects become handles stored there."""
    return _Encoder(refs)(x)


def decode(x: Any, resolve: Any = None, depth: int = 0) -> Any:
    """Rebuild a value from :func:`encode`'s output, creating builtin/stdlib values only.

    ``resolve(rid, type_name)`` maps a ``ref`` to an object (a :class:`Remote` on the runner side,
    the stored object on the candidate side); without it a ``ref`` is a protocol error.
    """
    if depth > MAX_DEPTH:
        raise ProtocolError("value too deeply nested")
    t = type(x)
    if x is None or t is bool or t is str or t is float or t is int:
        return x
    if t is not list or len(x) not in (2, 3) or type(x[0]) is not str:
        raise ProtocolError("malformed value")
    tag, payload = x[0], x[1]
    d = depth + 1
    if tag in ("list", "tuple", "set", "frozenset", "iter"):
        if type(payload) is not list:
            raise ProtocolError("malformed container")
        items = [decode(i, resolve, d) for i in payload]
        if tag == "list":
            return items
        if tag == "tuple":
            return tuple(items)
        if tag == "iter":
            return iter(items)
        try:
            return set(items) if tag == "set" else frozenset(items)
        except TypeError as e:
            raise ProtocolError(str(e)) from None
    if tag == "dict":
        if type(payload) is not list or any(type(p) is not list or len(p) != 2 for p in payload):
            raise ProtocolError("malformed dict")
        try:
            return {decode(k, resolve, d): decode(v, resolve, d) for k, v in payload}
        except TypeError as e:
            raise ProtocolError(str(e)) from None
    if type(payload) is str and tag in ("int", "bytes", "bytearray", "Decimal"):
        try:
            if tag == "int":
                return int(payload, 16)
            if tag == "Decimal":
                import decimal

                return decimal.Decimal(payload)
            return bytes.fromhex(payload) if tag == "bytes" else bytearray.fromhex(payload)
        except (ValueError, ArithmeticError) as e:
            raise ProtocolError(str(e)) from None
    if tag in ("complex", "range", "Fraction") and type(payload) is list:
        parts = [decode(p, resolve, d) for p in payload]
        try:
            if tag == "complex" and len(parts) == 2 and all(type(p) is float for p in parts):
                return complex(parts[0], parts[1])
            if tag == "range" and len(parts) == 3 and all(type(p) is int for p in parts):
                return range(*parts)
            if tag == "Fraction" and len(parts) == 2 and all(type(p) is int for p in parts):
                import fractions

                return fractions.Fraction(parts[0], parts[1])
        except (ValueError, ZeroDivisionError) as e:
            raise ProtocolError(str(e)) from None
    if tag == "ref" and type(payload) is int and resolve is not None:
        name = x[2] if len(x) == 3 and type(x[2]) is str else "object"
        return resolve(payload, name[:200])
    raise ProtocolError(f"unknown or malformed tag {tag[:40]!r}")


# --------------------------------------------------------------------------- limits


def set_limits(cpu_s: int, memory_bytes: int, file_bytes: int) -> None:
    """Hard resource limits (soft = hard); the sandboxed user has no capability to raise them.

    ``cpu_s <= 0`` leaves CPU time unlimited (the long-lived runner: its wall time is bounded by
    the grader, which kills it when a job overruns)."""
    import resource

    if cpu_s > 0:
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))
    for lim, val in (
        (resource.RLIMIT_AS, memory_bytes),
        (resource.RLIMIT_FSIZE, file_bytes),
        (resource.RLIMIT_NOFILE, 64),
        (resource.RLIMIT_CORE, 0),
    ):
        resource.setrlimit(lim, (val, val))


# --------------------------------------------------------------------------- candidate side


def _load_solution(as_main: bool) -> dict[str, Any]:
    with open("/sbx/solution.py", encoding="utf-8", errors="surrogateescape") as f:
        src = f.read()
    name = "__main__" if as_main else "solution"
    module = type(sys)(name)
    module.__file__ = "/work/solution.py"
    sys.modules[name] = module
    exec(compile(src, "solution.py", "exec"), module.__dict__)
    return module.__dict__


def serve(req_fd: int, rep_fd: int) -> None:
    """Load the candidate, then answer call requests until the runner closes the channel."""
    refs: dict[int, Any] = {}
    try:
        namespace = _load_solution(as_main=False)
    except BaseException as e:
        send(rep_fd, {"ready": False, "error": f"{type(e).__name__}: {e}"[:2000]})
        return
    send(rep_fd, {"ready": True})

    def resolve(rid: int, _name: str) -> Any:
        if rid not in refs:
            raise ProtocolError("unknown handle")
        return refs[rid]

    while True:
        try:
            req = recv(req_fd)
        except CandidateError:
            return
        try:
            target = req["fn"]
            fn = resolve(target[1], "") if isinstance(target, list) else namespace[target]
            args = decode(req["args"], resolve)
            kwargs = decode(req["kwargs"], resolve)
            result = fn(*args, **kwargs)
            reply = {"value": encode(result, refs)}
        except BaseException as e:
            reply = {"error": f"{type(e).__name__}: {e}"[:2000]}
        send(rep_fd, reply)


# --------------------------------------------------------------------------- runner side


class Channel:
    """The runner's end of the pipe pair to the candidate server."""

    def __init__(self, req_fd: int, rep_fd: int) -> None:
        self.req_fd, self.rep_fd = req_fd, rep_fd
        self.remotes: dict[int, Remote] = {}
        self.calls = 0

    def _resolve(self, rid: int, name: str) -> Remote:
        if rid not in self.remotes:
            self.remotes[rid] = Remote(rid, name, self)
        return self.remotes[rid]

    def call(self, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        self.calls += 1
        send(self.req_fd, {"fn": fn, "args": encode(list(args)), "kwargs": encode(kwargs)})
        reply = recv(self.rep_fd)
        if type(reply) is not dict:
            raise ProtocolError("malformed reply")
        if "error" in reply:
            raise CandidateError(str(reply["error"])[:2000])
        if "value" not in reply:
            raise ProtocolError("malformed reply")
        return decode(reply["value"], self._resolve)


class RemoteFunction:
    """A stub for a name the tests take from the candidate's module."""

    def __init__(self, name: str, channel: Channel) -> None:
        self.name, self.channel = name, channel

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.channel.call(self.name, args, kwargs)

    def __repr__(self) -> str:
        return f"<candidate function {self.name}>"


def run_tests(spec: dict[str, Any], req_fd: int, rep_fd: int) -> dict[str, Any]:
    """Run the task's tests against the candidate behind the channel; the verdict as a dict."""
    channel = Channel(req_fd, rep_fd)
    hello = recv(rep_fd)
    if type(hello) is not dict or hello.get("ready") is not True:
        error = hello.get("error") if type(hello) is dict else "malformed hello"
        return {"passed": False, "ran": 0, "total": 0, "error": f"candidate did not load: {error}"}
    namespace: dict[str, Any] = {"__name__": "__tests__"}
    for stmt in spec.get("imports") or []:
        exec(stmt, namespace)
    entry = spec.get("entry_point") or ""
    if spec["kind"] == "check":
        if spec.get("prompt"):
            exec(spec["prompt"], namespace)  # trusted helpers the tests use (HumanEval/38's encode_cyclic)
        candidate = RemoteFunction(entry, channel)
        namespace[entry] = candidate
        units: list[tuple[str, Any]] = [("check", None)]
    else:
        tests = [str(t) for t in spec["tests"]]
        for name in spec.get("remote_names") or [entry]:
            namespace[str(name)] = RemoteFunction(str(name), channel)
        units = [(t, None) for t in tests]
    ran = passed = 0
    error = ""
    for unit, _ in units:
        ran += 1
        try:
            if spec["kind"] == "check":
                exec(spec["tests"], namespace)
                namespace["check"](candidate)
            else:
                exec(compile(unit, "<test>", "exec"), namespace)
            passed += 1
        except BaseException as e:
            if not error:
                error = f"{type(e).__name__}: {e}"[:2000]
    return {
        "passed": passed == len(units) and len(units) > 0,
        "ran": ran,
        "total": len(units),
        "error": error,
    }


# --------------------------------------------------------------------------- entry


def runner_loop(sock_fd: int) -> None:
    """The long-lived test runner: one job per message on the grader's socket.

    A job is a framed JSON spec sent together with two descriptors (SCM_RIGHTS): the request
    pipe to a fresh candidate sandbox and the reply pipe from it. The verdict goes back on the
    socket, which only the grader holds. Every job runs its tests in a fresh namespace; the
    process is reused only to save an interpreter start per grading.
    """
    import socket

    sock = socket.socket(fileno=sock_fd)
    while True:
        try:
            head, fds, _flags, _addr = socket.recv_fds(sock, 4, 2)
        except OSError:
            return
        if not head:
            return  # the grader closed the socket
        try:
            if len(head) < 4:
                head += _read_exact(sock_fd, 4 - len(head))
            (size,) = struct.unpack(">I", head)
            if size > MAX_MESSAGE:
                raise ProtocolError("job too large")
            spec = loads(_read_exact(sock_fd, size).decode("utf-8"))
            if len(fds) != 2:
                raise ProtocolError("a job comes with exactly two descriptors")
            verdict = run_tests(spec, fds[0], fds[1])
        except BaseException as e:
            verdict = {"passed": False, "ran": 0, "total": 0, "error": f"{type(e).__name__}: {e}"[:2000]}
        finally:
            for fd in fds:
                try:  # noqa: SIM105 - contextlib would cost start-up time
                    os.close(fd)
                except OSError:
                    pass
        try:
            send(sock_fd, verdict)
        except OSError:
            return


def main(argv: list[str]) -> int:
    """Entry point inside the sandbox: ``harness.py ROLE CPU_S MEMORY_BYTES FILE_BYTES [FD ...]``."""
    if argv[:1] == ["probe"]:
        return 0
    role, cpu_s, mem, fsize = argv[0], int(argv[1]), int(argv[2]), int(argv[3])
    set_limits(cpu_s, mem, fsize)
    if role == "runner":
        runner_loop(int(argv[4]))
        return 0
    if role == "serve":
        serve(int(argv[4]), int(argv[5]))
        return 0
    if role == "run":
        sys.argv = ["solution.py"]
        _load_solution(as_main=True)
        return 0
    raise SystemExit(f"unknown role {role!r}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
