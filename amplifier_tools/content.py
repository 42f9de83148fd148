"""Rich result content: the blocks a result carries besides its ``output`` (``metadata["content"]``).

A ``ToolResult`` keeps its rich content — text, image, audio, resource links and embedded
resources — in ``metadata["content"]``, a list of plain dicts in MCP's spelling
(``{"type": "image", "data": <base64>, "mimeType": "image/png"}``); a seed tool's image blocks
in Amplifier's spelling (``{"type": "image", "source": {"media_type", "data"}}``) are read too.
This module holds what the readers of such content need: a model (``render``: one line of text
per block, never the bytes), the audit log (``summary``: type, media type, size and SHA-256 per
block, never the bytes), an MCP client (``mcp_spelling``) and Amplifier (``amplifier_spelling``:
its text and image blocks, the rest as their rendered text). It never raises on what a tool or a
server put there: a block it does not know is rendered and summarized by its ``type`` alone.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, Final

from ._json import dumps
from .redaction import SecretSet, redact_text

#: Blocks the audit summary describes one by one; the rest are one entry.
MAX_SUMMARY_BLOCKS: Final = 64


def blocks_of(metadata: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The content blocks of a result's ``metadata`` (``[]`` when it has none or they are no list, or
    a list whose iteration raises: found by attack, the audit plugin raised and wrote no record)."""
    blocks = metadata.get("content")
    if not isinstance(blocks, list):
        return []
    try:
        return [block for block in blocks if isinstance(block, Mapping)]
    except Exception:
        return []


def _binary(block: Mapping[str, Any]) -> tuple[str | None, Any]:
    """A media block's ``(mime type, base64 data)``, in either spelling."""
    source = block.get("source")
    if isinstance(source, Mapping):
        return _str(source.get("media_type") or source.get("mimeType")), source.get("data")
    return _str(block.get("mimeType")), block.get("data")


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def base64_size(data: Any) -> int:
    """The number of bytes ``data`` (base64 text) decodes to, from its length (0 for no string)."""
    if not isinstance(data, str):
        return 0
    return len(data.rstrip("=")) * 3 // 4


def _clip(text: str, limit: int = 200, secrets: Collection[str] | SecretSet = ()) -> str:
    """``text`` on one line, cut at ``limit``; ``secrets`` are redacted first, before its whitespace
    is folded and before it is cut (either way a secret would no longer be the secret a later
    redaction finds: its head, or a secret holding a line break or two spaces, folded)."""
    if secrets:
        text = redact_text(text, secrets, patterns=False)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "…"


def render_block(block: Mapping[str, Any], secrets: Collection[str] | SecretSet = ()) -> str:
    """One block as text for a model: text as it is; anything else as a bracketed line naming it.
    ``secrets`` are redacted from what is cut (blocks not redacted yet: an imported result's).

    A block that cannot be read or shown is the line ``[content block that could not be read:
    <exception type>]`` (found by attack: a text block whose ``text`` was an integer over 4,300
    digits or an object whose ``__str__`` raises, or a ``type`` such as that, made
    ``get_serialized_output`` raise after the call had succeeded, and ``serve-mcp`` answer the
    call with a JSON-RPC internal error)."""
    try:
        return _render_block(block, secrets)
    except Exception as exc:
        return f"[content block that could not be read: {type(exc).__name__}]"


def _render_block(block: Mapping[str, Any], secrets: Collection[str] | SecretSet) -> str:
    kind = block.get("type")
    if kind == "text":
        return str(block.get("text", ""))
    if kind in ("image", "audio"):
        mime, data = _binary(block)
        return f"[{kind}: {_clip(mime or 'unknown type', 100, secrets)}, {base64_size(data)} bytes]"
    if kind == "resource_link":
        name, uri = _str(block.get("name")), _str(block.get("uri")) or ""
        shown = f"<{_clip(uri, 500, secrets)}>"
        parts = [_clip(name or uri, secrets=secrets), shown] if name and name != uri else [shown]
        mime = _str(block.get("mimeType"))
        if mime:
            parts.append(f"({_clip(mime, 100, secrets)})")
        description = _str(block.get("description"))
        line = "[resource link: " + " ".join(parts) + "]"
        return f"{line} {_clip(description, secrets=secrets)}" if description else line
    if kind == "resource":
        resource = block.get("resource")
        resource = resource if isinstance(resource, Mapping) else {}
        uri, mime = _str(resource.get("uri")) or "", _str(resource.get("mimeType"))
        head = f"[resource <{_clip(uri, 500, secrets)}>" + (f" ({_clip(mime, 100, secrets)})" if mime else "")
        if isinstance(resource.get("text"), str):
            return f"{head}]\n{resource['text']}"
        return f"{head}: {base64_size(resource.get('blob'))} bytes]"
    return f"[{_clip(str(kind), 100, secrets)} content]"


