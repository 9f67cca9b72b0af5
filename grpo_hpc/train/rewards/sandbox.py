"""Run untrusted, model-written Python in a throw-away child process.

Layers, each cheap and each covering a gap in the others:

* a fresh ``python -I -S`` interpreter (no site-packages, no user env) in a new temp dir
  that is its cwd, HOME and TMPDIR, with an almost empty environment;
* ``start_new_session=True``, so the parent can ``killpg`` the whole process group on
  timeout and after every run (nothing the code started outlives the call);
* resource limits set by the harness before any untrusted code runs: RLIMIT_AS (memory),
  RLIMIT_CPU, RLIMIT_FSIZE (output/disk), RLIMIT_CORE=0, RLIMIT_NOFILE and RLIMIT_NPROC=0
  (no new processes or threads -- but Linux ignores NPROC for root, hence the next layer);
* a ``sys.addaudithook`` hook (it cannot be removed once added) that refuses process
  creation (fork/exec/spawn/system/subprocess, and importing ``_posixsubprocess`` or
  ``ctypes``, which bypass the audited paths), signals to other processes, every socket
  call, and any filesystem change outside the temp dir (open for write/append/create,
  remove, rename, mkdir, chmod, ...; symlinks and hard links are refused outright so a
  lexical path check is enough);
* a result the code cannot fake by exiting early: the harness prints a random nonce only
  after the code *and* every check ran, and ``ok`` requires it. ``sys.exit(0)`` or
  ``os._exit(0)`` before the asserts -- a reward hack RL policies do find -- fails.
* checks of the form ``assert a == b`` are rewritten to a strict comparison that converts
  both sides to plain builtin values first, so an object whose ``__eq__`` always returns
  True (another known hack) does not pass.

Limits: on its own this raises the bar against accidents and the reward hacks policies
discover; it is not a security boundary against code written to escape (frame
introspection, APIs CPython does not audit such as ``os.mknod``). Where bubblewrap works
(:mod:`grpo_hpc.train.rewards.bwrap`), the child runs inside it too: read-only root, private /tmp,
no network, own PID namespace; the layers above stay, as defence in depth.
We cannot use ``preexec_fn`` for the limits: it is unsafe in a multi-threaded parent, and the
reward code runs sandboxes from a thread pool.
"""

from __future__ import annotations

import ast
import functools
import json
import math
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass

from grpo_hpc.core.errors import ConfigError
from grpo_hpc.train.rewards import bwrap

OUTPUT_LIMIT_BYTES = 8 * 2**20
"""RLIMIT_FSIZE of the child: caps stdout/stderr files and anything it writes."""
RETURNED_CHARS = 16_000
"""stdout/stderr are cut to their last this-many characters in the result."""

