"""The sandbox a code grader runs on, started on first use. Shared by the `code` domain and the
`code` verifier of dataset domains.

    handle = SandboxHandle(settings, "domain code", "domains.code.params.allow_unisolated")
    handle.get()          # a SandboxPool of this process's own, or a SandboxFusion server's
                          # client (settings.sandbox_url), made on the first call
    handle.use(backend)   # run on `backend` instead (anything with `run_many`: the Ray sandbox actor)
    handle.close()        # stops a pool this handle started
"""

from __future__ import annotations

import os
import threading

from postrl.errors import UserError
from postrl.sandbox.client import RemoteSandbox
from postrl.sandbox.pool import SandboxPool
from postrl.sandbox.runs import SandboxConfig, SandboxUnavailable
from postrl.sandbox.settings import SandboxSettings


class SandboxHandle:
    def __init__(self, settings: SandboxSettings, owner: str, allow_unisolated_key: str):
        self.url, self.workers, self.owner = settings.sandbox_url, settings.workers, owner
        self.config: SandboxConfig | None = settings.pool_config(allow_unisolated_key)
        """The local pool's config; None when the settings name a sandbox server."""
        self._backend = None
        self._lock = threading.Lock()

    def get(self):
        with self._lock:
            if self._backend is None:
                self._backend = self._make()
            return self._backend

    def use(self, backend) -> None:
        self.close()
        with self._lock:
            self._backend = backend

    def close(self) -> None:
        with self._lock:
            if isinstance(self._backend, SandboxPool):
                self._backend.close()
            self._backend = None

    def _make(self):
        if self.config is None:
            return RemoteSandbox(self.url, concurrency=max(1, self.workers or (os.cpu_count() or 1)))
        try:
            return SandboxPool(self.config)
        except SandboxUnavailable as e:
            raise UserError(f"{self.owner}: {e}") from None
