"""Work behind the routes that spans several steps, shared by the API and the CLI. Services
raise domain errors (backend/errors.py), never HTTP exceptions."""

from backend.services.accounts import change_password, check_login
from backend.services.runs import cancel, delete, edit, memory_gate, submit

__all__ = ["cancel", "change_password", "check_login", "delete", "edit", "memory_gate",
           "submit"]
