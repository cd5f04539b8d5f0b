"""The team deployment (docker-compose.yml, docker/*.Dockerfile) without a Docker engine.

`docker compose config` cannot run here, so this does what it does: interpolate `${VAR}`
references the way Compose does, then validate the result against the Compose
Specification's JSON schema (vendored in tests/data/, see its README), and then checks what
paralab needs of the file: services, health-gated start-up, a pool of GPU workers on one
queue, no secret with a default, Dockerfiles that exist and build what pyproject.toml declares.
"""

from __future__ import annotations

import copy
import fnmatch
import json
import re
import shlex
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema import FormatChecker
from jsonschema.validators import Draft201909Validator, validator_for

ROOT = Path(__file__).resolve().parents[1]
COMPOSE_FILE = ROOT / "docker-compose.yml"
SCHEMA_FILE = ROOT / "tests" / "data" / "compose_spec.json"
DOCKERIGNORE = ROOT / ".dockerignore"

# What a deployment must provide; each is a `${VAR:?message}` reference in the file.
REQUIRED_SECRETS = ("PARALAB_SECRET_KEY", "PARALAB_WORKER_TOKEN", "POSTGRES_PASSWORD",
                    "REDIS_PASSWORD")
# Distinctive values, so that a test can tell a substituted secret from a literal one.
TEST_ENV = {name: f"test-{name.lower().replace('_', '-')}-0123abcd" for name in REQUIRED_SECRETS}
SECRET_NAME = re.compile(r"(PASSWORD|PASSWD|SECRET|TOKEN|_KEY|AUTH)$|^REDISCLI_AUTH$")
PLACEHOLDERS = ("changeme", "change-me", "change_me", "password123", "secret123",
                "insecure", "dev-secret", "placeholder", "xxxxxx")


# --- Compose variable interpolation ---------------------------------------------------------

class InterpolationError(ValueError):
    pass


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_OPERATORS = (":-", ":?", ":+", "-", "?", "+")


def _closing_brace(text: str, start: int) -> int:
    """Index of the `}` closing the `${` whose body starts at `start` (nesting allowed)."""
    depth = 1
    i = start
    while i < len(text):
        if text.startswith("$$", i):
            i += 2
            continue
        if text.startswith("${", i):
            depth += 1
            i += 2
            continue
        if text[i] == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    raise InterpolationError(f"invalid interpolation format (unclosed ${{): {text!r}")


def interpolate(text: str, env: Mapping[str, str], refs: list | None = None) -> str:
    """Substitute like Compose: `$$` is a literal `$`; `$VAR`, `${VAR}` (unset -> empty);
    `${VAR:-default}` / `${VAR-default}` (default when unset-or-empty / unset);
    `${VAR:?error}` / `${VAR?error}` (fail when unset-or-empty / unset);
    `${VAR:+alt}` / `${VAR+alt}`. Defaults and alternatives may nest further references.
    Every reference seen is appended to `refs` as (name, operator, argument)."""
    out: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch != "$":
            out.append(ch)
            i += 1
            continue
        if text.startswith("$$", i):
            out.append("$")
            i += 2
            continue
        if text.startswith("${", i):
            end = _closing_brace(text, i + 2)
            body = text[i + 2:end]
            i = end + 1
            m = _NAME.match(body)
            if not m:
                raise InterpolationError(f"invalid interpolation format: ${{{body}}}")
            name, rest = m.group(0), body[m.end():]
            op = next((o for o in _OPERATORS if rest.startswith(o)), None)
            if rest and op is None:
                raise InterpolationError(f"invalid interpolation format: ${{{body}}}")
            arg = rest[len(op):] if op else ""
            if refs is not None:
                refs.append((name, op, arg))
            value = env.get(name)
            if op is None:
                out.append(value or "")
            elif op in (":-", "-"):
                missing = value is None or (op == ":-" and value == "")
                out.append(interpolate(arg, env, refs) if missing else value)
            elif op in (":?", "?"):
                if value is None or (op == ":?" and value == ""):
                    raise InterpolationError(f"required variable {name} is missing a value: "
                                             f"{interpolate(arg, env)}")
                out.append(value)
            else:  # ":+" / "+"
                present = value is not None and (op == "+" or value != "")
                out.append(interpolate(arg, env, refs) if present else "")
            continue
        m = _NAME.match(text, i + 1)
        if not m:
            raise InterpolationError(f"invalid interpolation format at {i}: {text!r}")
        if refs is not None:
            refs.append((m.group(0), None, ""))
        out.append(env.get(m.group(0)) or "")
        i = m.end()
    return "".join(out)


