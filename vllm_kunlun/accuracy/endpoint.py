"""The server side: teacher-forced prompt logprobs from an OpenAI-compatible vLLM
server, over plain HTTP (urllib: no client library the plugin does not already need).

Why this request: vLLM's ``/v1/completions`` takes ``prompt_logprobs`` (an extra field,
vLLM 0.15.1 ``CompletionRequest.prompt_logprobs: int | None``) and answers, per choice,
``prompt_logprobs: list[dict[int, Logprob] | None]``: None for the first prompt token
(nothing predicts it), then for each later position the prompt token's own
``{logprob, rank, decoded_token}`` plus the ``k`` most likely tokens. With ``k = 1`` the
entry of rank 1 is the server's argmax, so one request per prompt gives both numbers
compared. ``return_token_ids`` adds ``prompt_token_ids``, the server's tokenization.

What the server computes with (``served_config``): the plugin's
``GET /kunlun/served_config`` (runtime patch ``openai_served_config``), else vLLM's
``/server_info`` (only under ``VLLM_SERVER_DEV_MODE=1``), else nothing but the
directory ``/v1/models`` names as the model's ``root``.
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any, TypeGuard

TOP_LOGPROBS = 1


class EndpointError(RuntimeError):
    """The server could not be asked or did not answer as vLLM does (exit 2)."""


@dataclass(frozen=True)
class ServerPosition:
    """What the server says about one prompt position t >= 1."""

    logprob: float  # log p(token_t | tokens before t)
    rank: int  # that token's rank, 1 = the server's argmax
    top1_id: int
    top1_logprob: float


@dataclass(frozen=True)
class ServerPrompt:
    token_ids: list[int]
    positions: list[ServerPosition]  # positions 1 .. len(token_ids) - 1


def base_url(url: str) -> str:
    """``http://host:port`` whether or not the user added ``/v1``."""
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


@dataclass(frozen=True)
class ServedConfig:
    """What the server says it computes with (None: it does not say)."""

    source: str  # the route that said it
    model: str | None  # the checkpoint directory the server loaded
    dtype: str | None  # "float32", "bfloat16", "float16"
    quantization: str | None  # vLLM's method name ("compressed-tensors"), or None
    known: bool  # dtype and quantization were reported


def _request(url: str, body: dict[str, Any] | None, timeout: float) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        url, data=data, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
    except urllib.error.HTTPError as err:
        detail = err.read().decode(errors="replace")
        try:
            detail = json.loads(detail)["error"]["message"]
        except (ValueError, KeyError, TypeError):
            detail = detail[:500]
        hint = (
            "check --url: it is the server's address, e.g. http://127.0.0.1:8000"
            if err.code == 404
            else "see the server's message"
        )
        raise EndpointError(
            f"{url} answered HTTP {err.code}: {detail} ({hint})"
        ) from None
    except (urllib.error.URLError, OSError) as err:
        reason = getattr(err, "reason", err)
        raise EndpointError(
            f"cannot reach {url}: {reason}; start the server (vllm serve) or fix "
            "--url (and --timeout for a slow server)"
        ) from None
    try:
        return json.loads(raw)
    except ValueError:
        raise EndpointError(
            f"{url} did not answer JSON; is --url a vLLM server?"
        ) from None


def served_models(url: str, timeout: float) -> list[str]:
    """The model names ``/v1/models`` lists."""
    answer = _request(f"{base_url(url)}/v1/models", None, timeout)
    try:
        return [str(m["id"]) for m in answer["data"]]
    except (KeyError, TypeError):
        raise EndpointError(
            f"{url}/v1/models is not an OpenAI model list; is --url a vLLM server?"
        ) from None


def _optional(url: str, timeout: float) -> Any:
    """GET ``url``'s JSON, or None when the server has no such route (404)."""
    try:
        return _request(url, None, timeout)
    except EndpointError as exc:
        if "answered HTTP 404" in str(exc) or "answered HTTP 405" in str(exc):
            return None
        raise


