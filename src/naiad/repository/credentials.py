"""Cloud credentials for a repository: TRITON_CLOUD_CREDENTIAL_PATH (longest prefix wins), then the environment."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from naiad.repository.cloud_urls import CloudLocation

CREDENTIAL_PATH_VARIABLE = "TRITON_CLOUD_CREDENTIAL_PATH"
_SECTIONS = {"s3": "s3", "gs": "gs", "gcs": "gs", "as": "as", "az": "as", "abfs": "as"}


def storage_options(location: CloudLocation, environ: Mapping[str, str]) -> dict[str, Any]:
    """Keyword arguments for the fsspec filesystem of `location` (credentials, endpoint, account)."""
    section = _SECTIONS.get(location.scheme)
    entry = credential_file_entry(location.url, section, environ) if section else None
    if section == "s3":
        return s3_options(location, entry, environ)
    if section == "gs":
        return gcs_options(entry, environ)
    if section == "as":
        return azure_options(location, entry, environ)
    return {}


def credential_file_entry(url: str, section: str, environ: Mapping[str, str]) -> Any | None:
    """The entry of the credential file whose key is the longest prefix of `url` ("" matches all), if any."""
    path = environ.get(CREDENTIAL_PATH_VARIABLE)
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            document = json.load(handle)
    except OSError as exc:
        raise ValueError(f"{CREDENTIAL_PATH_VARIABLE}: cannot read '{path}': {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{CREDENTIAL_PATH_VARIABLE}: '{path}' is not valid JSON: {exc}") from None
    if not isinstance(document, dict):
        raise ValueError(f"{CREDENTIAL_PATH_VARIABLE}: '{path}' must hold a JSON object")
    entries = document.get(section) or {}
    if not isinstance(entries, dict):
        raise ValueError(f"{CREDENTIAL_PATH_VARIABLE}: '{section}' in '{path}' must be an object keyed by path prefix")
    matches = [key for key in entries if url.startswith(key)]
    return entries[max(matches, key=len)] if matches else None


def s3_options(location: CloudLocation, entry: Any | None, environ: Mapping[str, str]) -> dict[str, Any]:
    """s3fs arguments: the matching credential-file entry, else AWS_* variables; the URL's endpoint if any."""
    if entry is not None:
        if not isinstance(entry, dict):
            raise ValueError(f"{CREDENTIAL_PATH_VARIABLE}: the s3 entry for '{location.url}' must be an object")
        key_id, secret = entry.get("key_id"), entry.get("secret_key")
        token, region, profile = entry.get("session_token"), entry.get("region"), entry.get("profile")
    else:
        key_id, secret = environ.get("AWS_ACCESS_KEY_ID"), environ.get("AWS_SECRET_ACCESS_KEY")
        token = environ.get("AWS_SESSION_TOKEN")
        region = environ.get("AWS_DEFAULT_REGION") or environ.get("AWS_REGION")
        profile = environ.get("AWS_PROFILE")
    options: dict[str, Any] = {}
    if key_id and secret:
        options.update(key=key_id, secret=secret)
        if token:
            options["token"] = token
    elif profile:
        options["profile"] = profile
    if region:
        options["client_kwargs"] = {"region_name": region}
    if location.endpoint_url:
        options["endpoint_url"] = location.endpoint_url
    return options


def gcs_options(entry: Any | None, environ: Mapping[str, str]) -> dict[str, Any]:
    """gcsfs arguments: a key file (or key object) from the credential file or GOOGLE_APPLICATION_CREDENTIALS.

    Without either, gcsfs tries the attached service account and then anonymous access, as Triton does.
    """
    if entry is not None:
        if not isinstance(entry, (str, dict)) or not entry:
            raise ValueError(f"{CREDENTIAL_PATH_VARIABLE}: a gs entry must be a key file path or a key object")
        return {"token": entry}
    key_file = environ.get("GOOGLE_APPLICATION_CREDENTIALS")
    return {"token": key_file} if key_file else {}


def azure_options(location: CloudLocation, entry: Any | None, environ: Mapping[str, str]) -> dict[str, Any]:
    """adlfs arguments: the account (as:// URL, credential file, AZURE_STORAGE_ACCOUNT) and its key or identity."""
    if entry is not None and not isinstance(entry, dict):
        raise ValueError(f"{CREDENTIAL_PATH_VARIABLE}: the as entry for '{location.url}' must be an object")
    entry = entry or {}
    account = location.account or entry.get("account_str") or environ.get("AZURE_STORAGE_ACCOUNT") \
        or environ.get("AZURE_STORAGE_ACCOUNT_NAME")
    if not account:
        raise ValueError(
            f"no Azure storage account for '{location.url}': use as://account/container/path "
            "or set AZURE_STORAGE_ACCOUNT"
        )
    options: dict[str, Any] = {"account_name": account}
    key = entry.get("account_key") if entry else environ.get("AZURE_STORAGE_KEY") or environ.get("AZURE_STORAGE_ACCOUNT_KEY")
    if key:
        options["account_key"] = key
        return options
    auth_type = environ.get("AZURE_STORAGE_AUTH_TYPE", "").lower()
    if auth_type in ("managed_identity", "default"):
        options["credential"] = _azure_identity(auth_type, environ.get("AZURE_STORAGE_CLIENT_ID") or None)
    return options


def _azure_identity(auth_type: str, client_id: str | None) -> Any:
    """An async azure-identity credential (adlfs talks to Blob storage through the aio client)."""
    from azure.identity.aio import (  # installed with adlfs
        DefaultAzureCredential,
        ManagedIdentityCredential,
    )

    if auth_type == "managed_identity":
        return ManagedIdentityCredential(client_id=client_id)
    return DefaultAzureCredential(managed_identity_client_id=client_id)