def interpolate_tree(node: Any, env: Mapping[str, str], refs: list | None = None) -> Any:
    """Compose interpolates every string value (not keys) of the loaded YAML."""
    if isinstance(node, dict):
        return {k: interpolate_tree(v, env, refs) for k, v in node.items()}
    if isinstance(node, list):
        return [interpolate_tree(v, env, refs) for v in node]
    if isinstance(node, str):
        return interpolate(node, env, refs)
    return node


def test_interpolation_follows_compose_rules():
    env = {"SET": "v", "EMPTY": ""}
    assert interpolate("a$$b", env) == "a$b"
    assert interpolate("$SET/${SET}/${UNSET}", env) == "v/v/"
    assert interpolate("${UNSET:-d} ${EMPTY:-d} ${EMPTY-d} ${UNSET-d}", env) == "d d  d"
    assert interpolate("${UNSET:-${SET}x}", env) == "vx"
    assert interpolate("${SET:+alt} ${EMPTY:+alt} ${EMPTY+alt}", env) == "alt  alt"
    assert interpolate("${SET:?boom}", env) == "v"
    assert interpolate("${EMPTY?boom}", env) == ""
    for bad in ("${UNSET:?boom}", "${EMPTY:?boom}", "${UNSET?boom}"):
        with pytest.raises(InterpolationError, match="boom"):
            interpolate(bad, env)
    for bad in ("${", "${1X}", "${SET!x}", "$ x"):
        with pytest.raises(InterpolationError, match="invalid interpolation"):
            interpolate(bad, env)


# --- Loading ----------------------------------------------------------------------------------

def load_raw() -> dict:
    assert COMPOSE_FILE.is_file(), f"{COMPOSE_FILE} is missing"
    doc = yaml.safe_load(COMPOSE_FILE.read_text())
    assert isinstance(doc, dict), "docker-compose.yml must be a mapping"
    return doc


@pytest.fixture(scope="module")
def raw() -> dict:
    return load_raw()


@pytest.fixture(scope="module")
def compose(raw) -> dict:
    return interpolate_tree(raw, TEST_ENV)


@pytest.fixture(scope="module")
def schema() -> dict:
    return json.loads(SCHEMA_FILE.read_text())


def make_validator(schema: dict):
    cls = validator_for(schema, default=None)
    assert cls is not None, f"unknown $schema {schema.get('$schema')!r}"
    cls.check_schema(schema)
    checker = FormatChecker()

    @checker.checks("duration")
    def _duration(value: object) -> bool:
        return not isinstance(value, str) or parse_duration(value) is not None

    return cls(schema, format_checker=checker)


def env_of(service: dict) -> dict[str, str]:
    """A service's `environment`, in either of Compose's forms, as a dict."""
    env = service.get("environment") or {}
    if isinstance(env, list):
        return dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {k: "" if v is None else str(v) for k, v in env.items()}


def argv(command: Any) -> list[str]:
    return shlex.split(command) if isinstance(command, str) else [str(a) for a in command or []]


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_DURATION_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1, "m": 60, "h": 3600}


def parse_duration(text: str) -> float | None:
    """Seconds in a Go duration ("1m30s"), as Compose reads stop_grace_period etc."""
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    return sum(float(n) * _DURATION_S[u] for n, u in parts)


def parse_bytes(value: Any) -> int:
    if isinstance(value, int):
        return value
    m = re.fullmatch(r"(\d+)\s*([kmg]?)b?", str(value).strip().lower())
    assert m, f"unreadable size {value!r}"
    return int(m.group(1)) * 1024 ** " kmg".index(m.group(2) or " ")


