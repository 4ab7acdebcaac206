"""Problem sources (domains). Importing this package registers the built-in domains:
`arith`, `code`, `sort`, and the reasoning-gym families (`rg:<dataset>`)."""

import postrl.tasks.chat_arith  # noqa: F401  (registers "chat_arith")
import postrl.tasks.chat_count  # noqa: F401  (registers "chat_count")
from postrl.records import Response, Task
from postrl.tasks import arith, code, rgym, sort  # noqa: F401  (importing a module registers its domains)
from postrl.tasks.base import Domain, available_domains, make_domain, register_domain

__all__ = ["Domain", "Response", "Task", "available_domains", "make_domain", "register_domain"]
