"""Problem sources (domains): each module defines and registers one (`rgym` one per reasoning-gym
data set, `rg:<dataset>`); `base` holds the registry and the `Domain` protocol, `catalog` imports
every built-in domain and builds the recipe's. This file imports nothing, so importing one domain
module does not import the others."""
