"""Adapters to the frameworks and formats agents are written in; each is an optional extra.

Nothing here is imported by ``import jianmu_fast``: each submodule imports its framework
lazily and raises ``ImportError`` naming the extra to install when it is missing.
"""
