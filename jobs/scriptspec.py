"""The `script` section of a job spec: a user's own training script, run on every rank by
jobs/script_runner.py under torch.profiler (docs/scripts.md). Standard library only, like
jobs/spec.py, which parses the section with `parse_script` (errors name `script.<field>`).

What is checked here is what could reach a process: the entry is a relative path inside the
uploaded working directory (or a dotted module name), the arguments are a list of strings (never
a shell string: nothing runs through a shell), and the environment names come from a pattern
that leaves out the variables torchrun, the runner and the dynamic loader own.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

MAX_ARGS, MAX_ARG_LEN = 256, 4096
MAX_ENV, MAX_ENV_VALUE = 64, 4096
MAX_ENTRY, MAX_REGEX = 300, 500
_PATH_RE = re.compile(r"^[A-Za-z0-9_.\-/]+\.py$")
_MODULE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_SHA_RE = re.compile(r"^[0-9a-f]{64}$")
ENV_NAME_RE = re.compile(r"^[A-Z][A-Z0-9_]{0,63}$")
# owned by torchrun, the runner, the interpreter or the dynamic loader: never the user's
ENV_RESERVED_PREFIXES = ("PARALAB_", "MASTER_", "TORCHELASTIC_", "TORCH_ELASTIC_", "LD_",
                         "PYTHON", "GROUP_", "ROLE_", "DYLD_")
ENV_RESERVED = frozenset({"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK",
                          "PATH", "HOME", "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES"})


@dataclass(frozen=True)
class ScriptSpec:
    """A user's own training script (kind `script`; docs/scripts.md)."""
    entry: str = field(default="", metadata={
        "doc": "what to run: a path relative to the working directory ending in .py "
               "(train.py, src/train.py), or '-m pkg.module'", "empty_ok": True})
    args: tuple = field(default=(), metadata={
        "doc": f"the script's arguments (sys.argv[1:]): a list of strings, at most {MAX_ARGS}, "
               "never a shell string"})
    env: dict = field(default_factory=dict, metadata={
        "doc": "extra environment variables {NAME: value}; names match "
               "[A-Z][A-Z0-9_]{0,63}, not torchrun's, the runner's (PARALAB_*) or the "
               "loader's (LD_*, PYTHON*)"})
    upload: str = field(default="", metadata={
        "doc": "sha256 (hex) of the uploaded working-directory archive; '' = none",
        "empty_ok": True})
    tokens_per_step: int = field(default=0, metadata={
        "doc": "tokens (or samples) one optimizer step processes over all ranks, for "
               "tokens/s; 0 = unknown", "ge": 0, "le": 10**12})
    log_regex: str = field(default="", metadata={
        "doc": "optional regex with named groups read from rank 0's output, e.g. "
               "'loss=(?P<loss>[0-9.eE+-]+)' (a `step` group names the step); '' = none",
        "empty_ok": True})


def entry_problem(entry: str) -> str | None:
    """Why `entry` is not a safe relative script path or '-m module' (None: it is)."""
    if len(entry) > MAX_ENTRY:
        return f"at most {MAX_ENTRY} characters"
    if entry.startswith("-m"):
        if entry[:3] != "-m " or not _MODULE_RE.match(entry[3:]):
            return "'-m' must be followed by one space and a module name ([A-Za-z0-9_.])"
        return None
    if not _PATH_RE.match(entry):
        return "must be a relative path ending in .py ([A-Za-z0-9_.-/]) or '-m pkg.module'"
    parts = entry.split("/")
    if entry.startswith("/") or any(p in ("", ".", "..") for p in parts):
        return "must be a relative path inside the working directory (no leading /, no .., " \
               "no empty or '.' parts)"
    return None


def env_name_problem(name: str) -> str | None:
    if not ENV_NAME_RE.match(name):
        return "names must match [A-Z][A-Z0-9_]{0,63}"
    if name in ENV_RESERVED or name.startswith(ENV_RESERVED_PREFIXES):
        return f"{name} is set by torchrun, the runner or the interpreter, not by a spec"
    return None


def _e(field_: str, msg: str, typ: str = "value_error") -> dict:
    return {"loc": ["script", field_], "msg": msg, "type": typ}


def _text_ok(value, field_: str, limit: int, errors: list, empty_ok: bool = True) -> bool:
    if not isinstance(value, str):
        errors.append(_e(field_, "must be a string", "string_type"))
        return False
    if "\x00" in value:
        errors.append(_e(field_, "must not contain NUL characters (U+0000)", "string_unsafe"))
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        errors.append(_e(field_, "must not contain lone surrogates", "string_unsafe"))
        return False
    if len(value) > limit or (not empty_ok and not value):
        errors.append(_e(field_, f"must be {0 if empty_ok else 1} to {limit} characters",
                         "string_length"))
        return False
    return True


