"""Schemathesis hooks for tests/service/test_fuzz.py, loaded in the fuzzer's own process
(SCHEMATHESIS_HOOKS=tests.service.fuzz_hooks).

Schemathesis's JSON report groups stateful failures under one "Stateful tests" label, so each
failure is written here, with the operation that answered it, for the test to judge against
its allow-lists.
"""

from __future__ import annotations

import json
import os
import re

import schemathesis

from backend.api.schemas import TEXT_PATTERN

TEXT_RE = re.compile(TEXT_PATTERN)

FAILURES = os.environ["PARALAB_FUZZ_FAILURES"]
# Team mode: the id of the fuzzer's own API token (see before_call).
OWN_TOKEN_ID = os.environ.get("PARALAB_FUZZ_OWN_TOKEN_ID")


def breaks_text_pattern(value) -> bool:
    """Does a body hold text the schema's TEXT_PATTERN (no NUL, no lone surrogate) excludes?
    Schemathesis's stateful phase sends such bodies although the schema declares the pattern:
    a refusal of one is not a "schema-valid request rejected"."""
    if isinstance(value, str):
        return TEXT_RE.match(value) is None
    if isinstance(value, dict):
        return any(breaks_text_pattern(k) or breaks_text_pattern(v) for k, v in value.items())
    if isinstance(value, list):
        return any(breaks_text_pattern(v) for v in value)
    return False


@schemathesis.hook
def filter_failure(context, failure, case, response) -> bool:
    record = {"code": failure.code, "title": failure.title,
              "operation": case.operation.label, "status": response.status_code,
              "message": (failure.message or "")[:400],
              "request": f"{case.method} {case.formatted_path}"[:300],
              "response": response.text_lossy()[:300],
              "body": repr(getattr(case, "body", None))[:300],
              "breaks_text_pattern": breaks_text_pattern(getattr(case, "body", None)),
              "phase": str(getattr(getattr(case, "meta", None), "phase", ""))[:80]}
    with open(FAILURES, "a", encoding="utf-8") as f:
        f.write(json.dumps(record, ensure_ascii=True) + "\n")
    return True  # keep it: the test decides


@schemathesis.hook
def before_call(context, case, kwargs) -> None:
    # An admin may revoke any token: revoking the fuzzer's own one (the stateful phase links
    # GET /api/auth/tokens to DELETE /api/auth/tokens/{token_id}) would turn the rest of the
    # run into 401s. Point that one call at a token that does not exist.
    if (OWN_TOKEN_ID and case.method.upper() == "DELETE" and case.path_parameters
            and str(case.path_parameters.get("token_id")) == OWN_TOKEN_ID):
        case.path_parameters["token_id"] = 0
