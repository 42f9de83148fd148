"""A second hook module (its own plugin name), for ordering between modules."""

from .hook_module import mount

__all__ = ["mount"]
