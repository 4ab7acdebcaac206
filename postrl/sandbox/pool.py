"""A pool of warm, isolated workers that run programs.

    with SandboxPool(SandboxConfig(workers=2)) as pool:
        result = pool.run(RunRequest(code="print(1 + 1)"))
        result.stdout, result.status, result.isolation   # '2\\n', 'finished', 'bwrap+seccomp+uid+rlimits'

Each worker is one long-lived isolated environment (one bubblewrap sandbox) holding a warm
interpreter; a run is a fork of it, so a run does not pay a process and namespace start. A
worker is restarted after `runs_per_worker` runs, after any run that killed it, and after any
run whose reply did not come in time.
"""

from __future__ import annotations

import base64
import json
import logging
import math
import os
import queue
import signal
import socket
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from postrl.sandbox import isolation

_log = logging.getLogger("postrl.sandbox")

_ZYGOTE_SOURCE = (Path(__file__).parent / "_zygote.py").read_text()
# Imported once in the worker, so runs need not. Each costs fork time in every run (a bigger
# process is slower to fork), so only modules that typical test programs use.
_PREIMPORT = "math re json random string itertools functools collections heapq bisect typing traceback".split()
PRELOAD = {"_postrl_runtime": (Path(__file__).parent / "_runtime.py").read_text()}
"""Modules (name -> source) created in every worker at start: the judge's harness runtime."""
_MAX_REPLY_BYTES = 256 << 20
_REPLY_GRACE_S = 10.0
LANGUAGES = ("python", "bash")


class SandboxUnavailable(RuntimeError):
    """No worker could be started with the isolation the config demands."""


@dataclass
class SandboxConfig:
    workers: int = 0
    """Concurrent workers; 0 means one per CPU core."""
    timeout_s: float = 10.0
    """Default wall-clock limit of a run (a request may set its own)."""
    memory_mb: int = 512
    """Default address-space limit of a run."""
    max_output_bytes: int = 1 << 20
    """stdout + stderr kept per run; a run that writes more is stopped (output_limit)."""
    max_file_bytes: int = 16 << 20
    """Largest file a run may write (RLIMIT_FSIZE)."""
    tmpfs_mb: int = 64
    """Size of the private /tmp (and of /dev/shm) of each worker."""
    max_procs: int = 32
    """Processes and threads a run may have at once (RLIMIT_NPROC)."""
    max_open_files: int = 128
    runs_per_worker: int = 1000
    """A worker is replaced by a fresh one after this many runs."""
    allow_unisolated: bool = False
    """Run even without namespace isolation (only rlimits, seccomp and a separate uid)."""
    allow_unisolated_key: str = "SandboxConfig.allow_unisolated"
    """How this config's user turns `allow_unisolated` on (a recipe key, a command-line flag), named
    by the refusal when isolation is unavailable; empty: there is no such setting for them."""
    use_bwrap: bool = True
    """Try bubblewrap; False forces the unisolated mode (tests of the fallback)."""
    max_queue: int = 0
    """Requests allowed to wait for a worker (used by the server); 0 means 4 per worker."""
    max_workers: int = 0
    """Elastic pool: grow toward this many workers while requests wait (0 = fixed at `workers`)."""
    idle_shrink_s: float = 30.0
    """Elastic pool: a worker above `workers` idle this long is stopped."""

    def n_workers(self) -> int:
        return self.workers if self.workers > 0 else (os.cpu_count() or 1)


@dataclass
class RunRequest:
    code: str
    language: str = "python"
    stdin: str | None = None
    files: dict[str, str] = field(default_factory=dict)
    """Path (relative to the working directory) -> base64 content, written before the run."""
    fetch_files: list[str] = field(default_factory=list)
    """Paths read back after the run (base64 in `RunResult.files`)."""
    timeout_s: float | None = None
    memory_mb: int | None = None
    max_output_bytes: int | None = None


@dataclass
class RunResult:
    status: str
    """finished | timeout | output_limit | error (the sandbox could not run or lost the run)."""
    exit_code: int | None
    """Exit status; negative for a signal (-9 = SIGKILL); None when the run did not end."""
    stdout: str
    stderr: str
    wall_s: float
    cpu_s: float
    isolation: str
    """Isolation layers that were in force, e.g. 'bwrap+seccomp+uid+rlimits'."""
    files: dict[str, str] = field(default_factory=dict)
    message: str = ""
    worker_lost: bool = False
    """The worker died during the run (a program that kills its own sandbox)."""

    @property
    def memory_exceeded(self) -> bool:
        return "MemoryError" in self.stderr or "Cannot allocate memory" in self.stderr


@dataclass(frozen=True)
class _Mode:
    bwrap: str | None
    python: str
    bpf: bytes | None