def _has_dtype(doc: Any) -> TypeGuard[dict[str, Any]]:
    """A config document that names the served dtype."""
    return isinstance(doc, dict) and "dtype" in doc


def _from_config(route: str, doc: dict[str, Any]) -> ServedConfig:
    """The served model, dtype and quantization as a config document ``doc`` from
    ``route`` names them."""
    return ServedConfig(
        route, doc.get("model"), _dtype(doc.get("dtype")), doc.get("quantization"), True
    )


def _dtype(value: Any) -> str | None:
    return None if value is None else str(value).removeprefix("torch.")


def served_config(url: str, name: str, timeout: float) -> ServedConfig:
    """What the server at ``url`` computes ``name`` with (see the module docstring)."""
    base = base_url(url)
    doc = _optional(f"{base}/kunlun/served_config", timeout)
    if _has_dtype(doc):
        return _from_config("/kunlun/served_config", doc)
    info = _optional(f"{base}/server_info?config_format=json", timeout)
    config = info.get("vllm_config") if isinstance(info, dict) else None
    model = config.get("model_config") if isinstance(config, dict) else None
    if _has_dtype(model):
        return _from_config("/server_info", model)
    listing = _request(f"{base}/v1/models", None, timeout)
    roots = [
        m.get("root")
        for m in (listing.get("data") or [] if isinstance(listing, dict) else [])
        if isinstance(m, dict) and m.get("id") == name
    ]
    root = roots[0] if roots and isinstance(roots[0], str) else None
    return ServedConfig("/v1/models", root, None, None, False)


def completion_body(model: str, prompt: str) -> dict[str, Any]:
    """One token generated (the API needs at least one), the prompt's logprobs."""
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": 1,
        "temperature": 0.0,
        "prompt_logprobs": TOP_LOGPROBS,
        "return_token_ids": True,
    }


def _number(value: Any) -> float:
    if value is None:  # JSON has no infinity; vLLM clamps -inf to -9999.0
        return -math.inf
    return float(value)


def parse_completion(answer: Any) -> ServerPrompt:
    """``ServerPrompt`` from a ``/v1/completions`` answer; EndpointError when it lacks
    what vLLM returns for ``prompt_logprobs`` (an older server, another engine)."""
    try:
        choice = answer["choices"][0]
        token_ids = [int(t) for t in choice["prompt_token_ids"]]
        table = choice["prompt_logprobs"]
    except (KeyError, IndexError, TypeError):
        raise EndpointError(
            "the completion has no prompt_logprobs / prompt_token_ids: the server is "
            "not vLLM (>= 0.10), or ignores these fields"
        ) from None
    if not isinstance(table, list) or len(table) != len(token_ids):
        raise EndpointError(
            f"prompt_logprobs has {len(table) if isinstance(table, list) else 'no'} "
            f"entries for {len(token_ids)} prompt tokens"
        )
    positions = []
    for t, entry in enumerate(table[1:], start=1):
        if not isinstance(entry, dict):
            raise EndpointError(f"prompt_logprobs[{t}] is not a token table: {entry!r}")
        own = entry.get(str(token_ids[t]))
        ranked = [
            (int(k), v)
            for k, v in entry.items()
            if isinstance(v, dict) and v.get("rank") == 1
        ]
        if not isinstance(own, dict) or not ranked:
            raise EndpointError(
                f"prompt_logprobs[{t}] lacks the prompt token {token_ids[t]} or a "
                f"rank-1 token: {entry!r}"
            )
        top_id, top = max(ranked, key=lambda kv: _number(kv[1].get("logprob")))
        positions.append(
            ServerPosition(
                logprob=_number(own.get("logprob")),
                rank=int(own.get("rank") or 0),
                top1_id=top_id,
                top1_logprob=_number(top.get("logprob")),
            )
        )
    return ServerPrompt(token_ids, positions)


def prompt_logprobs(url: str, model: str, prompt: str, timeout: float) -> ServerPrompt:
    """Ask the server for one prompt's teacher-forced logprobs."""
    answer = _request(
        f"{base_url(url)}/v1/completions", completion_body(model, prompt), timeout
    )
    return parse_completion(answer)
