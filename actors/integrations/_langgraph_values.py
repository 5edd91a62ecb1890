"""LangGraph values as JSON, for the run's history: what a node returned (a state update, a
``Command``), an interrupt's value, the graph's final state.

Plain JSON stays as it is, so ``sojourn history`` shows a node's update as the dict it is.
A LangChain message is kept as ``{"__lg__": "message", "message": ...}`` in LangChain's own
dict form (``message_to_dict``), readable too, and a tuple as
``{"__lg__": "tuple", "items": [...]}``. Anything else (a ``Command``, a ``Send``, a
Pydantic model, a tuple) goes through LangGraph's checkpoint serializer, the one its own
checkpointers use, as ``{"__lg__": "serde", "type": ..., "data": <base64>}``: opaque, but
rebuilt exactly. This module imports LangGraph and LangChain core.
"""

from __future__ import annotations

import base64
from typing import Any

from langchain_core.messages import BaseMessage, message_to_dict, messages_from_dict
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

__all__ = ["TAG", "from_json", "to_json"]

TAG = "__lg__"
"""The key that marks an encoded value (a dict that holds it is encoded as its items)."""

_SERDE = JsonPlusSerializer()


def to_json(value: Any) -> Any:
    """``value`` as JSON that ``from_json`` turns back into an equal value."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list):
        return [to_json(v) for v in value]
    if isinstance(value, dict) and TAG not in value and all(isinstance(k, str) for k in value):
        return {k: to_json(v) for k, v in value.items()}
    if isinstance(value, dict):  # a key that is not a string, or the tag itself
        return {TAG: "dict", "items": [[to_json(k), to_json(v)] for k, v in value.items()]}
    if isinstance(value, tuple):
        return {TAG: "tuple", "items": [to_json(v) for v in value]}
    if isinstance(value, BaseMessage):
        return {TAG: "message", "message": message_to_dict(value)}
    kind, data = _SERDE.dumps_typed(value)
    return {TAG: "serde", "type": kind, "data": base64.b64encode(data).decode("ascii")}


def from_json(value: Any) -> Any:
    """The value ``to_json`` encoded."""
    if isinstance(value, list):
        return [from_json(v) for v in value]
    if not isinstance(value, dict):
        return value
    tag = value.get(TAG)
    if tag is None:
        return {k: from_json(v) for k, v in value.items()}
    if tag == "dict":
        return {from_json(k): from_json(v) for k, v in value["items"]}
    if tag == "tuple":
        return tuple(from_json(v) for v in value["items"])
    if tag == "message":
        (message,) = messages_from_dict([value["message"]])
        return message
    if tag == "serde":
        return _SERDE.loads_typed((value["type"], base64.b64decode(value["data"])))
    raise ValueError(f"not a recorded LangGraph value: {value!r}")
