"""Confinement for verifier worker processes (math-verify, reasoning-gym scoring).

Threat model: the text being scored is written by the policy, i.e. untrusted. Several scorers
turn it into code: reasoning-gym's countdown/puzzle24/n_queens/... call `eval` on the answer,
and sympy's `parse_expr` (used by math-verify and reasoning-gym) is `eval` underneath. A worker
must therefore not be able to change anything outside itself. After its imports, a worker
confines itself, in layers, each of which stands on its own:

1. rlimits: address space capped (a `10**10**10` answer raises MemoryError instead of eating
   the machine), no file may grow past 0 bytes, no core dumps.
2. seccomp (via pyseccomp/libseccomp, when the kernel allows it): opening a file for writing or
   creating, unlinking, renaming, making directories, exec, fork and sockets fail with EPERM
   at the syscall level, whatever Python tricks (ctypes, `__subclasses__` escapes) are used.
3. a Python audit hook refusing the same operations, so that they fail with a clear Python
   error even where seccomp is unavailable (this layer alone is not a security boundary).
4. the working directory is `/`, the parent death signal is SIGKILL,
   and the parent kills the worker at its hard deadline.

What it does not defend against: reading files the user can read (the verdict is the only thing
a worker sends back, as JSON, so a read has nowhere to go), and CPU burned until the deadline.
"""

from __future__ import annotations

import errno
import os
import resource
import sys

# Python-level operations refused by the audit hook (layer 3).
_REFUSED_EVENTS = frozenset(
    {
        "os.remove", "os.rename", "os.replace", "os.rmdir", "os.mkdir", "os.link", "os.symlink",
        "os.chmod", "os.chown", "os.truncate", "os.system", "os.exec", "os.posix_spawn", "os.fork",
        "os.forkpty", "os.kill", "os.killpg", "subprocess.Popen", "socket.connect", "socket.bind",
        "socket.__new__", "ctypes.dlopen", "shutil.rmtree", "shutil.move", "shutil.copyfile",
        "os.chdir",
    }
)
_WRITE_MODE_CHARS = set("wax+")
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def _audit(event: str, args: tuple) -> None:
    if event in _REFUSED_EVENTS:
        raise PermissionError(f"refused in verifier worker: {event}")
    if event == "open" and len(args) >= 3:
        mode, flags = args[1], args[2]
        if (isinstance(mode, str) and _WRITE_MODE_CHARS & set(mode)) or (
            isinstance(flags, int) and flags & _WRITE_FLAGS
        ):
            raise PermissionError("refused in verifier worker: open for writing")


def _set_rlimits(memory_mb: int) -> None:
    limit = memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _die_with_parent() -> None:
    # Without this, a worker stuck in C code outlives a parent that was SIGKILLed.
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, 9, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _load_seccomp() -> bool:
    try:
        import pyseccomp as sc
    except Exception:  # noqa: BLE001 - missing package or libseccomp: fall back to the other layers
        return False
    eperm = sc.ERRNO(errno.EPERM)
    try:
        f = sc.SyscallFilter(sc.ALLOW)
        # flags are argument 1 of open and argument 2 of openat
        for call, arg in (("open", 1), ("openat", 2)):
            for flag in (os.O_WRONLY, os.O_RDWR, os.O_CREAT, os.O_TRUNC, os.O_APPEND):
                f.add_rule(eperm, call, sc.Arg(arg, sc.MASKED_EQ, flag, flag))
        # openat2 passes its flags in a struct seccomp cannot read: refuse it outright (ENOSYS
        # makes libc fall back to openat, which is filtered above).
        f.add_rule(sc.ERRNO(errno.ENOSYS), "openat2")
        for call in (
            "creat", "unlink", "unlinkat", "rename", "renameat", "renameat2", "mkdir", "mkdirat",
            "rmdir", "link", "linkat", "symlink", "symlinkat", "chmod", "fchmod", "fchmodat",
            "truncate", "ftruncate", "execve", "execveat", "fork", "vfork", "clone", "socket",
            "connect", "bind", "ptrace", "kill", "tkill", "tgkill", "chdir", "fchdir",
        ):
            f.add_rule(eperm, call)
        f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")  # glibc then falls back to clone (refused)
        f.load()
    except Exception:  # noqa: BLE001 - e.g. a kernel without seccomp: the other layers still hold
        return False
    return True


def confine(memory_mb: int) -> str:
    """Confine the current process for good; returns the isolation level reached."""
    _die_with_parent()
    sys.dont_write_bytecode = True
    os.chdir("/")  # nothing relative to the caller's directory
    _set_rlimits(memory_mb)
    level = "seccomp" if _load_seccomp() else "rlimits+audit"
    sys.addaudithook(_audit)
    return level