def parse_script(value, errors: list) -> ScriptSpec:
    """The `script` section -> ScriptSpec; problems go to `errors` (jobs/spec.py's shape)."""
    if not isinstance(value, dict):
        errors.append({"loc": ["script"], "msg": "must be an object", "type": "dict_type"})
        return ScriptSpec()
    fields = ScriptSpec.__dataclass_fields__
    for key in value:
        if key not in fields:
            errors.append(_e(key, f"unknown field; allowed: {', '.join(fields)}",
                             "extra_forbidden"))
    kw: dict = {}
    if "entry" in value and _text_ok(value["entry"], "entry", MAX_ENTRY, errors):
        if value["entry"] and (p := entry_problem(value["entry"])):
            errors.append(_e("entry", p))
        else:
            kw["entry"] = value["entry"]
    if "args" in value:
        a = value["args"]
        if not isinstance(a, list):
            errors.append(_e("args", "must be a list of strings (never a shell string)",
                             "list_type"))
        elif len(a) > MAX_ARGS:
            errors.append(_e("args", f"at most {MAX_ARGS} arguments", "too_long"))
        elif all(_text_ok(x, "args", MAX_ARG_LEN, errors) for x in a):
            kw["args"] = tuple(a)
    if "env" in value:
        env = value["env"]
        if not isinstance(env, dict):
            errors.append(_e("env", "must be an object {NAME: value}", "dict_type"))
        elif len(env) > MAX_ENV:
            errors.append(_e("env", f"at most {MAX_ENV} variables", "too_long"))
        else:
            n0 = len(errors)
            for k, v in env.items():
                if p := env_name_problem(str(k)):
                    errors.append(_e("env", p))
                else:
                    _text_ok(v, "env", MAX_ENV_VALUE, errors)
            if len(errors) == n0:
                kw["env"] = dict(env)
    if "upload" in value and _text_ok(value["upload"], "upload", 64, errors):
        if value["upload"] and not _SHA_RE.match(value["upload"]):
            errors.append(_e("upload", "must be a sha256 in lowercase hex (64 characters) "
                             "or ''"))
        else:
            kw["upload"] = value["upload"]
    if "tokens_per_step" in value:
        t = value["tokens_per_step"]
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t <= 10**12:
            errors.append(_e("tokens_per_step", "must be an integer from 0 to 10^12",
                             "int_type"))
        else:
            kw["tokens_per_step"] = t
    if "log_regex" in value and _text_ok(value["log_regex"], "log_regex", MAX_REGEX, errors):
        try:
            rx = re.compile(value["log_regex"])
        except re.error as exc:
            errors.append(_e("log_regex", f"not a regular expression: {exc}"))
        else:
            if value["log_regex"] and not rx.groupindex:
                errors.append(_e("log_regex", "needs at least one named group, e.g. "
                                 "(?P<loss>[0-9.eE+-]+)"))
            else:
                kw["log_regex"] = value["log_regex"]
    return ScriptSpec(**kw)


def script_checks(spec) -> list[dict]:
    """Cross-field rules: a script job needs an entry; other kinds leave the section unset;
    the profiler has no detail levels or record cap (trace.level / max_records)."""
    s = spec.script
    if spec.kind != "script":
        return [] if s == ScriptSpec() else [
            {"loc": ["script"], "msg": "the script section applies to script jobs only",
             "type": "value_error"}]
    e = [] if s.entry else [_e("entry", "a script job needs an entry (train.py or "
                                "'-m pkg.module')", "missing")]
    t = spec.trace
    if t.level != "layer":
        e.append({"loc": ["trace", "level"], "msg": "a script is traced by torch.profiler, "
                  "which has no detail levels: leave trace.level unset", "type": "value_error"})
    if t.max_records:
        e.append({"loc": ["trace", "max_records"], "msg": "torch.profiler has no record cap: "
                  "bound a script's trace with the schedule", "type": "value_error"})
    return e


def schema() -> dict:
    """JSON Schema of the section (jobs.spec.json_schema)."""
    d = ScriptSpec.__dataclass_fields__
    doc = {k: f.metadata["doc"] for k, f in d.items()}
    return {"type": "object", "additionalProperties": False, "description": ScriptSpec.__doc__,
            "properties": {
                "entry": {"type": "string", "default": "", "maxLength": MAX_ENTRY,
                          "description": doc["entry"]},
                "args": {"type": "array", "maxItems": MAX_ARGS, "default": [],
                         "items": {"type": "string", "maxLength": MAX_ARG_LEN},
                         "description": doc["args"]},
                "env": {"type": "object", "maxProperties": MAX_ENV, "default": {},
                        "propertyNames": {"pattern": ENV_NAME_RE.pattern},
                        "additionalProperties": {"type": "string", "maxLength": MAX_ENV_VALUE},
                        "description": doc["env"]},
                "upload": {"type": "string", "default": "", "pattern": "^([0-9a-f]{64})?$",
                           "description": doc["upload"]},
                "tokens_per_step": {"type": "integer", "minimum": 0, "maximum": 10**12,
                                    "default": 0, "description": doc["tokens_per_step"]},
                "log_regex": {"type": "string", "default": "", "maxLength": MAX_REGEX,
                              "description": doc["log_regex"]}}}