def workers(compose: dict) -> dict[str, dict]:
    return {n: s for n, s in compose["services"].items() if n.startswith("worker-")}


# --- Schema ---------------------------------------------------------------------------------

def test_vendored_schema_is_the_compose_spec(schema):
    assert schema.get("title") == "Compose Specification"
    assert validator_for(schema, default=None) is Draft201909Validator
    make_validator(schema)  # check_schema: the schema itself is valid
    service = schema["definitions"]["service"]["properties"]
    # What this file relies on, so that an older schema cannot be swapped in unnoticed.
    assert "devices" in json.dumps(schema["definitions"]["deployment"])
    assert "service_healthy" in json.dumps(service["depends_on"])
    assert "start_period" in schema["definitions"]["healthcheck"]["properties"]


def test_compose_file_validates_against_the_compose_spec(compose, schema):
    errors = sorted(make_validator(schema).iter_errors(compose), key=lambda e: list(e.path))
    assert not errors, "docker-compose.yml does not follow the Compose spec:\n" + "\n".join(
        f"  at {'/'.join(map(str, e.path)) or '<root>'}: {e.message}" for e in errors)


@pytest.mark.parametrize("mutate", [
    lambda d: d["services"]["backend"]["depends_on"]["postgres"].update(condition="healthy"),
    lambda d: d["services"]["postgres"].update(health_check={"test": ["CMD", "true"]}),
    lambda d: d["services"]["worker-gpu0"]["deploy"]["resources"]["reservations"].update(
        gpus=1),
    lambda d: d["services"]["worker-gpu0"].update(stop_grace_period="two minutes"),
    lambda d: d.update(volume={}),
], ids=["bad-condition", "misspelt-key", "bad-reservation", "bad-duration", "bad-top-level"])
def test_schema_validation_catches_mistakes(compose, schema, mutate):
    """The validation above is not vacuous: typical mistakes are rejected."""
    broken = copy.deepcopy(compose)
    mutate(broken)
    assert list(make_validator(schema).iter_errors(broken))


# --- Secrets ----------------------------------------------------------------------------------

def test_every_variable_reference_is_required_or_defaulted(raw):
    refs: list = []
    interpolate_tree(raw, TEST_ENV, refs)
    bare = sorted({name for name, op, _ in refs if op is None})
    assert not bare, f"${{VAR}} without :? or :- silently becomes empty: {bare}"
    required = {name for name, op, _ in refs if op == ":?"}
    assert required == set(REQUIRED_SECRETS)
    for name, op, arg in refs:
        if SECRET_NAME.search(name):
            assert op == ":?", f"secret {name} must be ${{{name}:?...}}, not {op!r}{arg!r}"
            assert name in arg, f"the error for {name} must name it: {arg!r}"


@pytest.mark.parametrize("missing", REQUIRED_SECRETS)
@pytest.mark.parametrize("value", [None, ""], ids=["unset", "empty"])
def test_missing_secret_refuses_to_interpolate(raw, missing, value):
    env = dict(TEST_ENV)
    if value is None:
        del env[missing]
    else:
        env[missing] = value
    with pytest.raises(InterpolationError, match=f"set {missing}"):
        interpolate_tree(raw, env)


def test_no_literal_secret_anywhere(raw):
    text = COMPOSE_FILE.read_text()
    for word in PLACEHOLDERS:
        assert word not in text.lower(), f"placeholder {word!r} in docker-compose.yml"
    literal = re.compile(r"(?i)\w*(password|secret|token)\w*\s*[:=]\s*(?!\$\{)[\"']?\w")
    for number, line in enumerate(text.splitlines(), 1):
        if not line.lstrip().startswith("#"):
            assert not literal.search(line), f"line {number} sets a literal secret: {line}"
    required = re.compile(r"\$\{(" + "|".join(REQUIRED_SECRETS) + r"):\?[^}]*\}")
    for name, service in raw["services"].items():
        for key, value in env_of(service).items():
            if SECRET_NAME.search(key) and key != "PARALAB_AUTH":
                assert required.fullmatch(value), f"{name}: {key} must be a required variable"
            for userinfo in re.findall(r"://[^/\s:@]*:([^@\s]+)@", value):
                assert required.fullmatch(userinfo), f"{name}: {key} embeds a literal password"
        args = argv(service.get("command"))
        for flag, val in zip(args, args[1:], strict=False):
            if flag in ("--requirepass", "--password", "--secret-key", "--token"):
                assert required.fullmatch(val), f"{name}: {flag} takes a literal"