# The harness runs in the child before (and around) the untrusted code. It captures every
# builtin it needs as a default argument so that monkeypatching builtins cannot subvert it.
_HARNESS = r"""
import builtins, collections, json, os, posix, resource, sys

def limits(spec):
    for name, soft, hard in spec:
        res = getattr(resource, name, None)
        if res is None:
            continue
        cur = resource.getrlimit(res)[1]
        if cur != resource.RLIM_INFINITY:
            hard = min(hard, cur)
        try:
            resource.setrlimit(res, (min(soft, hard), hard))
        except (ValueError, OSError):
            pass

def install_hook(root, _isinstance=isinstance, _str=str, _bytes=bytes, _int=int,
                 _getcwd=posix.getcwd, _stat=posix.stat, _OSError=OSError,
                 _PermissionError=PermissionError, _repr=repr):
    blocked = frozenset((
        "os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.system", "os.kill",
        "os.killpg", "subprocess.Popen", "pty.spawn", "os.symlink", "os.link", "os.chdir",
        "resource.setrlimit", "resource.prlimit", "gc.get_objects", "gc.get_referrers",
        "gc.get_referents"))
    bad_imports = frozenset(("_posixsubprocess", "ctypes", "_ctypes", "_cffi_backend", "cffi"))
    path_events = {"os.remove": 1, "os.rmdir": 1, "os.mkdir": 1, "os.chmod": 1, "os.chown": 1,
                   "os.utime": 1, "os.truncate": 1, "os.setxattr": 1, "os.removexattr": 1,
                   "shutil.rmtree": 1, "os.fwalk": 1, "os.rename": 2}
    write_flags = posix.O_WRONLY | posix.O_RDWR | posix.O_CREAT | posix.O_TRUNC | posix.O_APPEND

    def inside(p):
        if _isinstance(p, _bytes):
            p = p.decode("utf-8", "surrogateescape")
        if not _isinstance(p, _str):
            return False  # PathLike objects could answer differently twice (TOCTOU)
        if p == "/dev/null":
            return True
        parts = []
        for c in (p if p.startswith("/") else _getcwd() + "/" + p).split("/"):
            if c == "..":
                if parts:
                    parts.pop()
            elif c and c != ".":
                parts.append(c)
        norm = "/" + "/".join(parts)
        return norm == root or norm.startswith(root + "/")

    def is_dir(p):
        try:
            return (_stat(p).st_mode & 0o170000) == 0o040000
        except _OSError:
            return False

    def hook(event, args):
        bad = event in blocked or event.startswith("socket.") or event.startswith("ctypes.")
        if event == "import":
            bad = args[0] in bad_imports or args[0].split(".")[0] in bad_imports
        elif event == "open" and not _isinstance(args[0], _int):
            path, mode, flags = args
            if mode is None:  # os.open: flags; a dir fd outside could anchor dir_fd= tricks
                bad = not inside(path) and (flags & write_flags or is_dir(path))
            else:
                bad = not inside(path) and ("w" in mode or "a" in mode or "x" in mode
                                            or "+" in mode)
        elif event in path_events:
            for p in args[:path_events[event]]:
                bad = bad or _isinstance(p, _int) or not inside(p)
        elif event == "object.__setattr__":
            bad = args[1] == "__code__"
        if bad:
            what = _repr(args[0])[:200] if args else ""
            raise _PermissionError("sandbox: " + event + "(" + what + ") is not allowed")

    sys.addaudithook(hook)

def strict_eq_factory(_type=type, _id=id, _items=dict.items, _list=list, _tuple=tuple,
                      _set=set, _frozenset=frozenset, _Exception=Exception):
    scalars = _frozenset(_id(t) for t in (int, float, complex, bool, str, bytes, type(None)))
    dicts = _frozenset(_id(t) for t in (dict, collections.Counter, collections.OrderedDict,
                                        collections.defaultdict))
    LIST, TUPLE, SET, FSET = _id(list), _id(tuple), _id(set), _id(frozenset)
    class NotPlain(_Exception):
        pass
    def plain(x, depth):
        i = _id(_type(x))
        if depth > 200:
            raise NotPlain
        if i in scalars:
            return x
        if i == LIST or i == TUPLE:
            seq = [plain(v, depth + 1) for v in x]
            return seq if i == LIST else _tuple(seq)
        if i == SET or i == FSET:
            return _frozenset(plain(v, depth + 1) for v in x)
        if i in dicts:
            return {plain(k, depth + 1): plain(v, depth + 1) for k, v in _items(x)}
        raise NotPlain
    def strict_eq(a, b):
        vals = []
        for x in (a, b):
            try:
                vals.append((True, plain(x, 0)))
            except NotPlain:
                vals.append((False, None))
        (pa, va), (pb, vb) = vals
        if not pa and not pb:
            return a == b  # neither side is plain data: the test author chose this comparison
        return pa and pb and va == vb
    return strict_eq

def main(_exec=exec, _compile=compile, _exc_info=sys.exc_info, _hook=sys.__excepthook__,
         _write=os.write, _exit=os._exit, _out=sys.stdout, _err=sys.stderr, _str=str,
         _enumerate=enumerate):
    cfg = json.loads(sys.stdin.buffer.read())
    limits(cfg["limits"])
    nonce = ("\n" + cfg["nonce"] + "\n").encode()
    for mod in (os, posix):  # pidfd signals would reach other processes unaudited
        mod.__dict__.pop("pidfd_open", None)
    install_hook(cfg["root"])
    ns = {"__name__": "__sandbox__", "__builtins__": builtins}

    def run(src, name):
        try:
            _exec(_compile(src, name, "exec"), ns)
        except SystemExit:
            _write(2, ("sandbox: " + name + " called exit() before the end\n").encode())
            _exit(1)
        except BaseException:
            _hook(*_exc_info())
            _exit(1)

    run(cfg["code"], "<solution>")
    ns[cfg["eq_helper"]] = strict_eq_factory()
    for i, check in _enumerate(cfg["checks"]):
        run(check, "<check " + _str(i) + ">")
    for stream in (_out, _err):
        try:
            stream.flush()
        except BaseException:
            pass
    _write(1, nonce)
    _exit(0)

main()
"""


