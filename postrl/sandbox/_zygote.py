"""The sandbox worker ("zygote"). It runs INSIDE the isolated environment.

This file is never imported by postrl: the pool reads its text and starts it with
`python3 -I -S -B -c <this source>` (the system Python, stdlib only), so it must not import
anything outside the standard library and must not rely on a file being readable.

Protocol on the fd named by argv[1] (a socketpair to the trusted parent): 4-byte big-endian length + JSON.
  1. parent -> worker: init {bpf, host_pidns, host_mntns, launcher_uid, workroot, wipe, preimport}
  2. worker -> parent: hello {pid, uid, pidns, mntns, netns, seccomp, kill_all}
  3. then per run: request -> response (see `run`).

Per run the worker forks a child that starts a new session, moves its pipes to fds 0-2, closes
everything else (the control socket included), sets rlimits, and runs the code (Python is
executed in the forked interpreter itself, which is what makes a run cost milliseconds; bash is
exec'd). Afterwards the worker kills every process the run started, reaps them (it is a child
subreaper, so orphans come back to it), and wipes the working directory, /tmp and /dev/shm.
"""

import base64
import ctypes
import json
import os
import resource
import select
import signal
import stat
import sys
import time

CTRL = int(sys.argv[1]) if len(sys.argv) > 1 else 3
RUN_DIR = "run"


def _recv():
    head = _read_exact(4)
    if head is None:
        return None
    body = _read_exact(int.from_bytes(head, "big"))
    return None if body is None else json.loads(body)


