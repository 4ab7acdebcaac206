"""Isolation layers: what is available on this machine and how a worker is started.

Layers, strongest first (each is used when present and recorded on every result):
  bwrap    - bubblewrap: user, pid, net, ipc, uts, mount (and cgroup) namespaces; read-only
             /usr; private size-limited tmpfs for /tmp and /dev/shm; --die-with-parent,
             --new-session, cleared environment, no further user namespaces.
  seccomp  - a filter (built here with libseccomp, loaded by the worker itself) that refuses
             non-AF_UNIX sockets, namespace/mount/ptrace/bpf/keyring/module/io_uring calls.
  uid      - when the launcher is root: a distinct unprivileged uid per worker slot.
  rlimits  - address space, CPU seconds, processes, file size, open files, no core dumps.

Which layers took effect is decided from evidence the worker reports at start (its pid, mount
and net namespaces compared with ours, its uid, whether the filter loaded), not from what was
asked for.
"""

from __future__ import annotations

import errno
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass

SYSTEM_PYTHON = "/usr/bin/python3"

# Syscalls refused with EPERM: escaping or widening the sandbox, or kernel attack surface that
# no test program needs.
_DENIED = (
    "unshare setns mount umount umount2 pivot_root chroot ptrace process_vm_readv process_vm_writev "
    "kexec_load kexec_file_load init_module finit_module delete_module bpf perf_event_open "
    "userfaultfd keyctl add_key request_key reboot swapon swapoff open_by_handle_at "
    "name_to_handle_at fsopen fsmount fsconfig fspick move_mount open_tree mount_setattr "
    "io_uring_setup io_uring_enter io_uring_register acct quotactl syslog iopl ioperm "
    "settimeofday clock_settime clock_adjtime adjtimex vhangup lookup_dcookie"
).split()

_CLONE_NEW = {
    "CLONE_NEWNS": 0x00020000,
    "CLONE_NEWCGROUP": 0x02000000,
    "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000,
    "CLONE_NEWUSER": 0x10000000,
    "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
}
AF_UNIX = 1


def build_seccomp_bpf() -> bytes | None:
    """The filter as a BPF program, or None when libseccomp is not available."""
    try:
        import pyseccomp as sc
    except (ImportError, OSError):
        return None
    try:
        f = sc.SyscallFilter(sc.ALLOW)
        for name in _DENIED:
            _add(f, sc.ERRNO(errno.EPERM), name)
        _add(f, sc.ERRNO(errno.EPERM), "socket", sc.Arg(0, sc.NE, AF_UNIX))
        for flag in _CLONE_NEW.values():
            _add(f, sc.ERRNO(errno.EPERM), "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
        # clone3 passes its flags in memory the filter cannot read: refuse it as "not
        # implemented" so that libc falls back to clone(), whose flags are checked above.
        _add(f, sc.ERRNO(errno.ENOSYS), "clone3")
        with tempfile.TemporaryFile() as tmp:
            f.export_bpf(tmp)
            tmp.seek(0)
            return tmp.read()
    except (OSError, RuntimeError, ValueError):
        return None


def _add(f, action, name, *args) -> None:
    try:
        f.add_rule(action, name, *args)
    except (OSError, RuntimeError, ValueError):
        pass  # a syscall this architecture does not have


def find_python() -> str:
    """The interpreter the worker runs under.

    Debian's /usr/bin/python3 is readable by any uid and starts in ~10 ms; a pyenv or venv
    interpreter may be unreadable for the sandbox uid and is much slower to start.
    """
    if os.access(SYSTEM_PYTHON, os.X_OK):
        return SYSTEM_PYTHON
    return sys.executable


def find_bwrap() -> str | None:
    return shutil.which("bwrap")


@dataclass(frozen=True)
class Mounts:
    tmpfs_bytes: int
    python: str


def bwrap_argv(bwrap: str, mounts: Mounts) -> list[str]:
    """The bubblewrap command line that wraps a worker."""
    argv = [bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent"]
    argv += ["--new-session", "--clearenv", "--hostname", "sandbox", "--cap-drop", "ALL"]
    argv += ["--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin", "--setenv", "HOME", "/tmp"]
    argv += ["--setenv", "LANG", "C.UTF-8", "--setenv", "TMPDIR", "/tmp"]
    argv += ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            argv += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            argv += ["--ro-bind", top, top]
    # Only the few files from /etc the interpreter and libc need: never the whole of /etc
    # (it holds shadow, keys and host configuration).
    for path in ("/etc/ld.so.cache", "/etc/localtime", "/etc/alternatives"):
        if os.path.exists(path):
            argv += ["--ro-bind", path, path]
    prefix = os.path.realpath(sys.base_prefix)
    if not mounts.python.startswith("/usr/") and not prefix.startswith("/usr"):
        argv += ["--ro-bind", prefix, prefix]
    argv += ["--proc", "/proc", "--dev", "/dev"]
    size = str(mounts.tmpfs_bytes)
    argv += ["--size", size, "--perms", "1777", "--tmpfs", "/tmp"]
    argv += ["--size", size, "--perms", "1777", "--tmpfs", "/dev/shm"]
    # The sandbox's own root and /dev are tmpfs that bwrap leaves writable: make them
    # read-only so that only /tmp and /dev/shm (wiped between runs) can hold files.
    argv += ["--remount-ro", "/dev", "--remount-ro", "/", "--chdir", "/tmp"]
    return argv


def worker_argv(python: str, source: str) -> list[str]:
    # -I: ignore PYTHON* variables and user site; -S: no site import; -B: write no .pyc.
    return [python, "-I", "-S", "-B", "-c", source]


def ns_id(name: str, pid: str = "self") -> str:
    try:
        return os.readlink(f"/proc/{pid}/ns/{name}")
    except OSError:
        return ""