@dataclass(frozen=True)
class SandboxResult:
    """Outcome of :func:`run_python`.

    ``ok`` is True only when the code and all checks ran to the end (exit status 0 and
    the harness's end-of-run nonce seen) within the time limit.
    """

    ok: bool
    returncode: int | None
    timed_out: bool
    stdout: str
    stderr: str
    pid: int = 0
    """Pid of the child, also its process-group id (tests check the group is gone)."""
    isolation: str = "audit-hook"
    """Which sandbox ran it: ``bwrap`` or ``audit-hook``."""


class _StrictEq(ast.NodeTransformer):
    """Rewrite ``assert a == b`` into ``assert <helper>(a, b)`` (see module docstring)."""

    def __init__(self, helper: str) -> None:
        self.helper = helper

    def visit_Assert(self, node: ast.Assert) -> ast.Assert:
        test = node.test
        if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq):
            func = ast.Name(id=self.helper, ctx=ast.Load())
            node.test = ast.Call(func=func, args=[test.left, test.comparators[0]], keywords=[])
        return node


def harden_check(src: str, helper: str) -> str:
    """Return ``src`` with ``assert a == b`` rewritten to ``assert helper(a, b)``.

    Unparsable source is returned unchanged: it will fail in the child, as it should.
    """
    try:
        tree = _StrictEq(helper).visit(ast.parse(src))
        return ast.unparse(ast.fix_missing_locations(tree))
    except (SyntaxError, ValueError, RecursionError):
        return src


def _limits(timeout_s: float, memory_mb: int) -> list[tuple[str, int, int]]:
    """Resource limits for the child; CPU is a backstop, the parent enforces wall time."""
    mem = int(memory_mb) * 2**20
    cpu = math.ceil(timeout_s) + 1
    return [
        ("RLIMIT_AS", mem, mem),
        ("RLIMIT_CPU", cpu, cpu + 1),
        ("RLIMIT_FSIZE", OUTPUT_LIMIT_BYTES, OUTPUT_LIMIT_BYTES),
        ("RLIMIT_CORE", 0, 0),
        ("RLIMIT_NOFILE", 64, 64),
        ("RLIMIT_NPROC", 0, 0),
    ]


def _kill_group(pgid: int) -> None:
    """SIGKILL everything left in the child's process group (a no-op when it is empty)."""
    try:
        os.killpg(pgid, 9)
    except (ProcessLookupError, PermissionError):
        pass


def _remove_tree(root: str) -> None:
    """Delete the temp dir even if the code chmod'ed parts of it unreadable."""
    try:
        shutil.rmtree(root)
    except OSError:
        for dirpath, dirnames, _files in os.walk(root):
            for name in [".", *dirnames]:
                try:
                    os.chmod(os.path.join(dirpath, name), 0o700)
                except OSError:
                    pass
        shutil.rmtree(root, ignore_errors=True)


