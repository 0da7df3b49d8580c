"""Every route of the server leads to a handler a reader (a profiler, a stack trace) can find by name: a
module-level function of serve/endpoints/, on the router of its dialect; a served model names the
dialects it answers, and the app serves those and no others."""

import asyncio
import importlib

import pytest

pytest.importorskip("fastapi", reason="attnkit serve needs FastAPI: pip install 'attnkit[serve]'")
from fastapi.routing import APIRoute

from attnkit.decode.search import Translation
from attnkit.serve.app import make_app
from attnkit.serve.captioner import ServedCaptioner
from attnkit.serve.ctranslate2 import EngineDecoder, EngineTranslator
from attnkit.serve.decoder import ServedDecoder
from attnkit.serve.endpoints import EVERY_SERVER, ROUTERS
from attnkit.serve.predictor import ServedPredictor
from attnkit.serve.state import ServeSettings
from attnkit.serve.translator import ServedTranslator

EVERY = {"/health", "/info", "/metrics", "/explore"}
SERVED = [
    (ServedTranslator, EVERY | {"/translator/translate"}),
    (EngineTranslator, EVERY | {"/translator/translate"}),
    (ServedPredictor, EVERY | {"/predict"}),
    (ServedCaptioner, EVERY | {"/predict"}),  # POST /predict and /explore take image uploads
    (ServedDecoder, EVERY | {"/generate", "/generate_stream", "/v1/completions"}),
    (EngineDecoder, EVERY | {"/generate", "/generate_stream", "/v1/completions"}),
]


def _handlers(served):
    """(path, handler) of each endpoint the app of ``served`` answers, found by walking its routers."""
    routers = [*EVERY_SERVER, *(ROUTERS[dialect] for dialect in served.dialects)]
    return [(route.path, route.endpoint) for router in routers for route in router.routes]


@pytest.mark.parametrize(("served", "paths"), SERVED, ids=[served.__name__ for served, _ in SERVED])
def test_each_served_model_gets_its_dialects_endpoints_and_no_others(served, paths):
    app = make_app(served, load=lambda: None, settings=ServeSettings())  # nothing loads before it serves
    assert {path for path, _ in _handlers(served)} == paths
    schema = app.openapi()["paths"]  # what FastAPI routes, as it describes it
    assert set(schema) == paths


@pytest.mark.parametrize("served", [served for served, _ in SERVED], ids=[s.__name__ for s, _ in SERVED])
def test_every_route_leads_to_a_module_level_handler_in_the_endpoints_package(served):
    for path, handler in _handlers(served):
        module = importlib.import_module(handler.__module__)
        assert module.__name__.startswith("attnkit.serve.endpoints."), (path, module.__name__)
        assert "<locals>" not in handler.__qualname__, (path, handler.__qualname__)
        assert getattr(module, handler.__name__) is handler, path  # found by its name in its module


def test_every_router_holds_api_routes_only():
    for router in [*EVERY_SERVER, *ROUTERS.values()]:
        assert router.routes and all(isinstance(route, APIRoute) for route in router.routes)


def test_the_translate_endpoint_describes_the_body_it_reads_itself():
    # OpenNMT-py's format: a list of {"src", "id", ...}, with attnkit's beam_size and n_best beside them
    app = make_app(ServedTranslator, load=lambda: None, settings=ServeSettings())
    post = app.openapi()["paths"]["/translator/translate"]["post"]
    body = post["requestBody"]["content"]["application/json"]["schema"]
    assert post["requestBody"]["required"] and body["type"] == "array"
    assert set(body["items"]["properties"]) == {"src", "id", "beam_size", "n_best"}
    assert body["items"]["required"] == ["src"]


class _Translator:
    """What the translate endpoint asks of a served translator, answering at once."""

    beam_size, max_source_tokens = 4, 100

    def tokens(self, texts):
        return [len(text.split()) + 1 for text in texts]

    def positions(self, tokens, settings):
        return sum(tokens) * settings.beam


class _Batcher:
    def waiting(self):
        return 0

    def submit(self, inputs, settings, tokens, positions):
        future = asyncio.get_running_loop().create_future()
        # each output its source in capitals, with as many tokens as words (as the engine counts them)
        found = [[Translation(text.upper(), -1.0, len(text.split()))] * settings.n_best for text in inputs]
        future.set_result(found)
        return future


def _serving_app(served):
    app = make_app(served, load=lambda: None, settings=ServeSettings())
    app.state.server.model, app.state.server.batcher = _Translator(), _Batcher()
    return app


def test_the_translate_endpoint_is_called_past_fastapis_routing_with_every_refusal_counted(monkeypatch):
    from fastapi.testclient import TestClient

    async def not_routed(self, scope, receive, send):
        raise AssertionError(f"{scope['path']} went through FastAPI's routing")

    monkeypatch.setattr(APIRoute, "handle", not_routed)
    app = _serving_app(ServedTranslator)
    client = TestClient(app, raise_server_exceptions=False)
    answer = client.post("/translator/translate", json=[{"src": "a dog", "n_best": 2}])
    assert answer.status_code == 200
    assert answer.json() == [[{"src": "a dog", "tgt": "A DOG", "pred_score": -1.0, "n_best": 2}] * 2]
    assert client.get("/health").status_code == 500  # the patch bites where FastAPI routes
    for _ in range(2):
        bad = client.post("/translator/translate", content=b"[{")
        assert bad.status_code == 400 and bad.json()["kind"] == "malformed_json"
    app.state.server.model.tokens = lambda texts: 1 / 0  # a bug: the 500 every bug gets
    failed = client.post("/translator/translate", json=[{"src": "a dog"}])
    assert failed.status_code == 500 and failed.json()["kind"] == "internal_error"
    counted = app.state.server.metrics.registry.get_sample_value  # what /metrics says
    assert counted("attnkit_errors_total", {"kind": "malformed_json"}) == 2
    assert counted("attnkit_requests_total", {"endpoint": "/translator/translate", "status": "400"}) == 2
    assert counted("attnkit_requests_total", {"endpoint": "/translator/translate", "status": "200"}) == 1


def test_a_server_that_does_not_translate_takes_no_translate_requests_past_its_routing():
    from fastapi.testclient import TestClient

    client = TestClient(_serving_app(ServedDecoder))
    answer = client.post("/translator/translate", json=[{"src": "a dog"}])
    assert answer.status_code == 404 and answer.json()["kind"] == "not_found"


def test_the_metrics_count_the_tokens_the_engine_generated_for_every_output_returned():
    from fastapi.testclient import TestClient

    app = _serving_app(ServedTranslator)
    client = TestClient(app)
    for source in ["a dog", "two black cats"]:
        assert client.post("/translator/translate", json=[{"src": source, "n_best": 2}]).status_code == 200
    # each of the n_best outputs its words, as the engine counted them: 2 × 2 + 2 × 3
    assert app.state.server.metrics.registry.get_sample_value("attnkit_output_tokens_total") == 10.0