def test_secrets_arrive_where_they_are_needed(compose):
    pg = TEST_ENV["POSTGRES_PASSWORD"]
    rd = TEST_ENV["REDIS_PASSWORD"]
    services = compose["services"]
    assert env_of(services["postgres"])["POSTGRES_PASSWORD"] == pg
    backend = env_of(services["backend"])
    assert backend["DATABASE_URL"] == f"postgresql+psycopg://paralab:{pg}@postgres:5432/paralab"
    assert backend["REDIS_URL"] == f"redis://:{rd}@redis:6379/0"
    assert backend["PARALAB_AUTH"] == "required"
    assert backend["PARALAB_SECRET_KEY"] == TEST_ENV["PARALAB_SECRET_KEY"]
    assert backend["PARALAB_WORKER_TOKEN"] == TEST_ENV["PARALAB_WORKER_TOKEN"]
    assert rd in argv(services["redis"]["command"]), "redis-server must require the password"


# --- Services -------------------------------------------------------------------------------

def test_services_present(compose):
    services = compose["services"]
    for name in ("redis", "postgres", "backend"):
        assert name in services, f"service {name} missing"
    assert workers(compose), "no worker-<host> service"


def named_volume_mounts(service: dict) -> Iterator[tuple[str, str]]:
    for vol in service.get("volumes") or []:
        if isinstance(vol, str):
            parts = vol.split(":")
            if len(parts) >= 2 and not parts[0].startswith(("/", ".", "~")):
                yield parts[0], parts[1]
        elif vol.get("type", "volume") == "volume" and vol.get("source"):
            yield vol["source"], vol["target"]


def test_named_volumes_declared_and_used_for_state(compose):
    declared = set(compose.get("volumes") or {})
    services = compose["services"]
    for name, service in services.items():
        for source, _ in named_volume_mounts(service):
            assert source in declared, f"{name}: volume {source} not declared at top level"
    assert "/data" in dict(map(reversed, named_volume_mounts(services["redis"])))
    assert "/var/lib/postgresql/data" in dict(
        map(reversed, named_volume_mounts(services["postgres"])))


def test_redis_is_persistent(compose):
    args = argv(compose["services"]["redis"]["command"])
    assert "redis-server" in args[0]
    assert args[args.index("--appendonly") + 1] == "yes"


def test_postgres_healthcheck(compose):
    pg = compose["services"]["postgres"]
    test = " ".join(argv(pg["healthcheck"]["test"]))
    assert "pg_isready" in test
    assert not pg["healthcheck"].get("disable")
    env = env_of(pg)
    assert env.get("POSTGRES_USER") == "paralab" and env.get("POSTGRES_DB") == "paralab"


def test_backend_waits_for_healthy_db_then_migrates_and_serves(compose):
    backend = compose["services"]["backend"]
    depends = backend["depends_on"]
    assert isinstance(depends, dict), "depends_on must use the long form with a condition"
    assert depends["postgres"]["condition"] == "service_healthy"
    assert "healthcheck" in compose["services"]["postgres"], "service_healthy needs one"
    args = argv(backend["command"])
    assert args[:2] == ["sh", "-c"], args
    script = args[2]
    assert re.search(r"paralab migrate\s*&&\s*(exec\s+)?paralab serve", script), script
    serve = shlex.split(script.split("paralab serve", 1)[1])
    assert serve[serve.index("--host") + 1] == "0.0.0.0"
    assert serve[serve.index("--port") + 1] == "8000"
    assert any(str(p).endswith(":8000") for p in backend.get("ports", [])), "8000 not published"