def _tail(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")[-RETURNED_CHARS:]


def _execute(
    root: str, payload: dict, timeout_s: float, use_bwrap: bool
) -> tuple[int, int, bool, bytes, bytes]:
    """Run the harness in ``root``; (pid, returncode, timed_out, stdout, stderr)."""
    argv = [sys.executable, "-I", "-S", "-c", _HARNESS]
    if use_bwrap:  # killing bwrap's group ends its PID namespace, and all inside
        argv = bwrap.command(root, argv)
    env = {"PATH": "/usr/bin:/bin", "HOME": root, "TMPDIR": root, "LC_ALL": "C.UTF-8"}
    # Output goes to files, not pipes: a child printing gigabytes cannot grow our memory, and
    # RLIMIT_FSIZE caps them. We read through our own descriptors, so deleting or replacing
    # the files from inside the sandbox changes nothing.
    with tempfile.TemporaryFile(dir=root) as out, tempfile.TemporaryFile(dir=root) as err:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE, stdout=out, stderr=err, cwd=root, env=env,
            start_new_session=True, close_fds=True,
        )  # fmt: skip
        timed_out = False
        try:
            proc.communicate(json.dumps(payload).encode(), timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            # The group id is the child's pid (new session). Also after a normal exit: kill
            # whatever the code may have left behind.
            _kill_group(proc.pid)
            proc.wait()
        out.seek(0)
        err.seek(0)
        limit = OUTPUT_LIMIT_BYTES
        return proc.pid, proc.returncode, timed_out, out.read(limit), err.read(limit)


def run_python(
    code: str,
    timeout_s: float = 5.0,
    memory_mb: int = 512,
    *,
    checks: Sequence[str] = (),
    isolation: str = "auto",
) -> SandboxResult:
    """Run ``code`` then each of ``checks`` (trusted, e.g. assert lines) in one sandboxed child.

    The checks share the code's namespace and run only if the code ran without error.
    Never raises for anything the code does; returns within about ``timeout_s`` seconds.
    ``isolation``: ``auto`` (bwrap where it works, see :func:`bwrap.detect`), ``bwrap``
    or ``audit-hook`` (the latter two for tests and comparisons).
    """
    use_bwrap = (proven_isolation().name if isolation == "auto" else isolation) == "bwrap"
    root = os.path.realpath(tempfile.mkdtemp(prefix="grpo-sandbox-"))
    nonce = secrets.token_hex(16)
    # A per-run helper name: code can neither pre-define nor (from a thread) overwrite it.
    helper = f"__grpo_eq_{secrets.token_hex(8)}__"
    payload = {
        "root": root,
        "nonce": nonce,
        "code": code,
        "checks": [harden_check(c, helper) for c in checks],
        "eq_helper": helper,
        "limits": _limits(timeout_s, memory_mb),
    }
    try:
        pid, returncode, timed_out, stdout, stderr = _execute(root, payload, timeout_s, use_bwrap)
    finally:
        _remove_tree(root)
    marker = ("\n" + nonce + "\n").encode()
    return SandboxResult(
        ok=not timed_out and returncode == 0 and marker in stdout,
        returncode=returncode,
        timed_out=timed_out,
        stdout=_tail(stdout.replace(marker, b"")),
        stderr=_tail(stderr),
        pid=pid,
        isolation="bwrap" if use_bwrap else "audit-hook",
    )


SELF_CHECK_TIMEOUT_S = 20.0
"""Time limit of each self-check program (generous: a loaded node starts Python slowly)."""


class SandboxUnavailableError(ConfigError):
    """No sandbox can run a trivial program correctly here: the code reward cannot work."""


def self_check(isolation: str) -> str | None:
    """None when ``isolation`` passes a trivial passing program and fails a trivial failing
    one; else why not, in a few words. A sandbox that cannot start would score every
    completion 0 -- a correct one too -- and training would go on at zero reward."""
    kw = {"timeout_s": SELF_CHECK_TIMEOUT_S, "isolation": isolation}
    try:
        good = run_python("x = 2", checks=["assert x == 2"], **kw)
    except OSError as e:  # the interpreter itself cannot be started
        return f"a trivial passing program failed ({e.strerror}: {e.filename})"
    if not good.ok:
        tail = (good.stderr.strip().splitlines() or [""])[-1][:200]
        why = "timed out" if good.timed_out else tail or f"exit {good.returncode}"
        return f"a trivial passing program failed ({why})"
    if run_python("x = 2", checks=["assert x == 3"], **kw).ok:
        return "a trivial failing program passed"
    return None


@functools.lru_cache(maxsize=1)
def proven_isolation() -> bwrap.Isolation:
    """The sandbox the code reward uses, once proven here: bwrap when it passes the
    self-check, else the audit-hook sandbox (saying why), else :class:`SandboxUnavailableError`."""
    iso = bwrap.detect()
    if iso.name == "bwrap":
        why = self_check("bwrap")
        if why is None:
            return iso
        iso = bwrap.Isolation("audit-hook", f"bwrap failed its self-check: {why}")
    why = self_check("audit-hook")
    if why is not None:
        raise SandboxUnavailableError(
            f"the code-reward sandbox does not work on this node: {why}; "
            "set reward.code=0 or fix the Python installation"
        )
    return iso
