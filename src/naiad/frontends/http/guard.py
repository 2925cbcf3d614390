"""Checks every HTTP request passes before routing: restricted API groups (403) and unsafe model names (400)."""

from __future__ import annotations

from typing import Any

from naiad.frontends.http.body import RequestHeaders
from naiad.frontends.http.responses import Send, send_error
from naiad.frontends.security import (
    Restriction,
    http_api_group,
    http_model_name,
    http_restriction_message,
    model_name_problem,
    parse_restrictions,
)


def header_value(scope: dict[str, Any], key: str) -> str | None:
    """The first value of a request header (key lower-case), as text."""
    wanted = key.encode("latin-1")
    for name, value in scope["headers"]:
        if name == wanted:
            return value.decode("latin-1")
    return None


NAME_VERDICTS_KEPT = 1024  # raw paths whose model-name verdict is remembered (then forgotten all at once)
NAME_VERDICT_PATH_BYTES = 256  # longer paths are judged each time (the memory stays bounded)


class HttpGuard:
    """`--http-restricted-api` groups and the model-name rule, applied in front of the router."""

    def __init__(self, restricted_api: list[str]) -> None:
        self.restrictions: dict[str, Restriction] = parse_restrictions(restricted_api, "http-restricted-api")
        # The model-name verdict of a raw path, which the same few paths ask for on every request.
        self._name_verdicts: dict[bytes, tuple[int, str] | None] = {}

    def refusal(self, scope: dict[str, Any], group: str | None = None) -> tuple[int, str] | None:
        """(status, message) when the request must be refused, else None.

        `group` overrides the group derived from the path (for the cloud frontends' own routes).
        """
        path = scope["path"]
        if self.restrictions:
            restriction = self.restrictions.get(group or http_api_group(path) or "")
            if restriction is not None and not restriction.allows(header_value(scope, restriction.key)):
                return 403, http_restriction_message(restriction.key)
        raw = scope.get("raw_path") or path.encode("utf-8", "replace")
        verdicts = self._name_verdicts
        try:
            return verdicts[raw]
        except KeyError:
            pass
        verdict = _name_verdict(raw)
        if len(raw) <= NAME_VERDICT_PATH_BYTES:
            if len(verdicts) >= NAME_VERDICTS_KEPT:
                verdicts.clear()
            verdicts[raw] = verdict
        return verdict

    async def refuse(self, scope: dict[str, Any], send: Send, group: str | None = None) -> bool:
        """Answer the refusal (if any) and say whether the request was refused."""
        refusal = self.refusal(scope, group)
        if refusal is None:
            return False
        close = RequestHeaders.from_scope(scope).may_have_body()  # the body stays unread
        await send_error(send, refusal[0], refusal[1], close=close)
        return True


def _name_verdict(raw_path: bytes) -> tuple[int, str] | None:
    """400 and why, when the path names a model by a name that could escape a repository directory."""
    name = http_model_name(raw_path)
    if name is not None:
        problem = model_name_problem(name)
        if problem is not None:
            shown = name.replace("\x00", "\\0")
            return 400, f"invalid model name '{shown}': {problem}"
    return None