def test_backend_healthcheck(compose):
    health = compose["services"]["backend"]["healthcheck"]
    test = argv(health["test"])
    assert test[0] in ("CMD", "CMD-SHELL") and "python" in test[1]
    assert "urllib" in " ".join(test) and "/api/health/live" in " ".join(test)
    assert parse_duration(health.get("start_period", "0s")) >= 10, "migrations need time"


def test_workers_have_gpus_and_share_a_pool(compose):
    """The hosts of the file are one pool (one queue): a multi-host run is placed on several
    of them at once. Each says where the others reach it (the rendezvous of node 0)."""
    queues: dict[str, list[str]] = {}
    addresses: dict[str, str] = {}
    for name, worker in workers(compose).items():
        env = env_of(worker)
        queue = env.get("PARALAB_QUEUE")
        assert queue, f"{name}: PARALAB_QUEUE not set"
        queues.setdefault(queue, []).append(name)
        addr = env.get("PARALAB_WORKER_ADDRESS")
        assert addr and addr not in addresses, f"{name}: no address of its own"
        addresses[addr] = name
        args = argv(worker["command"])
        assert args[:2] == ["paralab", "worker"], args
        assert args[args.index("--queue") + 1] == queue, f"{name}: --queue != PARALAB_QUEUE"
        devices = worker["deploy"]["resources"]["reservations"]["devices"]
        assert any(d.get("driver") == "nvidia" and "gpu" in d.get("capabilities", [])
                   for d in devices), f"{name}: no nvidia GPU reservation"
    assert max(len(ns) for ns in queues.values()) >= 2, f"no pool of two hosts: {queues}"


def test_two_host_layout_one_worker_per_host(compose):
    """The cluster page groups workers by PARALAB_WORKER_HOST: each worker-<host> service
    names itself and its host, distinctly, and keeps its own scratch volume (replicas of one
    service would share the name, the label and the volume)."""
    seen: dict[str, dict[str, str]] = {"PARALAB_WORKER_NAME": {}, "PARALAB_WORKER_HOST": {}}
    volumes: dict[str, str] = {}
    for name, worker in workers(compose).items():
        env = env_of(worker)
        for key, taken in seen.items():
            assert env.get(key), f"{name}: {key} not set"
            assert env[key] not in taken, f"{name} and {taken.get(env[key])} share {key}"
            taken[env[key]] = name
        scratch = dict(map(reversed, named_volume_mounts(worker))).get("/var/lib/paralab")
        assert scratch and scratch not in volumes, f"{name}: no scratch volume of its own"
        volumes[scratch] = name
        assert "deploy" in worker and not worker["deploy"].get("replicas", 1) > 1, name
    assert len(seen["PARALAB_WORKER_HOST"]) >= 2, "the file shows two hosts"
    default = [n for n, w in workers(compose).items() if not w.get("profiles")]
    assert default, "`docker compose up` (no profile) starts no worker"


def test_workers_talk_to_backend_not_db(compose):
    services = compose["services"]
    for name, worker in workers(compose).items():
        env = env_of(worker)
        assert env.get("PARALAB_URL") == "http://backend:8000", name
        assert env.get("PARALAB_WORKER_TOKEN") == TEST_ENV["PARALAB_WORKER_TOKEN"], name
        assert env.get("REDIS_URL") == env_of(services["backend"])["REDIS_URL"], name
        assert "DATABASE_URL" not in env and "postgres" not in (worker.get("depends_on") or {})


def test_workers_are_fit_for_nccl_and_graceful_stop(compose):
    for name, worker in workers(compose).items():
        assert worker.get("ipc") == "host" or parse_bytes(worker.get("shm_size", 0)) >= 2**30, \
            f"{name}: needs ipc: host or shm_size >= 1gb for NCCL"
        grace = parse_duration(worker.get("stop_grace_period", "10s"))
        assert grace is not None and grace >= 60, f"{name}: stop_grace_period too short"
        assert worker.get("stop_signal", "SIGTERM") == "SIGTERM"