#: A part of what a framework shows a model: ``("text", text, None, None)``, or ``("image", base64
#: data, media type, None)`` or ``("file", base64 data, media type, file name)``.
Part = tuple[str, str, "str | None", "str | None"]


def data_url(part: Part) -> str:
    """An image or file part as a ``data:`` URL."""
    return f"data:{part[2] or 'application/octet-stream'};base64,{part[1]}"


def model_parts(blocks: Sequence[Mapping[str, Any]]) -> list[Part] | None:
    """The blocks as the parts a framework can show a model: an image (base64, either spelling) as
    an image, an embedded resource with a ``blob`` as a file; every other block as its
    ``render_block`` text, consecutive texts joined by a line break. None when there is no image
    or file among them (the result's text says it all). The blocks are a result's, scrubbed by the
    host (base64 that held a secret is a text block by then: ``withhold_redacted``).
    Limits: audio has no part in the frameworks' tool outputs, so it stays a line of text; the
    base64 is passed on as the block has it, not decoded here.

    Found by attack: only canonical base64 is media (``is_base64``): line-wrapped base64 hid a
    secret from the host's scrub (a line break inside the secret's encoding) and reached the model
    as a file that decodes to it; other text that is no base64 went to the Agents SDK and LangChain
    as a data URL the model API refuses. Such a block is a line of text. The media type is one
    (``type/subtype``, else ``application/octet-stream``) and the file name a bounded base name
    (no ``..``, no path): a model API got a mime type with line breaks and a name of a megabyte.
    Consecutive texts are joined once (a result of 40,000 small blocks and an image took two
    minutes of the event loop, the text copied again at every block)."""
    parts: list[Part] = []
    texts: list[str] = []
    media = False
    for block in blocks:
        kind = block.get("type")
        mime, data = _binary(block) if kind == "image" else (None, None)
        name = None
        resource = block.get("resource") if kind == "resource" else None
        if isinstance(resource, Mapping) and isinstance(resource.get("blob"), str):
            mime, data = _str(resource.get("mimeType")), resource["blob"]
            name = file_name(_str(resource.get("uri")) or "")
        if isinstance(data, str) and data:
            if not is_base64(data):
                texts.append(f"[{kind}: {_clip(mime or 'unknown type', 100)}, data that is not base64 left out]")
                continue
            media = True
            if texts:
                parts.append(("text", "\n".join(texts), None, None))
                texts = []
            parts.append(("image" if kind == "image" else "file", data, media_type(mime), name))
            continue
        texts.append(render_block(block))
    if texts:
        parts.append(("text", "\n".join(texts), None, None))
    return parts if media else None


_MEDIA_TYPE = re.compile(r"[A-Za-z0-9][\w!#$&^.+-]{0,126}/[A-Za-z0-9][\w!#$&^.+-]{0,126}")
#: The longest file name passed on (most file systems' limit).
MAX_FILE_NAME = 255


def is_base64(data: str) -> bool:
    """Whether ``data`` is canonical base64 (standard alphabet, padded, no whitespace): C-level
    passes over it (a regular expression took 0.6 s over an 8 MB image)."""
    if len(data) % 4 or not data.isascii() or data.encode("ascii").translate(None, _ALPHABET):
        return False
    body = data.rstrip("=")
    return len(data) - len(body) <= 2 and "=" not in body


def media_type(mime: str | None) -> str:
    """``mime`` when it is a media type (``type/subtype``, no parameters), else
    ``application/octet-stream``."""
    return mime if mime is not None and _MEDIA_TYPE.fullmatch(mime) else "application/octet-stream"


def file_name(uri: str) -> str:
    """A file's name for a framework, from its URI: the last segment (of ``/`` or ``\\``), without
    control characters, at most ``MAX_FILE_NAME`` characters; ``file`` for none (or ``.``/``..``)."""
    name = uri.split("?", 1)[0].split("#", 1)[0].replace("\\", "/").rstrip("/").rsplit("/", 1)[-1]
    name = "".join(c for c in name if c.isprintable()).strip()[:MAX_FILE_NAME]
    return name if name.strip(".") else "file"