class _Worker:
    """One isolated environment with a warm interpreter, driven over a socketpair."""

    def __init__(self, slot: int, cfg: SandboxConfig, mode: _Mode, uid: int | None, launcher: _Launcher):
        self.slot, self.cfg, self.mode, self.uid = slot, cfg, mode, uid
        self.launcher = launcher
        self.proc: subprocess.Popen | None = None
        self.sock: socket.socket | None = None
        self.hello: dict = {}
        self.layers = ""
        self.runs = 0
        self._workroot: str | None = None

    def start(self) -> None:
        parent, child = socket.socketpair()
        argv = isolation.worker_argv(self.mode.python, _ZYGOTE_SOURCE) + [str(child.fileno())]
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
        if self.mode.bwrap:
            mounts = isolation.Mounts(self.cfg.tmpfs_mb << 20, self.mode.python)
            argv = isolation.bwrap_argv(self.mode.bwrap, mounts) + argv
            workroot = "/tmp"
        else:
            workroot = self._workroot = tempfile.mkdtemp(prefix="postrl-sandbox-")
            if self.uid is not None:
                os.chown(workroot, self.uid, self.uid)
            env.update(HOME=workroot, TMPDIR=workroot)
        ids = {} if self.uid is None else {"user": self.uid, "group": self.uid, "extra_groups": []}
        err = tempfile.TemporaryFile()
        try:
            self.proc = self.launcher.call(lambda: subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, env=env,
                pass_fds=(child.fileno(),), start_new_session=True, cwd="/", **ids,
            ))
        finally:
            child.close()
        self.sock = parent
        init = {
            "bpf": base64.b64encode(self.mode.bpf).decode() if self.mode.bpf else "",
            "host_pidns": isolation.ns_id("pid"), "host_mntns": isolation.ns_id("mnt"),
            "launcher_uid": os.getuid(), "workroot": workroot, "wipe": bool(self.mode.bwrap),
            "preimport": _PREIMPORT, "preload": PRELOAD,
        }
        try:
            self._send(init)
            self.hello = self._recv(timeout_s=30.0)
        except (OSError, EOFError, ValueError) as e:
            err.seek(0)
            detail = err.read().decode(errors="replace").strip().splitlines()[-1:] or [str(e)]
            self.stop()
            raise SandboxUnavailable(f"sandbox worker failed to start: {detail[0]}") from None
        finally:
            err.close()
        self.layers = self._layers()
        self.runs = 0

    def _layers(self) -> str:
        h = self.hello
        layers = []
        if all(h.get(k) and h[k] != isolation.ns_id(k[:-2]) for k in ("pidns", "mntns", "netns")):
            layers.append("bwrap")
        if h.get("seccomp"):
            layers.append("seccomp")
        if h.get("uid") not in (0, os.getuid()):
            layers.append("uid")
        layers.append("rlimits")
        return "+".join(layers)

    @property
    def isolated(self) -> bool:
        return self.layers.startswith("bwrap")

    def run(self, req: RunRequest) -> RunResult:
        msg = self._request(req)
        self.runs += 1
        t0 = time.monotonic()
        try:
            self._send(msg)
            reply = self._recv(timeout_s=msg["timeout_s"] + _REPLY_GRACE_S)
        except (OSError, EOFError, ValueError) as e:
            self.stop()
            lost = "worker died" if isinstance(e, EOFError) else f"no reply from worker ({type(e).__name__})"
            return RunResult("error", None, "", "", time.monotonic() - t0, 0.0, self.layers,
                             message=f"sandbox {lost} during the run", worker_lost=True)
        return self._result(reply, msg["cpu_s"])

    def _request(self, req: RunRequest) -> dict:
        if req.language not in LANGUAGES:
            raise ValueError(f"unsupported language {req.language!r}; supported: {', '.join(LANGUAGES)}")
        cfg = self.cfg
        timeout = float(req.timeout_s if req.timeout_s is not None else cfg.timeout_s)
        extra = 2 if self.isolated else 1  # the sandbox's init and the worker share the uid
        return {
            "code": req.code, "language": req.language, "stdin": req.stdin,
            "files": req.files, "fetch_files": req.fetch_files, "timeout_s": timeout,
            "cpu_s": math.ceil(timeout) + 1,
            "memory_mb": int(req.memory_mb or cfg.memory_mb),
            "max_output_bytes": int(req.max_output_bytes or cfg.max_output_bytes),
            "max_file_bytes": cfg.max_file_bytes, "max_open_files": cfg.max_open_files,
            # Without a uid of its own, RLIMIT_NPROC would count every process of our user.
            "max_procs": cfg.max_procs + extra if (self.isolated or "uid" in self.layers) else 0,
        }

    def _result(self, r: dict, cpu_limit: int) -> RunResult:
        reason = r.get("reason")
        code = r.get("exit_code")
        cpu = float(r.get("cpu_s") or 0.0)
        status = {"exited": "finished", "timeout": "timeout", "output": "output_limit"}.get(reason, "error")
        # The CPU limit ends a run with SIGXCPU, or with SIGKILL at the hard limit.
        if status == "finished" and (code == -signal.SIGXCPU or (code == -signal.SIGKILL and cpu >= cpu_limit)):
            status = "timeout"
        return RunResult(
            status=status, exit_code=code, stdout=str(r.get("stdout", "")), stderr=str(r.get("stderr", "")),
            wall_s=float(r.get("wall_s") or 0.0), cpu_s=cpu, isolation=self.layers,
            files=dict(r.get("files") or {}), message=str(r.get("message", "")),
        )

    def _send(self, obj: dict) -> None:
        body = json.dumps(obj).encode()
        self.sock.settimeout(30.0)
        self.sock.sendall(len(body).to_bytes(4, "big") + body)

    def _recv(self, timeout_s: float) -> dict:
        self.sock.settimeout(timeout_s)
        size = int.from_bytes(self._exact(4), "big")
        if size > _MAX_REPLY_BYTES:
            raise ValueError("reply too large")
        # The reply is parsed as JSON only (never unpickled): it is data, even if the
        # worker had been subverted.
        reply = json.loads(self._exact(size))
        if not isinstance(reply, dict):
            raise ValueError("malformed reply")
        return reply

    def _exact(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(min(n - len(buf), 1 << 20))
            if not chunk:
                raise EOFError("worker closed the connection")
            buf += chunk
        return bytes(buf)

    def stop(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self.proc is not None:
            try:
                self.proc.kill()  # bwrap --die-with-parent takes the whole sandbox with it
            except OSError:
                pass
            self.proc.wait()
            self.proc = None
        if self._workroot:
            _remove_tree(self._workroot)
            self._workroot = None


def _remove_tree(path: str) -> None:
    for root, dirs, files in os.walk(path, topdown=False):
        for name in files:
            try:
                os.unlink(os.path.join(root, name))
            except OSError:
                pass
        for name in dirs:
            try:
                os.rmdir(os.path.join(root, name))
            except OSError:
                pass
    try:
        os.rmdir(path)
    except OSError:
        pass


class _Launcher:
    """Starts every worker process from one long-lived thread.

    bubblewrap's --die-with-parent uses PR_SET_PDEATHSIG, which fires when the *thread* that
    forked it exits; starting workers from short-lived threads would kill them at random.
    """

    def __init__(self):
        self._jobs: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="sandbox-launcher", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fn, done, ev = job
            try:
                done.append((fn(), None))
            except BaseException as e:  # handed back to the caller
                done.append((None, e))
            finally:
                ev.set()

    def call(self, fn):
        done: list = []
        ev = threading.Event()
        self._jobs.put((fn, done, ev))
        ev.wait()
        value, error = done[0]
        if error is not None:
            raise error
        return value

    def stop(self) -> None:
        self._jobs.put(None)


class SandboxPool:
    """Warm isolated workers; `run` is thread-safe and blocks until a worker is free."""

    preloaded = tuple(PRELOAD)

    def __init__(self, cfg: SandboxConfig | None = None):
        self.cfg = cfg or SandboxConfig()
        self._lock = threading.Lock()
        self._idle: queue.Queue[_Worker] = queue.Queue()
        self._workers: list[_Worker] = []
        self._closed = False
        self._launcher = _Launcher()
        first = self._start_first()
        self._workers.append(first)
        n = self.cfg.n_workers()
        uids = [self._uid_for(i) for i in range(1, n)]
        rest = [_Worker(i, self.cfg, first.mode, uid, self._launcher) for i, uid in zip(range(1, n), uids)]
        with ThreadPoolExecutor(max_workers=max(1, len(rest))) as ex:
            errors = [e for e in ex.map(_try_start, rest) if e is not None]
        if errors:
            for w in [first, *rest]:
                w.stop()
            self._launcher.stop()
            raise errors[0]
        self._workers += rest
        for w in self._workers:
            self._idle.put(w)
        self.isolation = first.layers
        """Layers in force, e.g. 'bwrap+seccomp+uid+rlimits' (the same for every worker)."""
        self.info = dict(first.hello)
        self._min, self._max = n, max(n, self.cfg.max_workers)
        self._idle_since: dict[int, float] = {}
        """Slot -> when that worker last became idle (for shrinking)."""
        self.sizes: list[tuple[float, int]] = [(time.monotonic(), n)]
        """(time, number of workers) at start and after every grow or shrink."""

    @property
    def isolated(self) -> bool:
        return self.isolation.startswith("bwrap")

    def _uid_for(self, slot: int) -> int | None:
        if os.geteuid() != 0:
            return None
        # A uid per slot, away from system and user ranges; derived from our pid so that two
        # pools on one machine do not share uids.
        return 200_000 + (os.getpid() % 50_000) * 16 + slot

    def _start_first(self) -> _Worker:
        cfg = self.cfg
        bpf = isolation.build_seccomp_bpf()
        python = isolation.find_python()
        bwrap = isolation.find_bwrap() if cfg.use_bwrap else None
        failure = "bubblewrap not found" if bwrap is None else ""
        if bwrap is not None:
            w = _Worker(0, cfg, _Mode(bwrap, python, bpf), self._uid_for(0), self._launcher)
            try:
                w.start()
                if w.isolated:
                    return w
                w.stop()
                failure = "bubblewrap started but the worker shares our namespaces"
            except SandboxUnavailable as e:
                failure = str(e)
        if not cfg.allow_unisolated:
            raise SandboxUnavailable(
                f"no namespace isolation available ({failure or 'disabled by config'}); " + (
                    f"turn on {cfg.allow_unisolated_key} to run with rlimits/seccomp/uid only"
                    if cfg.allow_unisolated_key else "this sandbox runs isolated only (install bubblewrap)")
            )
        w = _Worker(0, cfg, _Mode(None, python, bpf), self._uid_for(0), self._launcher)
        w.start()
        return w

    def run(self, req: RunRequest) -> RunResult:
        if self._closed:
            raise RuntimeError("sandbox pool is closed")
        w = self._acquire()
        try:
            result = w.run(req)
        except ValueError as e:
            result = RunResult("error", None, "", "", 0.0, 0.0, w.layers, message=str(e))
        finally:
            self._release(w)
        return result

    def _release(self, w: _Worker) -> None:
        if w.sock is None or w.runs >= self.cfg.runs_per_worker:
            w.stop()
            if not self._closed:
                try:
                    w.start()
                except SandboxUnavailable:
                    time.sleep(0.5)
                    w.start()
        if self._retire_if_idle_extra(w):
            return
        self._idle_since[w.slot] = time.monotonic()
        self._idle.put(w)

    # -- elasticity: grow while requests wait, shrink back after `idle_shrink_s` of quiet
    def _acquire(self) -> _Worker:
        try:
            return self._idle.get_nowait()
        except queue.Empty:
            pass
        grown = self._grow()
        return grown if grown is not None else self._idle.get()

    def _grow(self) -> _Worker | None:
        with self._lock:
            if self._closed or len(self._workers) >= self._max:
                return None
            slot = max(w.slot for w in self._workers) + 1
            w = _Worker(slot, self.cfg, self._workers[0].mode, self._uid_for(slot), self._launcher)
            self._workers.append(w)
        if _try_start(w) is not None:
            with self._lock:
                self._workers.remove(w)
            return None
        self._resized()
        return w

    def shrink_idle(self) -> int:
        """Stop workers above the base size that have been idle `idle_shrink_s`; returns how many."""
        stopped, keep = 0, []
        while True:
            try:
                keep.append(self._idle.get_nowait())
            except queue.Empty:
                break
        for w in keep:
            if not self._retire_if_idle_extra(w, idle_for=time.monotonic() - self._idle_since.get(w.slot, 0.0)):
                self._idle.put(w)
            else:
                stopped += 1
        return stopped

    def _retire_if_idle_extra(self, w: _Worker, idle_for: float = 0.0) -> bool:
        with self._lock:
            if len(self._workers) <= self._min or idle_for < self.cfg.idle_shrink_s or self._closed:
                return False
            self._workers.remove(w)
        w.stop()
        self._resized()
        return True

    def _resized(self) -> None:
        self.sizes.append((time.monotonic(), len(self._workers)))
        _log.info("sandbox pool resized to %d workers (base %d, max %d)", len(self._workers), self._min, self._max)

    def run_many(self, reqs: list[RunRequest]) -> list[RunResult]:
        """Run requests concurrently on all workers; results in request order."""
        if not reqs:
            return []
        self.shrink_idle()  # between batches: extra workers that sat out the last idle_shrink_s go
        with ThreadPoolExecutor(max_workers=min(len(reqs), self._max)) as ex:
            return list(ex.map(self.run, reqs))

    @property
    def n_workers(self) -> int:
        return len(self._workers)

    def close(self) -> None:
        self._closed = True
        for w in self._workers:
            w.stop()
        self._launcher.stop()

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _try_start(w: _Worker) -> Exception | None:
    try:
        w.start()
    except SandboxUnavailable as e:
        return e
    return None
