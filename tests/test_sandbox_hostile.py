"""Hostile programs against the sandbox pool. Each case checks that the host is untouched and
that the run ends as a failure or a recorded limit.

Destructive cases (kill(-1), fork bomb, memory bomb, killing the parent) first require the
`isolated` fixture: a harmless probe that proves the run is in its own pid namespace and, as
root, under another uid. Without that proof they are skipped: as root in an unisolated sandbox,
kill(-1) would end every process on the machine.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import threading

import pytest

from postrl.sandbox.pool import SandboxPool
from postrl.sandbox.runs import RunRequest, SandboxConfig, SandboxUnavailable


def _pool(**kw) -> SandboxPool:
    try:
        return SandboxPool(SandboxConfig(**kw))
    except SandboxUnavailable as e:
        pytest.skip(f"no isolated sandbox here: {e}")


@pytest.fixture(scope="module")
def pool():
    p = _pool(workers=2, timeout_s=5.0, memory_mb=256, max_output_bytes=64 << 10, tmpfs_mb=16)
    yield p
    p.close()


@pytest.fixture(scope="module")
def solo():
    """One worker: consecutive runs are guaranteed to share the same sandbox."""
    p = _pool(workers=1, timeout_s=5.0, memory_mb=256, tmpfs_mb=16)
    yield p
    p.close()


@pytest.fixture(scope="module")
def isolated(pool):
    r = pool.run(RunRequest(code=textwrap.dedent("""
        import os
        print(os.readlink('/proc/self/ns/pid'), os.readlink('/proc/self/ns/net'), os.getuid())
        print(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))
    """)))
    pidns, netns, uid = r.stdout.split("\n")[0].split()
    pids = eval(r.stdout.split("\n")[1])
    ok = (pidns != os.readlink("/proc/self/ns/pid") and netns != os.readlink("/proc/self/ns/net")
          and (os.geteuid() != 0 or int(uid) != 0) and max(pids) < 100)
    if not ok:
        pytest.skip("sandbox did not prove pid/net isolation; destructive cases not run")
    return True


@pytest.fixture
def sentinel():
    """A host process that must survive whatever the sandboxed program does."""
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield p
    assert p.poll() is None, "a host process was killed"
    p.kill()
    p.wait()


def run(pool, code, **kw):
    return pool.run(RunRequest(code=textwrap.dedent(code), **kw))


def assert_healthy(pool):
    for _ in range(pool.n_workers + 1):
        r = run(pool, "print(6 * 7)")
        assert (r.status, r.stdout) == ("finished", "42\n"), r


def test_isolation_is_recorded(pool):
    r = run(pool, "print('hi')")
    assert r.status == "finished" and r.stdout == "hi\n"
    assert r.isolation.startswith("bwrap") and "rlimits" in r.isolation
    if os.geteuid() == 0:
        assert "uid" in r.isolation


# --- time ---------------------------------------------------------------------------------


@pytest.mark.parametrize("code", [
    "while True: pass",
    "import time\ntime.sleep(60)",
    """
    import signal
    for s in (signal.SIGTERM, signal.SIGALRM, signal.SIGXCPU, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, signal.SIG_IGN)
    while True: pass
    """,
])
def test_runaway_programs_time_out(pool, code):
    r = run(pool, code, timeout_s=1.0)
    assert r.status == "timeout" and r.exit_code != 0
    assert_healthy(pool)


def test_stdin_left_open_does_not_hang(pool):
    r = run(pool, "x = input()")
    assert r.status == "finished" and r.exit_code == 1 and "EOFError" in r.stderr
    r = run(pool, "import sys; print(repr(sys.stdin.read()))", stdin="abc\n")
    assert r.stdout == "'abc\\n'\n"


# --- resources (destructive ones only after the isolation probe) ----------------------------


def test_fork_bomb(pool, isolated, sentinel):
    r = run(pool, """
        import os
        while True:
            try:
                os.fork()
            except OSError:
                pass
    """, timeout_s=1.5)
    assert r.status == "timeout"
    assert_healthy(pool)


def test_thread_bomb(pool, isolated, sentinel):
    r = run(pool, """
        import threading, time
        n = 0
        try:
            while True:
                threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
                n += 1
        except Exception as e:
            print("stopped after", n, type(e).__name__)
    """, timeout_s=3.0)
    assert r.status == "finished" and "stopped after" in r.stdout
    assert int(r.stdout.split()[2]) < 64
    assert_healthy(pool)


@pytest.mark.parametrize("code", [
    "x = bytearray(8 << 30)",
    "x = []\nwhile True: x.append(' ' * (1 << 20))",
])
def test_memory_bomb(pool, isolated, sentinel, code):
    r = run(pool, code, memory_mb=200)
    assert r.status == "finished" and r.exit_code != 0 and r.memory_exceeded
    assert_healthy(pool)


@pytest.mark.parametrize("code", [
    "while True: print('x' * 100)",
    "import sys\nwhile True: sys.stderr.write('y' * 100)",
    "import sys\nsys.stdout.write('z' * (50 << 20))",
])
def test_output_floods_are_cut(pool, code):
    r = run(pool, code, timeout_s=5.0)
    assert r.status == "output_limit"
    assert len(r.stdout) + len(r.stderr) <= (64 << 10)


def test_invalid_utf8_output(pool):
    r = run(pool, "import os\nos.write(1, b'ok \\xff\\xfe\\xc3 end')\nos.write(2, b'\\x80')")
    assert r.status == "finished" and r.stdout.startswith("ok ") and "\ufffd" in r.stdout
    assert r.stderr == "\ufffd"


def test_huge_file_and_many_files(pool):
    r = run(pool, """
        with open('big', 'wb') as f:
            f.write(b'x' * (100 << 20))
    """)
    assert r.status == "finished" and r.exit_code != 0
    r = run(pool, """
        import os
        n = 0
        try:
            while n < 200000:
                with open(f'f{n}', 'w') as f:
                    f.write('x')
                n += 1
        except OSError as e:
            print('stopped', n, e.errno)
    """, timeout_s=10.0)
    assert r.status in ("finished", "timeout")
    assert_healthy(pool)


# --- state between runs ---------------------------------------------------------------------


def test_nothing_persists_between_runs(solo):
    r = run(solo, """
        import os
        for p in ('/tmp/left', '/dev/shm/left', 'left', '/tmp/json.py'):
            with open(p, 'w') as f:
                f.write('import sys; sys.exit(7)')
        os.mkdir('/tmp/locked'); open('/tmp/locked/x', 'w').close(); os.chmod('/tmp/locked', 0)
        with open('json.py', 'w') as f:
            f.write('raise SystemExit(9)')
        print(os.getcwd())
    """)
    assert r.status == "finished", r
    r = run(solo, """
        import os, json
        print(json.dumps([os.path.exists(p) for p in ('/tmp/left', '/dev/shm/left', 'left', '/tmp/locked')]))
        print(os.listdir('/tmp'), os.listdir('/dev/shm'), os.listdir('.'))
    """)
    assert r.status == "finished" and r.stdout.startswith("[false, false, false, false]"), r
    assert r.stdout.split("\n")[1] == "['run'] [] []"


def test_double_forked_daemon_is_killed(solo):
    r = run(solo, """
        import os, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                import signal
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
                time.sleep(0.3)
                open('/tmp/daemon-was-here', 'w').close()
                time.sleep(300)
            os._exit(0)
        print('parent done')
    """)
    assert r.status == "finished" and r.stdout == "parent done\n"
    r = run(solo, """
        import os, time
        time.sleep(0.6)
        pids = [int(p) for p in os.listdir('/proc') if p.isdigit()]
        print(len(pids), os.path.exists('/tmp/daemon-was-here'))
    """)
    # pid 1 (the sandbox's init), the worker, this run
    assert r.stdout == "3 False\n", r


# --- the host's files, processes, secrets and network ----------------------------------------


def test_cannot_write_outside(pool, tmp_path):
    target = tmp_path / "pwned"
    r = run(pool, f"""
        import os
        ok = []
        for p in ('/usr/pwned', '/etc/pwned', '/pwned', '/dev/pwned', {str(target)!r}, '/root/pwned',
                  '/proc/sys/kernel/hostname'):
            try:
                with open(p, 'w') as f:
                    f.write('x')
                ok.append(p)
            except OSError:
                pass
        import sysconfig
        try:
            open(sysconfig.get_paths()['stdlib'] + '/json/__init__.py', 'a').close()
            ok.append('stdlib')
        except OSError:
            pass
        print(ok)
    """)
    assert r.stdout == "[]\n", r
    assert not target.exists() and not os.path.exists("/usr/pwned")
    assert run(pool, "import json; print(json.dumps(1))").stdout == "1\n"


def test_secrets_and_other_processes_are_unreadable(pool, monkeypatch):
    monkeypatch.setenv("POSTRL_TEST_SECRET", "hunter2-secret")
    r = run(pool, """
        import os
        seen = [os.environ.get(k, '') for k in os.environ]
        for pid in os.listdir('/proc'):
            try:
                seen.append(open(f'/proc/{pid}/environ', 'rb').read().decode(errors='replace'))
            except OSError:
                pass
        for p in ('/etc/shadow', '/etc/passwd', '/root/.bash_history', f'/proc/{os.getppid()}/mem'):
            try:
                seen.append(open(p, 'rb').read(100).decode(errors='replace'))
                print('read', p)
            except OSError:
                pass
        print('secret' in ''.join(seen), sorted(os.environ))
    """)
    assert "hunter2" not in r.stdout and "read" not in r.stdout
    assert r.stdout.startswith("False ['HOME', 'LANG', 'PATH', 'PWD', 'TMPDIR']"), r


def test_network_is_refused(pool):
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    srv.settimeout(0.5)
    port = srv.getsockname()[1]
    hits = []

    def accept():
        try:
            hits.append(srv.accept())
        except OSError:
            pass

    t = threading.Thread(target=accept)
    t.start()
    r = run(pool, f"""
        import socket, ctypes
        out = []
        for fam, kind in ((socket.AF_INET, socket.SOCK_STREAM), (socket.AF_INET, socket.SOCK_DGRAM),
                          (socket.AF_INET6, socket.SOCK_STREAM)):
            try:
                s = socket.socket(fam, kind)
                s.settimeout(0.5)
                s.connect(('127.0.0.1', {port}) if fam == socket.AF_INET else ('::1', {port}))
                out.append('connected')
            except OSError as e:
                out.append(e.errno)
        libc = ctypes.CDLL(None, use_errno=True)
        out.append(libc.syscall(41, 2, 1, 0))  # socket(AF_INET, SOCK_STREAM) by raw syscall
        print(out)
    """)
    t.join()
    srv.close()
    assert not hits, "the sandbox reached a host listener"
    assert "connected" not in r.stdout and r.stdout.strip().endswith("-1]"), r


def test_ctypes_escape_syscalls_are_refused(pool):
    r = run(pool, """
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        calls = {
            'unshare_user': libc.syscall(272, 0x10000000),
            'unshare_ns': libc.unshare(0x00020000),
            'mount': libc.mount(b'none', b'/tmp', b'tmpfs', 0, None),
            'ptrace': libc.ptrace(16, 1, 0, 0),
            'setns': libc.setns(os.open('/proc/self/ns/net', os.O_RDONLY), 0),
            'chroot': libc.chroot(b'/tmp'),
            'bpf': libc.syscall(321, 0, 0, 0),
            'clone_newuser': libc.syscall(56, 0x10000000 | 17, 0, 0, 0, 0),
        }
        print(sorted(k for k, v in calls.items() if v != -1))
        print(open('/proc/self/status').read().split('Seccomp:')[1].split()[0])
    """)
    assert r.stdout == "[]\n2\n", r


def test_killing_the_parent_and_everything(pool, isolated, sentinel):
    me = os.getpid()
    r = run(pool, f"""
        import os, signal
        for pid in ({me}, os.getppid()):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    """)
    assert r.status in ("finished", "error")
    r = run(pool, "import os, signal\nos.kill(-1, signal.SIGKILL)\nprint('still here')")
    assert r.status in ("finished", "error")
    assert_healthy(pool)


def test_unisolated_mode_is_refused_unless_allowed():
    with pytest.raises(SandboxUnavailable, match="allow_unisolated"):
        SandboxPool(SandboxConfig(workers=1, use_bwrap=False))
    with SandboxPool(SandboxConfig(workers=1, use_bwrap=False, allow_unisolated=True)) as p:
        r = p.run(RunRequest(code="import os\nopen('f', 'w').write('1')\nprint(os.listdir('.'))"))
        assert r.status == "finished" and r.stdout == "['f']\n"
        assert not r.isolation.startswith("bwrap") and "rlimits" in r.isolation
        assert ("uid" in r.isolation) == (os.geteuid() == 0)