# --- Dockerfiles and build context ------------------------------------------------------------

def builds(compose: dict) -> Iterator[tuple[str, Path, Path]]:
    for name, service in compose["services"].items():
        build = service.get("build")
        if build is None:
            continue
        if isinstance(build, str):
            build = {"context": build}
        context = (ROOT / build.get("context", ".")).resolve()
        yield name, context, context / build.get("dockerfile", "Dockerfile")


def dockerfile_lines(path: Path) -> list[str]:
    """Instructions with line continuations joined and comments dropped."""
    text = re.sub(r"\\\n", " ", path.read_text())
    return [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]


def shell_commands(script: str) -> list[list[str]]:
    """A RUN line's simple commands (split on `&&`, `||`, `;`, `|`), quotes respected."""
    lexer = shlex.shlex(script, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    commands: list[list[str]] = [[]]
    for token in lexer:
        if token in ("&&", "||", ";", "|"):
            commands.append([])
        else:
            commands[-1].append(token)
    return [c for c in commands if c]


def ignored(path: str, patterns: list[str]) -> bool:
    result = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").strip("/").removeprefix("**/")
        parts = Path(path).parts
        prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
        if any(fnmatch.fnmatch(p, pattern) or fnmatch.fnmatch(Path(p).name, pattern)
               for p in prefixes):
            result = not negate
    return result


def test_build_dockerfiles_exist(compose):
    found = list(builds(compose))
    assert {n for n, _, _ in found} >= {"backend", *workers(compose)}
    for name, context, dockerfile in found:
        assert context.is_dir(), f"{name}: build context {context} missing"
        assert dockerfile.is_file(), f"{name}: {dockerfile} missing"


def test_dockerfiles_install_the_project_as_non_root(compose):
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    include = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = {p.rstrip("*") for p in include}
    patterns = [ln.strip() for ln in DOCKERIGNORE.read_text().splitlines()
                if ln.strip() and not ln.startswith("#")]
    for ignore in (".git", ".venv", "var", ".env"):
        assert ignored(ignore, patterns), f".dockerignore lets {ignore} into the context"
    for name, context, dockerfile in builds(compose):
        lines = dockerfile_lines(dockerfile)
        assert lines[0].startswith("FROM ") or lines[0].startswith("ARG "), dockerfile
        copied: set[str] = set()
        workdir, project_dir, installed = "/", None, False
        for ln in lines:
            if ln.startswith("WORKDIR "):
                workdir = str(Path(workdir, ln.split()[1]))
            elif ln.startswith("COPY ") and "--from" not in ln:
                *sources, dest = ln.split()[1:]
                for src in sources:
                    assert (context / src).exists(), f"{dockerfile.name}: COPY {src} missing"
                    assert not ignored(src, patterns), f"{src} is in .dockerignore"
                    copied.add(src.strip("./"))
                if "pyproject.toml" in sources:
                    project_dir = str(Path(workdir, dest))
            elif ln.startswith("RUN ") and project_dir:
                for args in shell_commands(ln[4:]):
                    if args[:2] == ["pip", "install"] and project_dir in {
                            str(Path(workdir, a)) for a in args[2:] if not a.startswith("-")}:
                        installed = True
        assert "pyproject.toml" in copied and packages <= copied, \
            f"{dockerfile.name} must COPY pyproject.toml and {sorted(packages)}"
        assert installed, f"{dockerfile.name}: no `pip install` of the project ({project_dir})"
        users = [ln.split()[1] for ln in lines if ln.startswith("USER ")]
        assert users and users[-1].split(":")[0] not in ("root", "0"), \
            f"{dockerfile.name} runs as root"
        if name == "backend":
            assert "download.pytorch.org/whl/cpu" in dockerfile.read_text()
        if name in workers(compose):
            assert "STOPSIGNAL SIGTERM" in lines, f"{dockerfile.name}: no STOPSIGNAL SIGTERM"
