"""The translate endpoint reads its body itself (``bodies.parsed``): every body gets the status, kind and
message that FastAPI's own check of a ``list[TranslateItem]`` parameter gives it, through the server's
error handlers."""

import pytest

pytest.importorskip("fastapi", reason="attnkit serve needs FastAPI: pip install 'attnkit[serve]'")
pytest.importorskip("httpx", reason="FastAPI's test client needs httpx: pip install 'attnkit[test]'")
from fastapi import FastAPI
from fastapi.testclient import TestClient

from attnkit.serve.bodies import TranslateItem, TranslateItems, parsed
from attnkit.serve.errors import RequestError, handle_errors
from attnkit.serve.metrics import Metrics

BODIES = [
    b'[{"src": "ein Hund"}, {"src": "zwei", "beam_size": 4, "n_best": 2, "id": 7}]',
    b"[]",
    b'[{"src": 5}]',  # not a string
    b'[{"src": "a"}, {"beam_size": 4}]',  # the second lacks its src
    b'[{"src": "a", "n_best": 0}]',  # out of range
    b'[{"src": "a", "beam_size": 65}]',
    b'{"src": "a"}',  # not a list
    b'[{"src": "\\ud800"}]',  # a lone surrogate: JSON, but not text
    b'[{"src": "a"',  # cut short
    '[{"src": "é"}]'.encode("latin-1"),  # not UTF-8
    b"[" * 50_000 + b"]" * 50_000,  # deeper than Python's recursion limit
]


def _fastapis_answer(body: bytes) -> tuple[int, dict | list]:
    """What FastAPI's own check of a ``list[TranslateItem]`` parameter answers ``body`` with."""
    app = FastAPI()
    handle_errors(app, Metrics())

    @app.post("/check")
    async def check(items: list[TranslateItem]) -> list[dict]:
        return [item.model_dump() for item in items]

    answer = TestClient(app).post("/check", content=body, headers={"content-type": "application/json"})
    return answer.status_code, answer.json()


@pytest.mark.parametrize("body", BODIES, ids=range(len(BODIES)))
def test_a_body_read_by_the_endpoint_gets_fastapis_own_answer(body):
    status, expected = _fastapis_answer(body)
    try:
        items = parsed(body, TranslateItems)
    except RequestError as error:
        assert (error.status, error.kind, str(error)) == (status, expected["kind"], expected["error"])
        return
    assert status == 200 and [item.model_dump() for item in items] == expected


def test_what_is_not_json_in_utf8_is_a_400_and_a_wrong_field_is_named():
    with pytest.raises(RequestError) as latin:
        parsed('[{"src": "é"}]'.encode("latin-1"), TranslateItems)
    assert latin.value.status == 400 and latin.value.kind == "malformed_json"
    with pytest.raises(RequestError) as surrogate:
        parsed(b'[{"src": "\\ud800"}]', TranslateItems)
    assert surrogate.value.status == 422 and str(surrogate.value).startswith("0.src: ")
    assert "surrogate" in str(surrogate.value)