def _read_exact(n):
    buf = bytearray()
    while len(buf) < n:
        chunk = os.read(CTRL, n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def _send(obj):
    body = json.dumps(obj).encode()
    data = len(body).to_bytes(4, "big") + body
    while data:
        data = data[os.write(CTRL, data):]


def _ns(name):
    try:
        return os.readlink("/proc/self/ns/" + name)
    except OSError:
        return ""


# --- one-time hardening ---------------------------------------------------------------------


def _prctl(option, arg2=0):
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    return libc.prctl(option, arg2, 0, 0, 0)


def _install_seccomp(bpf):
    """Load a compiled BPF program (exported by the parent with libseccomp)."""

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    libc = ctypes.CDLL(None, use_errno=True)
    buf = ctypes.create_string_buffer(bpf, len(bpf))
    prog = SockFprog(len(bpf) // 8, ctypes.addressof(buf))
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong]
    if libc.prctl(38, 1, None, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
        return False
    return libc.prctl(22, 2, ctypes.addressof(prog), 0, 0) == 0  # PR_SET_SECCOMP, FILTER


def _setup(init):
    seccomp = bool(init.get("bpf")) and _install_seccomp(base64.b64decode(init["bpf"]))
    # Not dumpable: a run (same uid) cannot open /proc/<worker>/mem or /proc/<worker>/fd/N.
    _prctl(4, 0)  # PR_SET_DUMPABLE
    _prctl(36, 1)  # PR_SET_CHILD_SUBREAPER: orphans of a run are re-parented here
    for name in init.get("preimport", []):
        try:
            __import__(name)
        except Exception:
            pass
    for name, src in (init.get("preload") or {}).items():
        import types

        mod = types.ModuleType(name)
        exec(compile(src, "<" + name + ">", "exec"), mod.__dict__)
        sys.modules[name] = mod
    # Everything the worker holds now is shared with each fork: keep the collector off it,
    # so that a run does not copy-on-write the worker's pages by scanning them.
    import gc

    gc.collect()
    gc.freeze()
    pidns, mntns = _ns("pid"), _ns("mnt")
    uid = os.getuid()
    # kill(-1) is only ever used where it cannot reach outside the run: a private pid
    # namespace, or a uid that belongs to this worker alone.
    own_pidns = bool(pidns) and pidns != init["host_pidns"]
    own_uid = uid not in (0, init["launcher_uid"])
    state = {
        "kill_all": own_pidns or own_uid,
        "wipe_tmp": bool(init.get("wipe")) and bool(mntns) and mntns != init["host_mntns"],
        "workroot": init["workroot"],
        "seccomp": seccomp,
    }
    hello = {"pid": os.getpid(), "uid": uid, "pidns": pidns, "mntns": mntns, "netns": _ns("net")}
    hello.update(seccomp=seccomp, kill_all=state["kill_all"], wipe_tmp=state["wipe_tmp"])
    return state, hello


# --- cleaning up after a run ----------------------------------------------------------------


def _sweep(state, pid):
    """Kill every process the run started and reap them all; return the child's wait status."""
    status = None
    rusage = None
    for _ in range(2000):
        if state["kill_all"]:
            try:
                os.kill(-1, signal.SIGKILL)
            except OSError:
                pass
        else:
            _kill_children_and_groups(pid)
        try:
            while True:
                got, st, ru = os.wait4(-1, os.WNOHANG)
                if got == 0:
                    break
                if got == pid:
                    status, rusage = st, ru
        except ChildProcessError:
            return status, rusage, True
        time.sleep(0.0005)
    return status, rusage, False


def _kill_children_and_groups(pid):
    # Without kill(-1): kill the run's process group and every direct child (orphans of the
    # run are re-parented to this subreaper, so repeated passes reach the whole tree).
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass
    me = str(os.getpid())
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if fields[1].decode() == me:
            try:
                os.kill(int(entry), signal.SIGKILL)
            except OSError:
                pass


def _rmtree(path, keep_top=True):
    try:
        entries = list(os.scandir(path))
    except PermissionError:
        os.chmod(path, 0o700)
        entries = list(os.scandir(path))
    except FileNotFoundError:
        return
    for e in entries:
        try:
            if e.is_dir(follow_symlinks=False):
                os.chmod(e.path, 0o700)
                _rmtree(e.path, keep_top=False)
            else:
                os.unlink(e.path)
        except OSError:
            pass
    if not keep_top:
        os.rmdir(path)


def _wipe(state):
    if state["wipe_tmp"]:
        for d in ("/tmp", "/dev/shm"):
            _rmtree(d)
    else:
        _rmtree(state["workroot"])


# --- running one program --------------------------------------------------------------------


def _safe_path(workdir, name):
    norm = os.path.normpath(name)
    if norm.startswith(workdir + "/"):
        norm = norm[len(workdir) + 1:]
    if os.path.isabs(norm) or norm == ".." or norm.startswith("../") or norm in (".", ""):
        raise ValueError(f"bad file path: {name!r}")
    return os.path.join(workdir, norm)


def _write_files(workdir, files):
    for name, b64 in (files or {}).items():
        path = _safe_path(workdir, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(base64.b64decode(b64 or ""))


def _fetch_files(workdir, names, cap):
    out = {}
    for name in names or []:
        try:
            fd = os.open(_safe_path(workdir, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except (OSError, ValueError):
            continue
        try:
            if stat.S_ISREG(os.fstat(fd).st_mode):
                out[name] = base64.b64encode(os.read(fd, cap)).decode()
        finally:
            os.close(fd)
    return out


def _limits(req):
    mb = 1 << 20
    as_bytes = int(req["memory_mb"]) * mb
    cpu = int(req["cpu_s"])
    return [
        (resource.RLIMIT_AS, as_bytes),
        (resource.RLIMIT_DATA, as_bytes),
        (resource.RLIMIT_CPU, (cpu, cpu + 1)),
        (resource.RLIMIT_FSIZE, int(req["max_file_bytes"])),
        (resource.RLIMIT_NOFILE, int(req["max_open_files"])),
        (resource.RLIMIT_NPROC, int(req["max_procs"])),
        (resource.RLIMIT_CORE, 0),
    ]


def _child(req, workdir, fds):
    stdin_fd, out_w, err_w = fds
    os.setsid()
    os.dup2(stdin_fd, 0)
    os.dup2(out_w, 1)
    os.dup2(err_w, 2)
    os.closerange(3, 1 << 16)
    os.chdir(workdir)
    os.umask(0o077)
    for res, lim in _limits(req):
        if req["max_procs"] <= 0 and res == resource.RLIMIT_NPROC:
            continue
        soft, hard = lim if isinstance(lim, tuple) else (lim, lim)
        try:
            resource.setrlimit(res, (soft, hard))
        except (ValueError, OSError):
            pass
    for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT, signal.SIGTERM, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    if req["language"] == "bash":
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        os.execve("/bin/bash", ["bash", "main.sh"], dict(os.environ))
    _run_python(req["code"], workdir)


def _run_python(code, workdir):
    import builtins
    import io
    import traceback
    import types

    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # what CPython does at start
    sys.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)), errors="surrogateescape")
    sys.stdout = io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, "w", closefd=False)), errors="surrogateescape")
    sys.stderr = io.TextIOWrapper(
        io.BufferedWriter(io.FileIO(2, "w", closefd=False)), errors="backslashreplace", line_buffering=True
    )
    sys.argv = ["main.py"]
    sys.path.insert(0, workdir)
    main = types.ModuleType("__main__")
    main.__dict__.update(__builtins__=builtins, __file__=os.path.join(workdir, "main.py"))
    sys.modules["__main__"] = main
    rc = 0
    try:
        exec(compile(code, "main.py", "exec"), main.__dict__)
    except SystemExit as e:
        rc = _exit_code(e.code)
    except BaseException:
        traceback.print_exc()
        rc = 1
    try:
        if "threading" in sys.modules:
            sys.modules["threading"]._shutdown()
        import atexit

        atexit._run_exitfuncs()
    except BaseException:
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            rc = rc or 120
    os._exit(rc)