def withhold_redacted(blocks: list[Any]) -> list[Any]:
    """``blocks`` (a result's content, already redacted) with every image, audio or embedded
    resource whose base64 data had a secret redacted (its ``data``, ``source.data`` or ``blob``
    holds ``[REDACTED]``, which is no base64) replaced by a text block saying so: a client must
    not get data that no longer decodes. The same list when no block was changed that way.
    A block that cannot be read is left as it is (``_each``)."""
    return _each(blocks, _withheld_block)


def _withheld_block(block: Any) -> Any:
    """``block``, or the text block saying its redacted binary data was withheld."""
    from .redaction import PLACEHOLDER

    if not isinstance(block, Mapping):
        return block
    kind = block.get("type")
    resource = block.get("resource")
    data = resource.get("blob") if kind == "resource" and isinstance(resource, Mapping) else _binary(block)[1]
    if isinstance(data, str) and PLACEHOLDER in data:
        return {"type": "text", "text": _withheld(block)}
    return block


def _each(blocks: list[Any], change: Callable[[Any], Any]) -> list[Any]:
    """``blocks`` with each block replaced by ``change(block)``: a new list when one was changed
    (``change`` returns another object), else the same list. A block whose reading raises (a
    ``Mapping`` whose ``get`` raises, put by a tool straight into ``metadata["content"]``) is left
    as it is, and so is the whole list when iterating it raises. Found by attack: with any secret
    registered, the host's scrub of such content raised out of ``host.call``, and the call had no
    ``tool_complete`` and no audit record."""
    out: list[Any] | None = None
    try:
        for index, block in enumerate(blocks):
            try:
                changed = change(block)
            except Exception:
                continue
            if changed is block:
                continue
            if out is None:
                out = list(blocks)
            out[index] = changed
    except Exception:  # a list subclass whose iteration raises
        return blocks
    return blocks if out is None else out


_ALPHABET: Final = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/="
_NOT_ALPHABET: Final = bytes(byte for byte in range(256) if byte not in _ALPHABET)
_URLSAFE: Final = str.maketrans("-_", "+/")


def _canonical(data: str) -> str:
    """``data`` as a lenient decoder reads it: URL-safe characters as standard ones, anything
    outside the alphabet (whitespace, dots, non-ASCII) left out. ``data`` itself when it is."""
    if data.isascii() and not data.encode("ascii").translate(None, _ALPHABET):
        return data  # a C-level pass: an 8 MB image takes some milliseconds
    return data.translate(_URLSAFE).encode("ascii", "ignore").translate(None, _NOT_ALPHABET).decode("ascii")


def canonical_base64(blocks: list[Any]) -> list[Any]:
    """``blocks`` with each image, audio or embedded resource's base64 data in its canonical
    spelling (``_canonical``: no whitespace or other characters a lenient decoder skips, ``-``/``_``
    of the URL-safe alphabet as ``+``/``/``), for the host's scrub: a secret's encoding is found
    only in that spelling. The same list when none changed.

    Found by attack: line-wrapped base64 (``base64.encodebytes``, 76 characters a line) holding a
    secret passed the scrub whenever a line break fell inside the secret's encoding, and reached
    ``mcp serve``'s client and the adapters' models as data that decodes to it."""
    return _each(blocks, _canonical_block)


def _canonical_block(block: Any) -> Any:
    """``block`` with its base64 data canonical (``_canonical``); ``block`` itself when it is."""
    if not isinstance(block, Mapping):
        return block
    resource, source = block.get("resource"), block.get("source")
    holder = resource if block.get("type") == "resource" and isinstance(resource, Mapping) else \
        source if isinstance(source, Mapping) else block
    key = "blob" if holder is resource else "data"
    data = holder.get(key)
    canonical = _canonical(data) if isinstance(data, str) else data
    if canonical is data:
        return block
    fixed = {**holder, key: canonical}
    return fixed if holder is block else {**block, ("resource" if holder is resource else "source"): fixed}


def _withheld(block: Mapping[str, Any]) -> str:
    kind = block.get("type")
    if kind == "resource":
        resource = block["resource"]
        uri, mime = _str(resource.get("uri")) or "", _str(resource.get("mimeType"))
        head = f"[resource <{_clip(uri, 500)}>" + (f" ({_clip(mime, 100)})" if mime else "")
    else:
        mime, _ = _binary(block)
        head = f"[{_clip(str(kind), 100)}" + (f" ({_clip(mime, 100)})" if mime else "")
    return f"{head}: binary content withheld because it contained a secret]"


