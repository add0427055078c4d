"""The people API's JSON bodies, parsed as strictly as the agent's.

DRF's ``JSONParser`` lets through what the agent protocol refuses (duplicate keys: the last one
silently wins) and answers 500 for what ``json.loads`` cannot parse without raising something
other than a ``ValueError``: a body nested thousands of levels deep is a ``RecursionError``.
:class:`StrictJSONParser` reads the body with the agent's reader
(:func:`breakers.agent.jsonbody.load_json`), so every refusal is a 400 naming ``body`` (or the
duplicated key), and no body deeper than :data:`MAX_JSON_DEPTH` reaches a view.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from rest_framework.parsers import FormParser, JSONParser, MultiPartParser

from breakers.agent.jsonbody import MAX_JSON_DEPTH, load_json
from core.errors import InvalidInput, PayloadTooLarge


class StrictJSONParser(JSONParser):
    """JSON in the declared charset (UTF-8 by default): no duplicate keys, no bare
    ``NaN``/``Infinity``, nested at most :data:`MAX_JSON_DEPTH` levels, within Django's
    ``DATA_UPLOAD_MAX_MEMORY_SIZE``."""

    def parse(self, stream: Any, media_type: Any = None, parser_context: Any = None) -> Any:
        encoding = (parser_context or {}).get("encoding") or settings.DEFAULT_CHARSET
        try:
            "".encode(encoding)  # a text encoding: not bz2_codec, which would inflate the body
        except (LookupError, UnicodeError):
            raise InvalidInput(
                "The body must be JSON in a text encoding (UTF-8).",
                fields={"Content-Type": "charset must be utf-8"},
                code="malformed_json",
            ) from None
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        raw = stream.read() if limit is None else stream.read(limit + 1)
        if limit is not None and len(raw) > limit:
            raise PayloadTooLarge(
                f"The body holds at most {limit} bytes.", fields={"body": f"at most {limit} bytes"}
            )
        try:
            text = raw.decode(encoding)
        except UnicodeDecodeError as error:
            raise InvalidInput(
                f"The body is not valid {encoding} ({error.reason} at byte {error.start}).",
                fields={"body": f"must be {encoding}"},
                code="malformed_json",
            ) from None
        return load_json(text, strict_constants=True, max_depth=MAX_JSON_DEPTH)


# The parsers of every person-facing view: DRF's defaults, with the strict JSON parser.
PERSON_PARSERS = [StrictJSONParser, FormParser, MultiPartParser]
