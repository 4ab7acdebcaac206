"""Problem sources (domains). Importing this package registers the built-in domains."""

import postrl.tasks.rgym  # noqa: F401  (registers the "rg:<dataset>" domains)
from postrl.tasks import arith  # noqa: F401  (registers "arith")
from postrl.tasks import code  # noqa: F401
from postrl.tasks.base import Domain, Response, Task, available_domains, make_domain, register_domain

__all__ = ["Domain", "Response", "Task", "available_domains", "make_domain", "register_domain"]