def render(blocks: Sequence[Mapping[str, Any]], secrets: Collection[str] | SecretSet = ()) -> str:
    """The blocks as text for a model, one after another (a line break between two); ``secrets``:
    see ``render_block``."""
    return "\n".join(render_block(block, secrets) for block in blocks)


def mcp_spelling(block: Mapping[str, Any]) -> Mapping[str, Any]:
    """``block`` in MCP's spelling: an Amplifier image block (``source``) as ``{"type": "image",
    "data", "mimeType"}``; any other block as it is."""
    source = block.get("source")
    if block.get("type") == "image" and isinstance(source, Mapping):
        return {"type": "image", "data": source.get("data"), "mimeType": source.get("media_type")}
    return block


def amplifier_spelling(block: Mapping[str, Any]) -> dict[str, Any]:
    """``block`` as one of amplifier-core's result blocks: text as text, an image as an image with a
    base64 ``source``; what Amplifier has no block for (audio, resources), and a block that cannot
    be read, as its rendered text."""
    try:
        return _amplifier_spelling(block)
    except Exception:  # a Mapping whose reading raises
        return {"type": "text", "text": render_block(block)}


def _amplifier_spelling(block: Mapping[str, Any]) -> dict[str, Any]:
    kind = block.get("type")
    if (kind == "text" and isinstance(block.get("text"), str)) or (
            kind == "image" and isinstance(block.get("source"), Mapping)):
        return dict(block)
    if kind == "image" and isinstance(block.get("data"), str) and isinstance(block.get("mimeType"), str):
        return {"type": "image", "source": {"type": "base64", "media_type": block["mimeType"], "data": block["data"]}}
    return {"type": "text", "text": render_block(block)}


def summary(blocks: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """What the audit log keeps of each block: its ``type``, media type (``mimeType``) and URI where
    it has them, ``bytes`` (of its canonical JSON) and ``sha256`` (of the same bytes). The data
    itself is not inlined (an image is megabytes of base64); the digest ties the record to it.
    Past ``MAX_SUMMARY_BLOCKS`` blocks, the rest are one entry (``{"type": "more", "blocks",
    "bytes", "sha256"}``, the digest over their encodings one after another), so a result of
    a hundred thousand tiny blocks does not make a record of megabytes."""
    out = [_summary_or_unreadable(block) for block in blocks[:MAX_SUMMARY_BLOCKS]]
    rest = blocks[MAX_SUMMARY_BLOCKS:]
    if rest:
        digest, size = hashlib.sha256(), 0
        for block in rest:
            encoded = _encoded(block)
            digest.update(encoded)
            size += len(encoded)
        out.append({"type": "more", "blocks": len(rest), "bytes": size, "sha256": digest.hexdigest()})
    return out


def _summary_or_unreadable(block: Any) -> dict[str, Any]:
    """``_summary`` of ``block``, or ``{"type": "unreadable"}`` naming its class when reading it
    raises (a ``Mapping`` whose ``get`` or ``__getitem__`` raises, put by a tool straight into a
    ``ToolResult``'s ``metadata["content"]``: the audit plugin raised and wrote no record)."""
    try:
        return _summary(block, _encoded(block))
    except Exception:
        return {"type": "unreadable", "class": type(block).__name__[:100]}


def _encoded(block: Mapping[str, Any]) -> bytes:
    """A block's compact, key-sorted JSON; what JSON cannot hold (a lone surrogate, a cycle, an
    integer past the digit limit, keys of mixed types, an object whose ``__str__`` raises) escaped or
    summarized as ``_json.encodable`` does (found by attack: the audit plugin raised, the call
    failed ``hook_failed`` and no record of it was written)."""
    try:
        return dumps(block)
    except Exception:
        from ._json import encodable

        try:
            return dumps(encodable(block, []))
        except Exception:  # a Mapping whose reading raises
            return dumps({"unreadable": type(block).__name__})


def _summary(block: Mapping[str, Any], encoded: bytes) -> dict[str, Any]:
    entry: dict[str, Any] = {"type": (_str(block.get("type")) or "unknown")[:100]}
    mime, _ = _binary(block)
    resource = block.get("resource")
    holder = resource if isinstance(resource, Mapping) else block
    mime = mime or _str(holder.get("mimeType"))
    if mime:
        entry["mimeType"] = mime[:200]
    uri = _str(holder.get("uri"))
    if uri:
        entry["uri"] = uri[:500]  # the digest covers the whole
    entry["bytes"] = len(encoded)
    entry["sha256"] = hashlib.sha256(encoded).hexdigest()
    return entry