def _exit_code(code):
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    try:
        sys.stderr.write(str(code) + "\n")
    except BaseException:
        pass
    return 1


def _collect(pid, pipes, req, start):
    """Read stdout/stderr until the child exits, the deadline passes or output overflows."""
    cap = int(req["max_output_bytes"])
    bufs = {fd: bytearray() for fd in pipes}
    total = 0
    pidfd = os.pidfd_open(pid)
    poller = select.poll()
    for fd in (*pipes, pidfd):
        poller.register(fd, select.POLLIN)
    deadline = start + float(req["timeout_s"])
    reason = None
    while reason is None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            reason = "timeout"
            break
        for fd, _ in poller.poll(remaining * 1000):
            if fd == pidfd:
                reason = "exited"
                continue
            data = os.read(fd, 1 << 16)
            if not data:
                poller.unregister(fd)
                continue
            total += len(data)
            bufs[fd] += data[: max(0, cap - len(bufs[fd]))]
            if total > cap:
                reason = "output"
    os.close(pidfd)
    return bufs, reason


def _drain(pipes, bufs, cap):
    # Every writer is dead after the sweep, so each pipe reaches EOF; the poll timeout only
    # guards against a writer that escaped (possible only without kill(-1)).
    extra = 0
    for fd in pipes:
        os.set_blocking(fd, False)
        while True:
            if not select.select([fd], [], [], 0.05)[0]:
                break
            try:
                data = os.read(fd, 1 << 16)
            except BlockingIOError:
                break
            if not data:
                break
            extra += len(data)
            bufs[fd] += data[: max(0, cap - len(bufs[fd]))]
    return extra


def run(state, req):
    workdir = os.path.join(state["workroot"], RUN_DIR)
    _wipe(state)
    os.mkdir(workdir, 0o700)
    _write_files(workdir, req.get("files"))
    if req["language"] == "bash":
        with open(os.path.join(workdir, "main.sh"), "w") as f:
            f.write(req["code"])
    stdin_path = os.path.join(workdir, ".stdin")
    with open(stdin_path, "wb") as f:
        f.write((req.get("stdin") or "").encode("utf-8", "surrogateescape"))
    stdin_fd = os.open(stdin_path, os.O_RDONLY)
    os.unlink(stdin_path)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:
        try:
            _child(req, workdir, (stdin_fd, out_w, err_w))
        finally:
            os._exit(127)
    for fd in (stdin_fd, out_w, err_w):
        os.close(fd)
    pipes = (out_r, err_r)
    try:
        bufs, reason = _collect(pid, pipes, req, start)
    finally:
        status, rusage, clean = _sweep(state, pid)
    wall = time.monotonic() - start
    cap = int(req["max_output_bytes"])
    if _drain(pipes, bufs, cap) and sum(len(b) for b in bufs.values()) >= cap:
        reason = "output"
    for fd in pipes:
        os.close(fd)
    files = _fetch_files(workdir, req.get("fetch_files"), cap)
    _wipe(state)
    resp = {
        "reason": reason,
        "exit_code": os.waitstatus_to_exitcode(status) if status is not None else None,
        "wall_s": wall,
        "cpu_s": (rusage.ru_utime + rusage.ru_stime) if rusage else 0.0,
        "max_rss_kb": rusage.ru_maxrss if rusage else 0,
        "stdout": bufs[out_r].decode("utf-8", "replace"),
        "stderr": bufs[err_r].decode("utf-8", "replace"),
        "files": files,
        "all_killed": clean,
    }
    return resp


def main():
    init = _recv()
    if init is None:
        return
    state, hello = _setup(init)
    _send(hello)
    while True:
        req = _recv()
        if req is None:
            return
        try:
            resp = run(state, req)
        except Exception as e:  # a bad request (e.g. a file path) is reported, not fatal
            resp = {"reason": "error", "message": f"{type(e).__name__}: {e}"}
        _send(resp)


if __name__ == "__main__":
    main()
