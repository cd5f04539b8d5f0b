"""The backend's name for the Settings it shares with the worker (paralab_core/config.py holds
them, every PARALAB_* variable and its default)."""

from paralab_core.config import Settings, get_settings

__all__ = ["Settings", "get_settings"]
