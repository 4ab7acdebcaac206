"""One sandbox worker's life: started isolated (one bubblewrap sandbox holding a warm interpreter,
`_zygote.py`), handed runs over a socketpair (a run is a fork of the warm interpreter, so it does
not pay a process and namespace start), stopped. Which worker runs what, and when one is
replaced, is the pool's (`postrl.sandbox.pool`).
"""

from __future__ import annotations

import base64
import json
import math
import os
import queue
import signal
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from postrl.sandbox import isolation
from postrl.sandbox.runs import LANGUAGES, RunRequest, RunResult, SandboxConfig, SandboxUnavailable

_ZYGOTE_SOURCE = (Path(__file__).parent / "_zygote.py").read_text()
# Imported once in the worker, so runs need not. Each costs fork time in every run (a bigger
# process is slower to fork), so only modules that typical test programs use.
_PREIMPORT = "math re json random string itertools functools collections heapq bisect typing traceback".split()
PRELOAD = {"_postrl_runtime": (Path(__file__).parent / "_runtime.py").read_text()}
"""Modules (name -> source) created in every worker at start: the judge's harness runtime."""
_MAX_REPLY_BYTES = 256 << 20
_REPLY_GRACE_S = 10.0


@dataclass(frozen=True)
class Mode:
    bwrap: str | None
    python: str
    bpf: bytes | None


class Worker:
    """One isolated environment with a warm interpreter, driven over a socketpair."""

    def __init__(self, slot: int, cfg: SandboxConfig, mode: Mode, uid: int | None, launcher: Launcher):
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


class Launcher:
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


def try_start(w: Worker) -> Exception | None:
    try:
        w.start()
    except SandboxUnavailable as e:
        return e
    return None
