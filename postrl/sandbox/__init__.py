"""Isolated execution of untrusted, model-written programs.

This package imports nothing from the rest of postrl, and this file imports nothing at all:
`postrl.sandbox.pool` holds the pool (`SandboxPool`: a free worker per request, elastic),
`postrl.sandbox.worker` a worker's life (started isolated, handed runs, stopped), and
`postrl.sandbox.runs` what a run is (`SandboxConfig`, `RunRequest`, `RunResult`).

Threat model
============
The programs are written by a policy under optimisation pressure: assume they will, by
accident or by reward hacking, do anything a Python or bash program can do. The sandbox
protects:

* the host: files outside the sandbox are invisible or read-only (/usr only; no /etc beyond
  ld.so.cache, no home, no /proc of the host); writes go to a private size-limited tmpfs;
  there is no network (own network namespace with only its own loopback, and a seccomp filter
  that refuses non-AF_UNIX sockets); host processes are invisible and unreachable (own pid
  namespace; as root, a distinct unprivileged uid per worker), so kill(-1), killing the parent
  and reading other processes' environ affect only the sandbox; no new namespaces, mounts,
  ptrace, bpf, keyrings, modules or io_uring (seccomp + --disable-userns); rlimits bound
  memory (address space), CPU seconds, processes/threads, file size and open files; a
  wall-clock timeout, an output cap, and a sweep that kills every process a run started
  (kill(-1) inside the private pid namespace; the worker is a child subreaper) end every run.
* later runs: each run gets a fresh working directory; /tmp and /dev/shm are wiped between
  runs; the worker that forks runs is not dumpable (a run cannot read or write its memory or
  file descriptors) and is replaced when a run kills it or after `runs_per_worker` runs.
* the reward: a verdict never comes from the candidate's exit code or from anything its
  process can forge. Expected outputs never enter the candidate's process: the candidate's
  return values come back as plain data (JSON of exact built-in types; any other object is
  opaque and equals nothing), and the test's own assertions are evaluated by a separate
  judge run that never executes candidate code (see `judge.py`).

It does not protect against:

* kernel exploits (the sandbox shares the host kernel; seccomp narrows but does not remove
  that surface), or bugs in bubblewrap itself;
* resource contention: CPU, memory bandwidth and page cache are shared; without cgroups,
  memory is bounded per process (RLIMIT_AS) not per run, so a run may use up to
  `max_procs` x `memory_mb`;
* side channels and timing; reading what the sandbox itself can legitimately see (/usr, the
  Python standard library, its own inputs);
* a test whose expected values are stored in variables rather than written in the
  assertion: such values are visible to the candidate (it can read the test source), so a
  program could copy them; inline expected values, the common case, are removed;
* weaker environments: without bubblewrap (or without user namespaces) the pool refuses to
  run unless `allow_unisolated=True`, and then only rlimits, seccomp and (as root) a separate
  uid apply: the host filesystem is readable and, without a separate uid, other processes of
  the same user are reachable. The level actually used is recorded on every result
  (`RunResult.isolation`, e.g. 'bwrap+seccomp+uid+rlimits').
"""
